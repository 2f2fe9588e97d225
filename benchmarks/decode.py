"""Decode kernels benchmark: every ``F.linear`` of a Llama-3.2-1B and a Llama-3-8B decode step at
M = 1 and 8 rows, the fused projections and the attention over the KV cache, bf16: the eager
PyTorch code (cuBLAS ``F.linear``; ``F.scaled_dot_product_attention``),
``torch.compile(mode="max-autotune-no-cudagraphs")`` of the same code, and the ``decode_matmul`` /
``decode_attention`` families tuned with ``kernelsmith``'s search, in one process.

    python benchmarks/decode.py --out decode.json [--models 1b,8b] [--m 1,8] [--only qkv,lm_head]
        [--budget 24] [--fused] [--attention] [--cache-len 1024,4096] [--skip max-autotune]

Rows (the weight N x K as nn.Linear stores it):

=========  ======================  ======================
row        Llama-3.2-1B            Llama-3-8B
=========  ======================  ======================
qkv        3072 x 2048             6144 x 4096
o          2048 x 2048             4096 x 4096
gate/up    8192 x 2048 (each)      14336 x 4096 (each)
down       2048 x 8192             4096 x 14336
lm_head    128256 x 2048           128256 x 4096
=========  ======================  ======================

(hidden 2048 / 4096, FFN 8192 / 14336, 32 query heads over 8 KV heads of 64 / 128: q is hidden
wide, k and v a quarter each.) ``--fused`` adds, for each model and M, the fusions a decode layer
allows: gate and up with SwiGLU in one pass (``swiglu``, against ``F.silu(F.linear(x, wg)) *
F.linear(x, wu)``), the residual add in the o and down projections' epilogue (``residual``,
against ``F.linear(x, w) + r``), and with the RMSNorm before them in the prologue: ``norm+qkv+rope``
(Llama's input_layernorm, the fused QKV projection and RoPE on q and k at each row's position) and
``norm+gate/up+swiglu`` (post_attention_layernorm, gate and up, SwiGLU); the eager baseline of a
fused row is the family's reference, Hugging Face's modules in order (``"cublas"`` in the table:
cuBLAS and PyTorch's elementwise kernels). ``--attention`` adds the ``attention`` rows: M sequences
of one new token against a static KV cache of ``--cache-len`` positions (every sequence full: the
bytes model is the whole cache), 32 query heads over 8 KV heads, against SDPA with the mask the
lengths imply and ``enable_gqa`` (``"sdpa"``) and against Hugging Face's own masked path, the KV
heads repeated first (``"sdpa repeat_kv"``; both count as peers).

Every implementation is timed by ``_common.bench`` (``triton.testing.do_bench``: CUDA events, L2
flushed before each call, median): so a weight is read from memory, not L2, as in a real step. GB/s
= the family's bytes (weight or KV cache, x and the output once each) / time; "% copy" divides by the copy
bandwidth ``kernelsmith.evaluate.timing`` measures on the device; "x best peer" = the faster of
cuBLAS and max-autotune over kernelsmith. The issue's targets (M = 1): >= 85% of copy bandwidth on
every projection, and >= 1.2x cuBLAS wherever cuBLAS is below 60%. When the search's decision is
"baseline" (PyTorch wins), the best candidate is timed anyway, as ``best candidate``.

Prints a table and writes JSON (date, GPU, versions, command) after every row. Needs a CUDA GPU;
``--smoke`` runs the same code on the CPU in the Triton interpreter (set ``TRITON_INTERPRET=1``) on
shapes of a few dozen, without max-autotune, timed by the host clock: a test that the script runs,
whose timings are NOT performance.

    TRITON_INTERPRET=1 python benchmarks/decode.py --smoke --only o --m 1 --models 1b --out /tmp/decode-smoke.json
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from _common import (
    add_run_options,
    bench,
    max_abs_diff,
    print_smoke_banner,
    run_rows,
    runner_of,
    settle_run_options,
    start_report,
    synchronize,
    tune,
)

from kernelsmith.evaluate.timing import measure_copy_bandwidth
from kernelsmith.ops import get_op
from kernelsmith.spec import OpSpec

Fn = Callable[..., Any]

# (hidden, FFN, vocabulary, query heads, KV heads, head dim) of each model.
MODELS = {"1b": (2048, 8192, 128256, 32, 8, 64), "8b": (4096, 14336, 128256, 32, 8, 128)}
ROWS = ("qkv", "o", "gate/up", "down", "lm_head")
FUSED_ROWS = ("swiglu", "o+residual", "down+residual", "norm+qkv+rope", "norm+gate/up+swiglu")
ATTENTION_ROWS = ("attention",)
M_VALUES = (1, 8)
CACHE_LENGTHS = (1024,)
TARGET_PCT = 85.0  # of copy bandwidth, every projection at M = 1
TARGET_VS_SLOW_CUBLAS = 1.2  # x cuBLAS where cuBLAS is below SLOW_CUBLAS_PCT
SLOW_CUBLAS_PCT = 60.0


@dataclass(frozen=True)
class Workload:
    """One row. A projection is ``m x n x k`` (x (m, k), the weight (n, k)); attention is ``m``
    sequences of ``heads`` query heads over ``kv_heads``, a cache of ``n`` positions of head dim ``k``."""

    model: str  # 1b or 8b
    row: str  # a name of ROWS, FUSED_ROWS or ATTENTION_ROWS
    m: int
    n: int
    k: int
    epilogue: str = "none"
    prologue: str = "none"
    heads: int = 0  # RoPE's and attention's query heads
    kv_heads: int = 0

    @property
    def family(self) -> str:
        return "decode_attention" if self.row in ATTENTION_ROWS else "decode_matmul"

    @property
    def baseline(self) -> str:
        """The eager implementation's name in the report: cuBLAS (with PyTorch's elementwise
        kernels for a fused row) or SDPA."""
        return "sdpa" if self.family == "decode_attention" else "cublas"

    @property
    def shape_text(self) -> str:
        if self.family == "decode_attention":
            return f"{self.m}x{self.heads}/{self.kv_heads}x{self.n}x{self.k}"
        return f"{self.m}x{self.n}x{self.k}"

    def spec(self) -> OpSpec:
        family = get_op(self.family)
        if self.family == "decode_attention":
            return family.spec((self.m, self.heads, self.n, self.k), "bf16", kv_heads=self.kv_heads)
        fused: dict[str, Any] = {"prologue": self.prologue} if self.prologue != "none" else {}
        if "rope" in self.epilogue:
            fused["rope"] = (self.heads, self.kv_heads)
        return family.spec((self.m, self.n, self.k), "bf16", epilogue=self.epilogue, **fused)

    def tiny(self) -> Workload:
        """The same row at a size the Triton interpreter runs in seconds (--smoke): M kept, the
        other sizes a few dozen (different sizes staying different, none a multiple of a block);
        RoPE on one query and one KV head of 8, attention on 4 heads over 2, of 16, 40 positions."""
        if self.family == "decode_attention":
            return replace(self, n=40, k=16, heads=4, kv_heads=2)
        if "rope" in self.epilogue:
            return replace(self, n=24, k=33, heads=1, kv_heads=1)
        return replace(self, n=24 if self.n <= 4096 else 40, k=33 if self.k <= 4096 else 72)


def workloads(
    models: list[str], ms: list[int], fused: bool, attention: bool = False,
    cache_lengths: Sequence[int] = CACHE_LENGTHS,
) -> list[Workload]:
    """Every projection of each model at each M, then the fused rows and the attention rows if asked for."""
    rows: list[Workload] = []
    for model in models:
        hidden, ffn, vocab, heads, kv_heads, head_dim = MODELS[model]
        shapes = {
            "qkv": ((heads + 2 * kv_heads) * head_dim, hidden),
            "o": (hidden, heads * head_dim),
            "gate/up": (ffn, hidden),
            "down": (hidden, ffn),
            "lm_head": (vocab, hidden),
        }
        for m in ms:
            rows += [Workload(model, name, m, *shapes[name]) for name in ROWS]
            if fused:
                rows += [
                    Workload(model, "swiglu", m, *shapes["gate/up"], "swiglu"),
                    Workload(model, "o+residual", m, *shapes["o"], "residual"),
                    Workload(model, "down+residual", m, *shapes["down"], "residual"),
                    Workload(model, "norm+qkv+rope", m, *shapes["qkv"], "rope", "rmsnorm", heads, kv_heads),
                    Workload(model, "norm+gate/up+swiglu", m, *shapes["gate/up"], "swiglu", "rmsnorm"),
                ]
            if attention:
                rows += [Workload(model, "attention", m, length, head_dim, heads=heads, kv_heads=kv_heads)
                         for length in cache_lengths]  # fmt: skip
    return rows


def run_workload(
    w: Workload, budget: int, db: str, strategy: str, copy_gbps: float | None, skip: frozenset[str], smoke: bool
) -> dict[str, Any]:
    """One row: tune, then run and time every implementation not in ``skip`` (errors recorded per
    implementation)."""
    device = "cpu" if smoke else "cuda"
    family = get_op(w.family)
    spec = w.spec()
    row: dict[str, Any] = {"model": w.model, "row": w.row, "family": w.family, "epilogue": w.epilogue,
                           "prologue": w.prologue, "shape": w.shape_text, "dtype": "bf16",
                           "baseline": w.baseline}  # fmt: skip
    result, row["tune"] = tune(spec, budget, db, strategy)
    inputs = family.make_inputs(spec, 1234, family.distributions[0], device)
    nbytes = family.bytes_moved(spec)

    def eager(*args: torch.Tensor) -> torch.Tensor:
        """What users write: the family's reference (F.linear and the epilogue, Hugging Face's
        RMSNorm and RoPE around it, or SDPA), in bf16."""
        return family.reference(spec, args)[0]

    torch._dynamo.reset()  # fresh caches and static shapes: the strongest compiled baseline per shape
    impls: dict[str, Fn] = {w.baseline: eager}
    if w.family == "decode_attention":
        impls["sdpa repeat_kv"] = _sdpa_repeat_kv(spec)
    if "max-autotune" not in skip:  # compiled (and autotuned) at its first call, below
        impls["max-autotune"] = torch.compile(eager, mode="max-autotune-no-cudagraphs", dynamic=False)
    if result.candidate_variant:  # (variant is empty when the baseline won: the best candidate is timed anyway)
        name = "kernelsmith" if result.winner == "kernel" else "best candidate"
        try:
            runner = runner_of(family, spec, result)
            impls[name] = lambda *args: runner(args)[0]
        except Exception as exc:  # a variant that no longer builds is reported, not fatal
            row.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"[:500]

    times: dict[str, float] = {}
    reference = None
    for name, fn in impls.items():
        try:
            out = fn(*inputs)
            synchronize(device)
            if name == w.baseline:
                reference = out
            elif reference is not None:
                row.setdefault(f"max_abs_diff_vs_{w.baseline}", {})[name] = max_abs_diff(out, reference)
            times[name] = bench(lambda fn=fn: fn(*inputs), smoke)
        except Exception as exc:  # a baseline that fails to compile is reported, not fatal
            row.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"[:500]
    row["us"] = times
    row["gbps"] = {name: nbytes / (t * 1e-6) / 1e9 for name, t in times.items()}
    if copy_gbps:
        row["pct_of_copy"] = {name: 100.0 * v / copy_gbps for name, v in row["gbps"].items()}
    ours = times.get("kernelsmith", times.get("best candidate"))
    peers = [t for name, t in times.items() if name in (w.baseline, "max-autotune", "sdpa repeat_kv")]
    if ours and peers:
        row["speedup_vs_best_peer"] = min(peers) / ours
        if w.baseline in times:
            row[f"speedup_vs_{w.baseline}"] = times[w.baseline] / ours
    if copy_gbps and ours and w.m == 1 and w.family == "decode_matmul" and w.row in ROWS:
        pct = row["pct_of_copy"]
        ours_pct = pct.get("kernelsmith", pct.get("best candidate", 0.0))
        slow_cublas = pct.get("cublas", 100.0) < SLOW_CUBLAS_PCT
        row["meets_target"] = ours_pct >= TARGET_PCT and (
            not slow_cublas or row.get("speedup_vs_cublas", 0.0) >= TARGET_VS_SLOW_CUBLAS
        )
    return row


def _sdpa_repeat_kv(spec: OpSpec) -> Fn:
    """Hugging Face's own SDPA path with a mask: the KV heads repeated (``repeat_kv``) and no
    ``enable_gqa`` (which CUDA's memory-efficient backend lacks, so that torch may fall back to the
    math backend): the other way users run this attention, timed beside the family's reference."""
    group = spec.inputs[0].shape[1] // spec.inputs[1].shape[1]
    scale = float(spec.const("scale"))

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        keys = torch.arange(k.shape[2], device=k.device)
        mask = (keys[None, :] < lengths[:, None])[:, None, None, :]  # one new token: every valid key
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)

    return run


COLUMNS = ("eager", "sdpa repeat_kv", "max-autotune", "kernelsmith", "best candidate")


def print_table(report: dict[str, Any]) -> None:
    print_smoke_banner(report)
    print(f"\n{report['gpu']}  copy {report['copy_gbps'] or 0:.0f} GB/s  {report['date']}  budget {report['budget']}")
    print("GB/s (% of copy bandwidth); eager = cuBLAS (projections) or SDPA (attention); x peer = the best of "
          "eager and max-autotune / kernelsmith")
    header = f"{'model':5} {'row':19} {'M x N x K':18} " + " ".join(f"{c:>16}" for c in COLUMNS)
    print(header + f" {'x peer':>7} {'target':>6} variant")
    for row in report["rows"]:
        label = f"{row.get('model', '?'):5} {row.get('row', '?'):19} {row.get('shape', ''):18}"
        if "us" not in row:
            print(f"{label} ERROR")
            continue
        cells = []
        for column in COLUMNS:
            name = row.get("baseline", "cublas") if column == "eager" else column
            if name not in row["gbps"]:
                cells.append(f"{'-':>16}")
            else:
                pct = row.get("pct_of_copy", {}).get(name)
                cells.append(f"{row['gbps'][name]:7.0f} ({pct:5.1f}%)" if pct is not None else
                             f"{row['gbps'][name]:16.2f}")  # fmt: skip
        speedup = row.get("speedup_vs_best_peer")
        target = {True: "yes", False: "NO"}.get(row.get("meets_target"), "-")  # type: ignore[call-overload]
        print(f"{label} {' '.join(cells)} {(f'{speedup:.3f}' if speedup else '-'):>7} {target:>6} "
              f"{row['tune']['winner']} {row['tune'].get('variant') or ''}")  # fmt: skip


def _choices(text: str, known: tuple[Any, ...], what: str, kind: Callable[[str], Any] = str) -> list[Any]:
    """A comma-separated selection from ``known`` (all of them when empty); ValueError naming a typo."""
    picked = [kind(s) for s in text.split(",") if s]
    unknown = [p for p in picked if p not in known]
    if unknown:
        raise ValueError(f"unknown {what} {unknown} (known: {', '.join(map(str, known))})")
    return picked or list(known)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="decode.json")
    add_run_options(parser, "row", 24)
    parser.add_argument("--models", default="", help="comma-separated: 1b, 8b (default both)")
    parser.add_argument("--m", default="", help="rows of x, comma-separated: 1, 8 (default both)")
    every = ROWS + FUSED_ROWS + ATTENTION_ROWS
    parser.add_argument("--only", default="", help=f"these rows only (comma-separated: {', '.join(every)})")
    parser.add_argument("--fused", action="store_true", help="add the fused rows (swiglu, o/down+residual, "
                        "norm+qkv+rope, norm+gate/up+swiglu)")
    parser.add_argument("--attention", action="store_true", help="add the attention rows (decode over a KV cache)")
    parser.add_argument("--cache-len", default="", help="KV cache lengths of the attention rows, comma-separated "
                        f"(default {','.join(map(str, CACHE_LENGTHS))})")
    parser.add_argument("--skip", default="", help="leave out these implementations (max-autotune)")
    args = parser.parse_args(argv)
    try:
        models = _choices(args.models, tuple(MODELS), "models")
        ms = _choices(args.m, M_VALUES, "row counts", int)
        only = _choices(args.only, every, "rows") if args.only else []
        cache_lengths = [int(v) for v in args.cache_len.split(",") if v] or list(CACHE_LENGTHS)
        skip = (
            frozenset(_choices(args.skip, ("max-autotune",), "implementations to skip")) if args.skip else frozenset()
        )
    except ValueError as err:  # (a --cache-len that is no integer too)
        print(err, file=sys.stderr)
        return 2
    refusal = settle_run_options(args, "benchmarks/decode.py", 24)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    if args.smoke:
        skip |= {"max-autotune"}  # compiles for CUDA: not part of a CPU smoke test
    fused = args.fused or any(name in FUSED_ROWS for name in only)
    attention = args.attention or any(name in ATTENTION_ROWS for name in only)
    rows = [w for w in workloads(models, ms, fused, attention, cache_lengths) if not only or w.row in only]
    copy_gbps = None if args.smoke else measure_copy_bandwidth(torch.device("cuda"))[0]
    report = start_report(args, copy_gbps=copy_gbps)
    run_rows(report, args.out, [w.tiny() if args.smoke else w for w in rows],
             lambda w: run_workload(w, args.budget, args.db, args.strategy, copy_gbps, skip, args.smoke),
             lambda w: {"model": w.model, "row": w.row, "shape": w.shape_text})  # fmt: skip
    print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
