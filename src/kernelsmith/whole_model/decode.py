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

Layout: timing a step (CUDA graphs, in-context timers) is in :mod:`~kernelsmith.whole_model._decode_graphs`,
the built-in Llama with its KV cache, greedy generation and the step's bytes in
:mod:`~kernelsmith.whole_model._decode_llama`; this module holds the report and the run, and every
public name is importable from here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from kernelsmith.whole_model._decode_graphs import CudaGraphStep as CudaGraphStep
from kernelsmith.whole_model._decode_graphs import Timer as Timer
from kernelsmith.whole_model._decode_graphs import cuda_graph
from kernelsmith.whole_model._decode_graphs import graph_capture_is_planned as graph_capture_is_planned
from kernelsmith.whole_model._decode_graphs import graph_capture_planned as graph_capture_planned
from kernelsmith.whole_model._decode_graphs import in_context_timer as in_context_timer
from kernelsmith.whole_model._decode_graphs import inductor_uses_cuda_graphs as inductor_uses_cuda_graphs
from kernelsmith.whole_model._decode_graphs import time_calls as time_calls
from kernelsmith.whole_model._decode_graphs import time_replayed as time_replayed
from kernelsmith.whole_model._decode_llama import Comparison as Comparison
from kernelsmith.whole_model._decode_llama import (
    Generation,
    KVCacheLlama,
    _sync,
    check_cache_room,
    compare_tokens,
    greedy,
    hf_static_cache_bytes,
    weight_bytes,
)
from kernelsmith.whole_model._decode_llama import tie_tolerance as tie_tolerance

log = logging.getLogger(__name__)

VARIANTS = ("eager", "torch.compile", "kernelsmith")
CPU_NOTE = "on the CPU (Triton interpreter): these timings are a test that the code runs, not performance"


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
            with torch.no_grad():  # a decode step is inference: on CUDA it compiles and is captured here
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
