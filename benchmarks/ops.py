"""Op-library benchmark: tune each op family at the PERFORMANCE.md shapes, then time the winner side
by side with eager PyTorch, torch.compile, torch.compile max-autotune and Liger-Kernel, in one process.

    python benchmarks/ops.py --out bench.json [--only rmsnorm,softmax] [--budget 50] [--train all] [--odd]

Forward rows time the op as a user writes it (``eager``), compiled both ways, Liger's function
where it has the op, and kernelsmith's tuned winner. ``--train`` adds training-step rows
(forward + backward, gradients of every floating-point input): the PyTorch paths through
autograd, Liger through its autograd functions, kernelsmith through its autograd node with the
tuned forward and the tuned backward family. ``--odd`` runs the odd shapes instead (ODD_WORKLOADS:
misaligned and vocabulary-sized widths, few rows, a million narrow rows, Gemma's norms). Every
implementation is timed with
``triton.testing.do_bench`` (CUDA events, L2 flushed, median). Percentages are of the measured
copy bandwidth, bytes = each input read once + each output written once (the forward's plus the
backward's for training rows). Prints a table and writes JSON with the date, GPU, versions and
command after every row. Needs a CUDA GPU; Liger is optional (its column stays empty without it).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from _common import as_tuple, bench, environment, max_abs_diff, runner_of, tune

from kernelsmith import dispatch
from kernelsmith.evaluate.timing import measure_copy_bandwidth
from kernelsmith.ops import get_op

Fn = Callable[..., Any]


# ---- what users write (the eager baselines) ---------------------------------------------------


def hf_rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Hugging Face LlamaRMSNorm (fp32 upcast)."""
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> Any:
    h = x + residual
    return hf_rmsnorm(h, w, eps), h


def gemma_rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """transformers' GemmaRMSNorm.forward: float32 throughout, times (1 + weight), rounded once."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w.float())).type_as(x)


def gemma_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor) -> Any:
    h = x + residual
    return gemma_rmsnorm(h, w), h


def layernorm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], w, b, 1e-5)


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x)


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.silu(a) * b


def geglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(a, approximate="tanh") * b


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Training code's loss: logits upcast to fp32."""
    return F.cross_entropy(logits.float(), target)


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> Any:
    """Hugging Face apply_rotary_pos_emb with (S, D) caches on (B, H, S, D) q and k."""

    def rotate_half(t: torch.Tensor) -> torch.Tensor:
        half = t.shape[-1] // 2
        return torch.cat((-t[..., half:], t[..., :half]), dim=-1)

    c, s = cos[None, None], sin[None, None]
    return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s


# ---- Liger-Kernel's functions (imported lazily: an optional peer) ---------------------------------


def liger(name: str) -> Fn | None:
    """Liger's function for an op, adapted to the benchmark's input order; None without Liger."""
    try:
        from liger_kernel.transformers import functional as lf
    except ImportError:
        return None
    table: dict[str, Fn] = {
        # in_place=False: Liger's default overwrites dy with dx, which repeated timing would compound.
        "rmsnorm": lambda x, w: lf.liger_rms_norm(x, w, 1e-6, in_place=False),
        "add_rmsnorm": lambda x, r, w: lf.liger_fused_add_rms_norm(x, r, w, 1e-6, in_place=False),
        "layernorm": lambda x, w, b: lf.liger_layer_norm(x, w, b, 1e-5),
        "softmax": lf.liger_softmax,
        "swiglu": lf.liger_swiglu,
        "geglu": lf.liger_geglu,
        "cross_entropy": lf.liger_cross_entropy,
        "rope": lambda q, k, cos, sin: lf.liger_rope(q, k, cos[None], sin[None]),
    }
    return table.get(name)


# ---- the workloads --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    op: str
    shape: tuple[int, ...]
    eager: Fn
    constants: dict[str, Any] = field(default_factory=dict)
    train: bool = False  # time forward + backward

    @property
    def label(self) -> str:
        return f"{self.op}{' fwd+bwd' if self.train else ''}"


WORKLOADS = [
    Workload("rmsnorm", (8192, 4096), hf_rmsnorm),
    Workload("rmsnorm", (4096, 8192), hf_rmsnorm),
    Workload("rmsnorm", (32768, 1024), hf_rmsnorm),
    Workload("layernorm", (8192, 4096), layernorm, {"eps": 1e-5}),
    Workload("layernorm", (4096, 8192), layernorm, {"eps": 1e-5}),
    Workload("layernorm", (32768, 1024), layernorm, {"eps": 1e-5}),
    Workload("softmax", (8192, 4096), softmax),
    Workload("softmax", (4096, 8192), softmax),
    Workload("softmax", (32768, 1024), softmax),
    Workload("gelu_tanh", (16384, 8192), gelu_tanh),
    Workload("gelu", (16384, 8192), gelu),
    Workload("swiglu", (16384, 8192), swiglu),
    Workload("geglu", (16384, 8192), geglu),
    Workload("add_rmsnorm", (8192, 4096), add_rmsnorm),
    Workload("cross_entropy", (8192, 128256), cross_entropy),
    Workload("rope", (8, 32, 2048, 128), rope),
    # Training steps (forward + backward), with --train.
    Workload("rmsnorm", (8192, 4096), hf_rmsnorm, train=True),
    Workload("swiglu", (16384, 8192), swiglu, train=True),
    Workload("cross_entropy", (8192, 128256), cross_entropy, train=True),
    Workload("layernorm", (8192, 4096), layernorm, {"eps": 1e-5}, train=True),
    Workload("add_rmsnorm", (8192, 4096), add_rmsnorm, train=True),
]

# The odd shapes (--odd), shapes nobody tunes for: widths that are not a multiple of 8 (rows that
# start at addresses no 16-byte vector load can use), widths just above a power of two, a
# vocabulary-sized row too wide for one program's registers, few rows (a small workload: a few
# programs for 132 SMs) and very many narrow rows; Gemma's (1 + weight) norms.
_ODD_SHAPES = ((8192, 4095), (2048, 32001), (1024, 50257), (512, 128257), (8192, 4097), (8, 4096), (1 << 20, 64))
_ODD_FAMILIES: tuple[tuple[str, Fn, dict[str, Any]], ...] = (
    ("rmsnorm", hf_rmsnorm, {}), ("layernorm", layernorm, {"eps": 1e-5}), ("softmax", softmax, {}),
    ("add_rmsnorm", add_rmsnorm, {}))
ODD_WORKLOADS = [Workload(op, shape, eager, constants)
                 for op, eager, constants in _ODD_FAMILIES for shape in _ODD_SHAPES]
ODD_WORKLOADS += [
    Workload("rmsnorm", (8192, 3072), gemma_rmsnorm, {"weight_offset": 1.0}),
    Workload("add_rmsnorm", (8192, 3072), gemma_add_rmsnorm, {"weight_offset": 1.0}),
    Workload("add_rmsnorm", (8192, 3072), gemma_add_rmsnorm, {"weight_offset": 1.0}, train=True),
]


def training_step(fn: Fn, inputs: Sequence[torch.Tensor]) -> Fn:
    """A closure running ``fn`` forward and backward, returning the inputs' gradients.

    The gradient of each output is a fixed random tensor (1 for a scalar loss);
    ``torch.autograd.grad`` returns the gradients without accumulating into ``.grad``.
    """
    leaves = [t.detach().requires_grad_(t.is_floating_point()) for t in inputs]
    wanted = [t for t in leaves if t.requires_grad]
    probe = as_tuple(fn(*leaves))
    torch.manual_seed(0)  # the same output gradients for every implementation
    grads_out = [torch.ones_like(o) if o.dim() == 0 else torch.randn_like(o) for o in probe]

    def step() -> tuple[torch.Tensor, ...]:
        outs = as_tuple(fn(*leaves))
        return torch.autograd.grad(outs, wanted, grads_out[: len(outs)])

    return step


def wall_us(call: Fn, steps: int = 50) -> float:
    """Host wall time per call over back-to-back calls (device drained at the end): when it is
    close to the device time, the implementation is bound by its host-side launch path."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps * 1e6


def kernel_profile(call: Fn, steps: int = 5, top: int = 8) -> list[dict[str, Any]]:
    """The device kernels one call launches: name, launches and device time per call."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            call()
        torch.cuda.synchronize()
    rows = []
    for event in prof.key_averages():
        device_us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0.0)
        if device_us:
            rows.append({"kernel": event.key[:90], "launches": event.count / steps, "us": device_us / steps})
    return sorted(rows, key=lambda r: -r["us"])[:top]


def run_workload(w: Workload, budget: int, db: str, copy_gbps: float, profile: bool = False) -> dict[str, Any]:
    family = get_op(w.op)
    spec = family.spec(w.shape, "bf16", **w.constants)
    row: dict[str, Any] = {"op": w.label, "shape": "x".join(map(str, w.shape)), "dtype": "bf16"}
    result, row["tune"] = tune(spec, budget, db)
    inputs = family.make_inputs(spec, 1234, "normal", "cuda")
    nbytes = family.bytes_moved(spec)

    torch._dynamo.reset()  # fresh caches and static shapes: the strongest compiled baseline per shape
    impls: dict[str, Fn] = {
        "eager": w.eager,
        "compile": torch.compile(w.eager, dynamic=False),
        "max-autotune": torch.compile(w.eager, mode="max-autotune-no-cudagraphs", dynamic=False),
    }
    # Liger's functions here are the Llama norms: a Gemma row (weight_offset) has no peer column.
    peer = None if w.constants.get("weight_offset") else liger(w.op)
    if peer is not None:
        impls["liger"] = peer
    kernel: Fn | None = None
    if result.winner == "kernel":
        forward = runner_of(family, spec, result)
        if not w.train:
            def kernel(*args: torch.Tensor) -> Any:
                outs = forward(args)
                return outs[0] if len(outs) == 1 else tuple(outs)
        else:
            bwd_family = get_op(str(family.backward))
            probe = forward(inputs)
            bwd_inputs = family.backward_inputs(tuple(torch.randn_like(o) for o in probe), inputs, probe)
            bwd_spec = bwd_family.spec_for(*bwd_inputs, **w.constants)
            bwd_result, row["tune_backward"] = tune(bwd_spec, budget, db)
            nbytes += bwd_family.bytes_moved(bwd_spec)
            if bwd_result.winner == "kernel":
                backward = runner_of(bwd_family, bwd_spec, bwd_result)

                def kernel(*args: torch.Tensor) -> Any:
                    return dispatch.KernelFunction.apply(family, forward, backward, *args)
    if kernel is not None:
        impls["kernelsmith"] = kernel

    times: dict[str, float] = {}
    reference = None
    for name, fn in impls.items():
        try:
            call = training_step(fn, inputs) if w.train else (lambda fn=fn: fn(*inputs))
            out = call()
            torch.cuda.synchronize()
            if name == "eager":
                reference = out
            elif reference is not None:
                row.setdefault("max_abs_diff_vs_eager", {})[name] = max_abs_diff(out, reference)
            times[name] = bench(call)
            row.setdefault("host_wall_us", {})[name] = wall_us(call)
            if profile:
                try:
                    row.setdefault("kernels", {})[name] = kernel_profile(call)
                except Exception as exc:  # the profiler is a diagnostic: never lose the timing for it
                    row.setdefault("kernels", {})[name] = [{"error": f"{type(exc).__name__}: {exc}"[:200]}]
        except Exception as exc:  # a baseline that fails to compile is reported, not fatal
            row.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"[:500]
    row["us"] = times
    row["pct_of_copy"] = {k: 100.0 * nbytes / (v * 1e-6) / 1e9 / copy_gbps for k, v in times.items()}
    if "kernelsmith" in times:
        best_other = min(v for k, v in times.items() if k != "kernelsmith")
        row["speedup_vs_best"] = best_other / times["kernelsmith"]
        row["speedup_vs_compile"] = times["compile"] / times["kernelsmith"] if "compile" in times else None
    return row


COLUMNS = ("eager", "compile", "max-autotune", "liger", "kernelsmith")


def print_table(report: dict[str, Any]) -> None:
    print(f"\n{report['gpu']}  copy {report['copy_gbps']:.0f} GB/s  {report['date']}")
    header = f"{'op':22} {'shape':16} " + " ".join(f"{c:>15}" for c in COLUMNS)
    print(header + f" {'x best':>7} {'x comp':>7} {'search s':>8} winner")
    for row in report["rows"]:
        if "us" not in row:
            print(f"{row['op']:22} {row['shape']:16} ERROR")
            continue
        cells = []
        for name in COLUMNS:
            t = row["us"].get(name)
            cells.append(f"{t:7.1f} ({row['pct_of_copy'][name]:4.1f}%)" if t else f"{'-':>15}")
        tune_info = row["tune"]
        search = tune_info["search_wall_s"] + row.get("tune_backward", {}).get("search_wall_s", 0.0)
        print(
            f"{row['op']:22} {row['shape']:16} {' '.join(cells)} {row.get('speedup_vs_best') or math.nan:7.2f} "
            f"{row.get('speedup_vs_compile') or math.nan:7.2f} {search:8.1f} {tune_info['winner']} "
            f"{tune_info.get('variant') or ''}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench.json")
    parser.add_argument("--budget", type=int, default=50)
    parser.add_argument("--db", default="/tmp/kernelsmith-bench.db")
    parser.add_argument("--only", default="", help="forward rows of these ops only (comma-separated; 'none': none)")
    parser.add_argument("--profile", action="store_true", help="record each implementation's device kernels")
    parser.add_argument("--train", default="", help="forward+backward rows of these ops (comma-separated, or 'all')")
    parser.add_argument("--odd", action="store_true",
                        help="the odd shapes (ODD_WORKLOADS) instead of the standard rows")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/ops.py needs a CUDA GPU", file=sys.stderr)
        return 2
    copy_gbps, _ = measure_copy_bandwidth(torch.device("cuda"))
    report = environment(liger=_liger_version(), copy_gbps=copy_gbps)
    only = {s for s in args.only.split(",") if s}
    train = {s for s in args.train.split(",") if s}
    for w in ODD_WORKLOADS if args.odd else WORKLOADS:
        wanted = (w.op in train or "all" in train) if w.train else (not only or w.op in only)
        if not wanted:
            continue
        try:
            row = run_workload(w, args.budget, args.db, copy_gbps, args.profile)
        except Exception:
            row = {"op": w.label, "shape": "x".join(map(str, w.shape)), "error": traceback.format_exc()[-2000:]}
        report["rows"].append(row)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1, default=str)
        print(json.dumps(row, default=str)[:700], flush=True)
    print_table(report)
    return 0


def _liger_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("liger-kernel")
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main())
