"""Token generation, measured: greedy decoding for eager, torch.compile and kernelsmith in one run.

Decoding (one new token per sequence a step) is where a model is furthest from what the GPU can
do: a step reads every weight once and the KV cache once, for a few flops per byte, so its
ceiling is memory bandwidth and its enemies are launch gaps and kernels that leave
multiprocessors idle. This module measures a model there and checks that kernelsmith's step
produces the tokens the original produces. Three parts, read in order:

**Timing a step the way it runs.** A decode step runs as a replayed CUDA graph (Hugging Face's
``generate`` with a static cache under ``torch.compile(mode="reduce-overhead")``, or
:func:`cuda_graph` here): the host's launch cost vanishes and what counts is the GPU's time,
kernel boundaries included. The backend's in-context comparison (is the graph with kernelsmith's
replacements faster than Inductor alone?) must time it the same way, or a replacement that wins
on the GPU loses by the custom op's few microseconds of Python per call; :func:`in_context_timer`
picks the timer, :func:`time_replayed` captures each candidate into a CUDA graph and times
replays with CUDA events.

**A graph wrapper.** :func:`cuda_graph` (``kernelsmith.cuda_graph``) captures a whole step,
compiled graphs and the Python glue between them, once, on static copies of its example inputs;
a call copies its arguments into those buffers and replays. Compared with
``mode="reduce-overhead"`` it captures across graph breaks, makes no copies of inputs it is
handed in place (pass the static buffers themselves), and tells the kernelsmith backend, which
compiles during the warm-up, that the step will be replayed.

**Generation and verification.** :func:`verify_decode` runs greedy generation of ``new_tokens``
after a prompt for each variant (``eager``, ``torch.compile`` in reduce-overhead mode,
``kernelsmith``), reports tokens per second and the percentage of the device's copy bandwidth a
step reaches (bytes per step = the weights a step reads plus the whole static KV cache, which a
static cache's attention reads every step; the copy bandwidth measured in the same run), and
compares every variant's tokens with eager's. Where they part, the first differing token is
accepted only as a tie: eager's own logits for the two tokens within :func:`tie_tolerance` (bf16
rounding of nearly equal logits); after that the sequences are different texts and are not
compared. Two kinds of model:

- the built-in Llama (:mod:`kernelsmith.models.llama`), run through :class:`KVCacheLlama`: the
  same modules with a static KV cache per layer, written with ``index_copy_`` at the step's
  positions (a device tensor: nothing in a step reads a value on the host, so it captures);
- a Hugging Face causal LM (``LlamaForCausalLM`` built from a config), through its own
  ``generate()`` with ``cache_implementation="static"`` and a ``CompileConfig``.

Bad input. A prompt plus new tokens past the cache's end is refused before anything runs (every
variant would index past the cache); sequences of different lengths are left-padded with a
padding mask, which every variant receives; a projection kernelsmith does not serve (another
layout, a non-contiguous input, more than 64 rows) stays the original code. Timings on a CPU
(the Triton interpreter) are a test that the code runs, not performance, and the report says so.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)

VARIANTS = ("eager", "torch.compile", "kernelsmith")
CPU_NOTE = "on the CPU (Triton interpreter): these timings are a test that the code runs, not performance"


# =================================================================================================
# Timing a step as a replayed CUDA graph
# =================================================================================================

_PLANNED = threading.local()


@contextlib.contextmanager
def graph_capture_planned() -> Iterator[None]:
    """Within this block, code being compiled will run as a replayed CUDA graph (the warm-up of
    :func:`cuda_graph` compiles in it), so in-context comparisons time graphs as replays."""
    before = getattr(_PLANNED, "depth", 0)
    _PLANNED.depth = before + 1
    try:
        yield
    finally:
        _PLANNED.depth = before


def graph_capture_is_planned() -> bool:
    return getattr(_PLANNED, "depth", 0) > 0


def inductor_uses_cuda_graphs(mode: str | None, inductor_options: dict[str, Any]) -> bool:
    """Whether Inductor, with this mode and these config patches, wraps its graphs in CUDA graphs
    (``mode="reduce-overhead"``, ``"max-autotune"``, or ``triton.cudagraphs`` set)."""
    patches: dict[str, Any] = {}
    if mode:
        from torch._inductor import list_mode_options

        patches.update(list_mode_options(mode))
    patches.update(inductor_options)
    return bool(patches.get("triton.cudagraphs"))


Timer = Callable[[Sequence[Callable[..., Any]], Sequence[Any]], list[float]]


def in_context_timer(timing: str, mode: str | None, inductor_options: dict[str, Any]) -> Timer:
    """The timer of the backend's in-context comparison.

    ``"calls"``: call by call (:func:`kernelsmith.frontends.backend.time_graphs`). ``"graph"``: each
    graph captured and replayed (:func:`time_replayed`). ``"auto"``: the way the step will run:
    replays when it is compiled for :func:`cuda_graph`; calls when Inductor makes its own CUDA
    graphs (calling such a compiled graph *is* a replay, and it cannot be captured again) or when
    nothing says the step will be captured (then the host's launch cost is real and counts).
    """
    from kernelsmith.frontends.backend import time_graphs

    if timing not in ("auto", "graph", "calls"):
        raise ValueError(f"timing must be auto, graph or calls, not {timing!r}")
    if timing == "calls" or inductor_uses_cuda_graphs(mode, inductor_options):
        return time_graphs
    if timing == "graph" or graph_capture_is_planned():
        return time_replayed
    return time_graphs


def _cuda_device(inputs: Sequence[Any]) -> torch.device | None:
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.device.type == "cuda":
            return t.device
    return None


def _capture(fn: Callable[[], Any], device: torch.device, warmup: int = 2) -> tuple[torch.cuda.CUDAGraph, Any]:
    """``fn`` captured into a CUDA graph after ``warmup`` calls on a side stream (lazy compiles,
    autotuning and allocator growth happen there, not in the capture). Returns the graph and the
    captured call's outputs, which every replay overwrites."""
    current = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    current.wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn()
    return graph, outputs


def time_replayed(
    candidates: Sequence[Callable[..., Any]], inputs: Sequence[Any], rounds: int = 7, replays: int = 3
) -> list[float]:
    """Median milliseconds per replay of each candidate captured as a CUDA graph on ``inputs``,
    timed interleaved (A B A B ...) with CUDA events. Falls back to call-by-call timing
    (:func:`~kernelsmith.frontends.backend.time_graphs`) without CUDA tensors or when a candidate
    cannot be captured (the log says why)."""
    from kernelsmith.frontends.backend import _call, time_graphs

    device = _cuda_device(inputs)
    if device is None or torch.cuda.is_current_stream_capturing():
        return time_graphs(candidates, inputs, rounds, replays)
    graphs = []
    try:
        with torch.no_grad():
            for fn in candidates:
                graphs.append(_capture(functools.partial(_call, fn, inputs), device)[0])
    except Exception as exc:  # a graph that cannot be captured is timed as it is called
        log.warning("in context: a candidate cannot be captured as a CUDA graph (%s: %s); timing calls",
                    type(exc).__name__, exc)  # fmt: skip
        return time_graphs(candidates, inputs, rounds, replays)
    samples: list[list[float]] = [[] for _ in graphs]
    for _ in range(rounds):
        for i, graph in enumerate(graphs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(replays):
                graph.replay()
            end.record()
            end.synchronize()
            samples[i].append(start.elapsed_time(end) / replays)
    return [sorted(s)[len(s) // 2] for s in samples]


def time_calls(fn: Callable[[], Any], device: torch.device, rounds: int = 10, calls: int = 5) -> dict[str, float]:
    """Milliseconds per call of ``fn`` (a step, or a graph's replay): the median, 10th and 90th
    percentile over ``rounds`` rounds of ``calls`` calls, after two warm-up calls; CUDA events on
    a GPU, the host clock elsewhere."""
    for _ in range(2):
        fn()
    samples = []
    for _ in range(rounds):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / calls)
        else:
            begin = time.perf_counter()
            for _ in range(calls):
                fn()
            samples.append((time.perf_counter() - begin) * 1000.0 / calls)
    samples.sort()
    pick = lambda q: samples[min(len(samples) - 1, int(q * len(samples)))]
    return {"median_ms": pick(0.5), "p10_ms": pick(0.1), "p90_ms": pick(0.9)}


# =================================================================================================
# kernelsmith.cuda_graph
# =================================================================================================


class CudaGraphStep:
    """A step captured once and replayed; see :func:`cuda_graph`.

    ``static_inputs`` are the buffers the graph reads (write into them directly to skip the copy
    a call makes), ``outputs`` what the captured call returned, overwritten by every replay. On a
    device without CUDA graphs (the CPU) a call runs the step directly on the static buffers.
    """

    def __init__(self, fn: Callable[..., Any], example_inputs: Sequence[Any], warmup: int = 2) -> None:
        self.fn = fn
        self.static_inputs = tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in example_inputs)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: Any = None
        device = _cuda_device(self.static_inputs)
        if device is not None:
            with graph_capture_planned():  # torch.compile compiles during the warm-up: for replays
                self.graph, self.outputs = _capture(lambda: fn(*self.static_inputs), device, warmup)

    def __call__(self, *inputs: Any) -> Any:
        if len(inputs) != len(self.static_inputs):
            raise TypeError(f"the captured step takes {len(self.static_inputs)} inputs, not {len(inputs)}")
        for i, (buffer, given) in enumerate(zip(self.static_inputs, inputs, strict=True)):
            if not isinstance(buffer, torch.Tensor):
                if given != buffer:
                    raise ValueError(f"input {i} is {given!r}; the step was captured with {buffer!r}")
                continue
            if not isinstance(given, torch.Tensor) or given.shape != buffer.shape or given.dtype != buffer.dtype:
                raise ValueError(f"input {i} must be a {buffer.dtype} tensor of shape {tuple(buffer.shape)}: a CUDA "
                                 "graph replays fixed shapes (capture another step for another shape)")  # fmt: skip
            if given is not buffer:
                buffer.copy_(given)
        return self.replay()

    def replay(self) -> Any:
        """Run the step on what the static buffers hold now."""
        if self.graph is None:
            return self.fn(*self.static_inputs)
        self.graph.replay()
        return self.outputs


def cuda_graph(step_fn: Callable[..., Any], example_inputs: Sequence[Any], warmup: int = 2) -> CudaGraphStep:
    """``step_fn`` captured as one CUDA graph on static copies of ``example_inputs``.

    >>> step = kernelsmith.cuda_graph(torch.compile(decoder, backend="kernelsmith"), (ids, pos))  # doctest: +SKIP
    >>> logits = step(next_ids, next_pos)     # copies into the static buffers, replays  # doctest: +SKIP

    The warm-up runs ``step_fn`` ``warmup`` times on the copies (torch.compile compiles then, and
    the kernelsmith backend times its in-context choices as replays), then one call is captured.
    A step that writes state (a KV cache) writes it on those calls too. The step must not read
    values on the host (``.item()``, data-dependent Python control flow): capture forbids it, and
    the error says where. Inputs of another shape need another capture.
    """
    return CudaGraphStep(step_fn, example_inputs, warmup)


# =================================================================================================
# The built-in Llama with a static KV cache
# =================================================================================================


class KVCacheLlama(nn.Module):
    """:class:`kernelsmith.models.llama.Llama`'s modules with a static KV cache: incremental decoding.

    ``forward(ids, positions, valid)``: ``ids`` ``(B, S)`` the new tokens, ``positions`` ``(S,)``
    int64 their cache positions (the prompt's ``0..P-1``, then one position a step), ``valid``
    ``(B, cache_len)`` bool, the positions that hold a real token of each sequence (False on a
    left-padded prompt's padding). Returns the logits ``(B, S, vocab)``. Each layer writes the
    new keys and values into its cache at ``positions`` and attends over the whole cache,
    masked to the positions at or before the query's that are valid (a position always sees
    itself, so a padding row is finite, and never read). The projections and norms are the
    model's own modules, so the backend sees the graph a user's decoder gives it.
    """

    def __init__(self, model: nn.Module, batch: int, cache_len: int) -> None:
        super().__init__()
        config: Any = model.config
        self.model = model
        self.cache_len = cache_len
        self.head_dim = config.hidden // config.n_heads
        parameter = next(model.parameters())
        shape = (batch, config.n_kv_heads, cache_len, self.head_dim)
        self.caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        for i in range(config.n_layers):
            k = torch.zeros(shape, dtype=parameter.dtype, device=parameter.device)
            v = torch.zeros_like(k)
            self.register_buffer(f"k_cache_{i}", k, persistent=False)
            self.register_buffer(f"v_cache_{i}", v, persistent=False)
            for t in (k, v):  # what Hugging Face's StaticCache does: reduce-overhead keeps them in place
                torch._dynamo.mark_static_address(t)
            self.caches.append((k, v))

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        from kernelsmith.models.llama import apply_rotary_pos_emb, repeat_kv

        model: Any = self.model
        b, s = ids.shape
        x = model.embed_tokens(ids)
        cos, sin = model.rotary_emb(x, positions[None, :].expand(b, s))
        keys = torch.arange(self.cache_len, device=ids.device)
        visible = (keys[None, :] <= positions[:, None])[None, None] & valid[:, None, None, :]
        mask = visible | (keys[None, :] == positions[:, None])[None, None]  # (B, 1, S, cache_len)
        for layer, (k_cache, v_cache) in zip(model.layers, self.caches, strict=True):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(b, s, -1, self.head_dim).transpose(1, 2)
            k = attn.k_proj(h).view(b, s, -1, self.head_dim).transpose(1, 2)
            v = attn.v_proj(h).view(b, s, -1, self.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            k_cache.index_copy_(2, positions, k)
            v_cache.index_copy_(2, positions, v)
            y = F.scaled_dot_product_attention(
                q, repeat_kv(k_cache, attn.n_rep), repeat_kv(v_cache, attn.n_rep), attn_mask=mask
            )
            x = x + attn.o_proj(y.transpose(1, 2).reshape(b, s, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return model.lm_head(model.norm(x))  # type: ignore[no-any-return]

    def cache_bytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.caches)


# =================================================================================================
# Generation
# =================================================================================================


@dataclass
class Generation:
    """One greedy generation: ``tokens`` ``(B, N)``, each step's two best logits and their tokens
    ``(N, B, 2)`` (for the tie check; None on a timed run), and the decode steps' wall time."""

    tokens: torch.Tensor
    top_values: torch.Tensor | None
    top_tokens: torch.Tensor | None
    seconds: float
    steps: int


def check_cache_room(prompt_len: int, new_tokens: int, cache_len: int) -> None:
    """ValueError unless the prompt and the new tokens fit in the cache: the last token generated
    is never fed back, so ``prompt_len + new_tokens - 1`` positions are written."""
    if prompt_len < 1 or new_tokens < 1:
        raise ValueError(f"a prompt of at least one token and at least one new token (got {prompt_len}, {new_tokens})")
    needed = prompt_len + new_tokens - 1
    if needed > cache_len:
        raise ValueError(f"a prompt of {prompt_len} tokens and {new_tokens} new ones write {needed} cache positions; "
                         f"the cache holds {cache_len}: nothing was run")  # fmt: skip


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def greedy(
    prefill: Callable[..., torch.Tensor],
    step: Callable[..., torch.Tensor],
    prompt: torch.Tensor,
    valid: torch.Tensor,
    new_tokens: int,
    cache_len: int,
    keep_logits: bool,
) -> Generation:
    """Greedy generation with a :class:`KVCacheLlama`-shaped step: ``prefill(prompt, positions,
    valid)`` once, then ``step(ids, position, valid)`` for each new token but the last. The
    position lives on the device and is advanced there, and the next token is picked there, so
    the loop never waits for the GPU until it ends."""
    prompt_len = prompt.shape[1]
    check_cache_room(prompt_len, new_tokens, cache_len)
    device = prompt.device
    with torch.no_grad():
        logits = prefill(prompt, torch.arange(prompt_len, device=device), valid)[:, -1]
        position = torch.full((1,), prompt_len, dtype=torch.int64, device=device)
        tokens, tops = [], []
        _sync(device)
        start = time.perf_counter()
        for t in range(new_tokens):
            if keep_logits:
                tops.append(torch.topk(logits.float(), 2, dim=-1))
            token = logits.argmax(-1)
            tokens.append(token)
            if t == new_tokens - 1:
                break
            logits = step(token[:, None], position, valid)[:, -1]
            position += 1
        _sync(device)
        seconds = time.perf_counter() - start
    result = torch.stack(tokens, dim=1).cpu()
    if not keep_logits:
        return Generation(result, None, None, seconds, new_tokens - 1)
    values = torch.stack([v for v, _ in tops]).cpu()
    indices = torch.stack([i for _, i in tops]).cpu()
    return Generation(result, values, indices, seconds, new_tokens - 1)


def tie_tolerance(dtype: torch.dtype, logit: float) -> float:
    """How close eager's two best logits must be for a different greedy pick to count as a tie:
    a few units of the last place of a 16-bit logit after a stack of layers (2% of its size, at
    least 0.02), 1e-3 relative in float32."""
    scale = max(1.0, abs(logit))
    return (1e-3 if dtype == torch.float32 else 2e-2) * scale


@dataclass
class Comparison:
    """A variant's tokens against eager's: the same, or where they first part and whether that is a tie."""

    same: bool
    ok: bool
    first_difference: dict[str, Any] | None = None


def compare_tokens(eager: Generation, other: torch.Tensor, dtype: torch.dtype) -> Comparison:
    """``other`` ``(B, N)`` against eager's tokens: equal, or each sequence's first differing
    token a tie in eager's logits (its second-best pick, within :func:`tie_tolerance`)."""
    if torch.equal(eager.tokens, other):
        return Comparison(True, True)
    assert eager.top_values is not None and eager.top_tokens is not None
    differs = eager.tokens != other
    first: dict[str, Any] | None = None
    ok = True
    for b in range(eager.tokens.shape[0]):
        steps = differs[b].nonzero()
        if steps.numel() == 0:
            continue
        t = int(steps[0])
        best, second = (float(v) for v in eager.top_values[t, b])
        tie = int(other[b, t]) == int(eager.top_tokens[t, b, 1]) and best - second <= tie_tolerance(dtype, best)
        ok = ok and tie
        if first is None or not tie:
            first = {"sequence": b, "step": t, "eager": int(eager.tokens[b, t]), "got": int(other[b, t]),
                     "eager_gap": best - second, "tie": tie}  # fmt: skip
    return Comparison(False, ok, first)


# =================================================================================================
# Bytes a step reads
# =================================================================================================


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the parameters a decode step reads: every parameter once (a tied LM head and
    embedding once), less the embedding table when it is not also the LM head (a step reads only
    its rows)."""
    seen: dict[int, int] = {}
    for p in model.parameters():
        seen.setdefault(p.data_ptr(), p.nbytes)
    total = sum(seen.values())
    embedding = _embedding_weight(model)
    head = getattr(getattr(model, "lm_head", None), "weight", None)
    if embedding is not None and (head is None or head.data_ptr() != embedding.data_ptr()):
        total -= embedding.nbytes
    return total


def _embedding_weight(model: nn.Module) -> torch.Tensor | None:
    getter = getattr(model, "get_input_embeddings", None)
    module = getter() if callable(getter) else getattr(model, "embed_tokens", None)
    weight = getattr(module, "weight", None)
    return weight if isinstance(weight, torch.Tensor) else None


def hf_static_cache_bytes(config: Any, batch: int, cache_len: int, dtype: torch.dtype) -> int:
    """Bytes of a Hugging Face static cache for ``config``: keys and values of every layer."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * batch * heads * cache_len * head_dim * itemsize


# =================================================================================================
# The report
# =================================================================================================


@dataclass
class VariantRow:
    name: str
    tokens_per_s: float | None = None
    ms_per_step: float | None = None
    gbps: float | None = None
    pct_of_copy: float | None = None
    same_tokens: bool | None = None
    tokens_ok: bool | None = None
    first_difference: dict[str, Any] | None = None
    error: str | None = None


@dataclass
class DecodeReport:
    """What :func:`verify_decode` measured; ``ok`` when every variant that ran gave eager's
    tokens (or a tie) and none failed."""

    model: str
    kind: str  # "builtin" (KVCacheLlama) or "hf" (generate)
    device: str
    dtype: str
    batch: int
    prompt: int
    new_tokens: int
    cache_len: int
    weight_bytes: int
    cache_bytes: int
    copy_gbps: float | None
    rows: list[VariantRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def bytes_per_step(self) -> int:
        return self.weight_bytes + self.cache_bytes

    @property
    def ok(self) -> bool:
        return all(r.error is None and r.tokens_ok is not False for r in self.rows)

    def add_timing(self, row: VariantRow, seconds: float, steps: int) -> None:
        """Tokens per second, milliseconds and copy-bandwidth share of a step from a timed run."""
        if steps <= 0 or seconds <= 0:
            return
        row.ms_per_step = 1000.0 * seconds / steps
        row.tokens_per_s = self.batch * steps / seconds
        row.gbps = self.bytes_per_step / (seconds / steps) / 1e9
        if self.copy_gbps:
            row.pct_of_copy = 100.0 * row.gbps / self.copy_gbps

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(bytes_per_step=self.bytes_per_step, ok=self.ok)
        return data


def copy_bandwidth(device: torch.device) -> float | None:
    """The device-to-device copy bandwidth in GB/s (read plus write), measured now; None off CUDA."""
    if device.type != "cuda":
        return None
    from kernelsmith.evaluate.timing import measure_copy_bandwidth

    return measure_copy_bandwidth(device)[0]


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


# =================================================================================================
# Variants and the run
# =================================================================================================


def kernelsmith_backend(db: Any = None, tune: bool = False, budget: int = 20, **options: Any) -> Any:
    """The kernelsmith backend for a decode step: decode projections matched (``decode=True``)."""
    from kernelsmith.frontends.backend import KernelsmithBackend

    return KernelsmithBackend(db=db, tune=tune, budget=budget, decode=True, **options)


def is_hf_model(model: nn.Module) -> bool:
    return callable(getattr(model, "generate", None)) and hasattr(getattr(model, "config", None), "num_hidden_layers")


def is_builtin_llama(model: nn.Module) -> bool:
    from kernelsmith.models.llama import Llama

    return isinstance(model, Llama)


def prompt_batch(vocab_size: int, batch: int, prompt_len: int, device: torch.device, seed: int = 0,
                 ragged: bool = False) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Random prompts ``(B, P)`` and their padding mask ``(B, P)`` (1 = a token). ``ragged``: the
    odd sequences are shorter by a quarter of the prompt, left-padded (token 0, mask 0), as
    Hugging Face pads a batch for generation."""
    from kernelsmith.models._common import token_ids

    ids = token_ids(vocab_size, batch, prompt_len, device, seed)
    mask = torch.ones_like(ids)
    if ragged:
        pad = max(1, prompt_len // 4)
        if pad >= prompt_len:
            raise ValueError(f"a ragged batch needs a prompt longer than {pad} tokens")
        ids[1::2, :pad] = 0
        mask[1::2, :pad] = 0
    return ids, mask


def _builtin_runs(
    model: nn.Module, prompt: torch.Tensor, mask: torch.Tensor, new_tokens: int, variants: Sequence[str],
    backend: Any, report: DecodeReport,
) -> None:  # fmt: skip
    """Each variant of the built-in Llama's decode step: generated once for the tokens (the
    compile and the capture happen there) and once timed."""
    batch, prompt_len = prompt.shape
    decoder = KVCacheLlama(model, batch, report.cache_len).eval()
    valid = torch.ones(batch, report.cache_len, dtype=torch.bool, device=prompt.device)
    valid[:, :prompt_len] = mask.bool()
    report.cache_bytes = decoder.cache_bytes()
    eager: Generation | None = None
    for name in variants:
        row = VariantRow(name)
        report.rows.append(row)
        try:
            torch._dynamo.reset()
            step = _builtin_step(name, decoder, prompt, valid, backend)
            first = greedy(decoder, step, prompt, valid, new_tokens, report.cache_len, keep_logits=name == "eager")
            if eager is None:
                if name != "eager":
                    raise ValueError("the eager variant runs first: the others are compared with it")
                eager = first
            _judge(row, eager, first.tokens, model)
            timed = greedy(decoder, step, prompt, valid, new_tokens, report.cache_len, keep_logits=False)
            report.add_timing(row, timed.seconds, timed.steps)
        except Exception as exc:  # a variant that fails is reported; the others still run
            log.warning("decode variant %s failed", name, exc_info=True)
            row.error = _error(exc)
            if name == "eager":
                return


def _builtin_step(name: str, decoder: KVCacheLlama, prompt: torch.Tensor, valid: torch.Tensor,
                  backend: Any) -> Callable[..., torch.Tensor]:  # fmt: skip
    if name == "eager":
        return decoder
    if name == "torch.compile":
        return torch.compile(decoder, mode="reduce-overhead", fullgraph=True)  # type: ignore[return-value]
    if name == "kernelsmith":
        compiled = torch.compile(decoder, backend=backend, fullgraph=True)
        example = (prompt[:, -1:].clone(), torch.full((1,), prompt.shape[1], device=prompt.device), valid)
        return cuda_graph(compiled, example)
    raise ValueError(f"unknown variant {name!r} (known: {', '.join(VARIANTS)})")


def _judge(row: VariantRow, eager: Generation, tokens: torch.Tensor, model: nn.Module) -> None:
    comparison = compare_tokens(eager, tokens, next(model.parameters()).dtype)
    row.same_tokens, row.tokens_ok, row.first_difference = comparison.same, comparison.ok, comparison.first_difference


def _hf_compile_config(name: str, backend: Any, device: torch.device) -> Any:
    from transformers import CompileConfig

    if name == "torch.compile":
        config = CompileConfig(fullgraph=True, mode="reduce-overhead")
    else:
        config = CompileConfig(fullgraph=True, backend=backend, mode="reduce-overhead")
    if device.type != "cuda":
        config._compile_all_devices = True  # type: ignore[assignment]  # transformers' own switch for compiling off CUDA (tests)
    return config


def hf_generate(model: nn.Module, prompt: torch.Tensor, mask: torch.Tensor, new_tokens: int, name: str,
                backend: Any = None, keep_logits: bool = False) -> tuple[Generation, float]:  # fmt: skip
    """Greedy ``generate()`` with a static cache for variant ``name``; returns the generation and
    its wall time (prefill included: :func:`_hf_runs` subtracts a one-token run)."""
    kwargs: dict[str, Any] = {"cache_implementation": "static", "do_sample": False, "max_new_tokens": new_tokens,
                              "min_new_tokens": new_tokens, "attention_mask": mask, "pad_token_id": 0}  # fmt: skip
    if name == "eager":
        kwargs["disable_compile"] = True
    else:
        kwargs["compile_config"] = _hf_compile_config(name, backend, prompt.device)
    if keep_logits:
        kwargs.update(output_logits=True, return_dict_in_generate=True)
    _sync(prompt.device)
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(prompt, **kwargs)  # type: ignore[operator]
    _sync(prompt.device)
    seconds = time.perf_counter() - start
    sequences = out.sequences if keep_logits else out
    tokens = sequences[:, prompt.shape[1] :].cpu()
    if not keep_logits:
        return Generation(tokens, None, None, seconds, new_tokens - 1), seconds
    tops = [torch.topk(step.float(), 2, dim=-1) for step in out.logits]
    values = torch.stack([v for v, _ in tops]).cpu()
    indices = torch.stack([i for _, i in tops]).cpu()
    return Generation(tokens, values, indices, seconds, new_tokens - 1), seconds


def _hf_runs(model: nn.Module, prompt: torch.Tensor, mask: torch.Tensor, new_tokens: int, variants: Sequence[str],
             backend: Any, report: DecodeReport) -> None:  # fmt: skip
    """Each variant through ``generate()``: once with logits (the compile happens there; tokens
    compared), then timed at ``new_tokens`` and at one token, whose difference is the decode steps."""
    eager: Generation | None = None
    for name in variants:
        row = VariantRow(name)
        report.rows.append(row)
        try:
            torch._dynamo.reset()
            if hasattr(model, "_compiled_call"):
                del model._compiled_call  # a fresh compile for each variant's configuration
            first, _ = hf_generate(model, prompt, mask, new_tokens, name, backend, keep_logits=name == "eager")
            if eager is None:
                if name != "eager":
                    raise ValueError("the eager variant runs first: the others are compared with it")
                eager = first
            _judge(row, eager, first.tokens, model)
            _, whole = hf_generate(model, prompt, mask, new_tokens, name, backend)
            _, one = hf_generate(model, prompt, mask, 1, name, backend)
            report.add_timing(row, max(whole - one, 0.0), new_tokens - 1)
        except Exception as exc:  # a variant that fails is reported; the others still run
            log.warning("decode variant %s failed", name, exc_info=True)
            row.error = _error(exc)
            if name == "eager":
                return


def verify_decode(
    model: nn.Module,
    *,
    name: str = "model",
    batch: int = 1,
    prompt_len: int = 16,
    new_tokens: int = 8,
    cache_len: int | None = None,
    variants: Sequence[str] = VARIANTS,
    backend: Any = None,
    ragged: bool = False,
    seed: int = 0,
) -> DecodeReport:
    """Greedy generation of ``new_tokens`` after a ``prompt_len``-token prompt for each variant,
    timed, with every variant's tokens compared with eager's (module docstring). ``backend`` is
    the kernelsmith variant's torch.compile backend (default :func:`kernelsmith_backend`);
    ``ragged`` left-pads every other prompt; ``cache_len`` defaults to what the generation needs
    (a built-in model's cache; Hugging Face sizes its own static cache the same way)."""
    parameter = next(model.parameters())
    device = parameter.device
    hf = is_hf_model(model)
    if not hf and not is_builtin_llama(model):
        raise ValueError(f"decode verification runs the built-in llama models or a Hugging Face causal LM, not a "
                         f"{type(model).__name__}")  # fmt: skip
    needed = prompt_len + new_tokens - 1
    cache_len = cache_len if cache_len is not None else needed
    check_cache_room(prompt_len, new_tokens, cache_len)
    if hf and cache_len != needed:
        raise ValueError("a Hugging Face static cache is sized by generate() itself: leave cache_len out")
    variants = list(variants)
    if "eager" not in variants:
        variants.insert(0, "eager")
    variants.sort(key=lambda v: v != "eager")
    config: Any = model.config
    hf_cache = hf_static_cache_bytes(config, batch, prompt_len + new_tokens, parameter.dtype) if hf else 0
    report = DecodeReport(name, "hf" if hf else "builtin", str(device), str(parameter.dtype).removeprefix("torch."),
                          batch, prompt_len, new_tokens, cache_len, weight_bytes(model), hf_cache,
                          copy_bandwidth(device))  # fmt: skip
    if device.type != "cuda":
        report.notes.append(CPU_NOTE)
    if hf:
        report.notes.append("Hugging Face: a step's time is (generate(N) - generate(1)) / (N - 1), prefill excluded")
    prompt, mask = prompt_batch(config.vocab_size, batch, prompt_len, device, seed, ragged)
    chosen = backend if backend is not None else kernelsmith_backend()
    model.eval()
    if hf:
        _hf_runs(model, prompt, mask, new_tokens, variants, chosen, report)
    else:
        _builtin_runs(model, prompt, mask, new_tokens, variants, chosen, report)
    sites = getattr(chosen, "sites", None)
    if sites is not None:
        replaced = sum(1 for s in sites if s.status == "replaced")
        report.notes.append(f"kernelsmith: {replaced} of {len(sites)} sites replaced")
    return report


__all__ = [
    "VARIANTS",
    "CudaGraphStep",
    "DecodeReport",
    "KVCacheLlama",
    "compare_tokens",
    "cuda_graph",
    "graph_capture_planned",
    "in_context_timer",
    "time_replayed",
    "verify_decode",
]
