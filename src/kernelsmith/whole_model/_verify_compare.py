"""Comparing an optimized model's outputs and gradients with the original's and the float64 truth.

Part of the whole-model verification (:mod:`kernelsmith.whole_model.verify`): one run of a model
on one seed's inputs (outputs, the weighted loss's gradients), and the checks between runs: the
float64 truth's bar (``check_close``, DESIGN.md rule 8), or the per-dtype limits of
:data:`FALLBACK_TOLERANCES` where the float64 copy does not fit, and the original's own
determinism. :func:`~kernelsmith.whole_model.verify.verify_model` drives them seed by seed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from kernelsmith.evaluate.errors import ErrorStats, check_close, error_stats
from kernelsmith.ops._base import Tolerance
from kernelsmith.whole_model._verify_results import Check

# Without a float64 truth: the optimized model against the original, relative L2 difference over
# the tensor <= rel_l2 and largest elementwise difference <= max_abs_share * max|original|. A whole
# model accumulates rounding over its layers, and two correct bf16 models can differ by a few
# percent in a few elements of a gradient, so these are looser than a single op's bar.
FALLBACK_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {  # dtype: (rel_l2, max_abs_share)
    torch.float64: (1e-9, 1e-8),
    torch.float32: (1e-4, 1e-3),
    torch.float16: (1e-2, 2e-2),
    torch.bfloat16: (5e-2, 1e-1),
}
# The float64 copy is made only when its parameters and buffers take at most this share of the
# free memory (activations need the rest).
FP64_MEMORY_SHARE = 0.5
# ---------------------------------------------------------------------------------------------
# Comparing outputs and gradients
# ---------------------------------------------------------------------------------------------


def _leaves(value: Any, path: str) -> list[tuple[str, torch.Tensor]]:
    """The tensors of a model output with their paths (``output``, ``output[0]``, ``output.logits``)."""
    if isinstance(value, torch.Tensor):
        return [(path, value)]
    if isinstance(value, Mapping):  # includes Hugging Face ModelOutput (an ordered dict)
        return [leaf for key in value for leaf in _leaves(value[key], f"{path}.{key}")]
    if isinstance(value, list | tuple):
        return [leaf for i, item in enumerate(value) for leaf in _leaves(item, f"{path}[{i}]")]
    return []  # None and other non-tensor values are not compared


def _stats(e: ErrorStats) -> dict[str, float]:
    return {"rel_l2": e.rel_l2, "max_abs": e.max_abs}


def _fallback_close(output: torch.Tensor, original: torch.Tensor) -> str | None:
    """The test against the original, without a float64 truth (:data:`FALLBACK_TOLERANCES`)."""
    rel_limit, abs_share = FALLBACK_TOLERANCES.get(original.dtype, FALLBACK_TOLERANCES[torch.float32])
    if output.shape != original.shape:
        return f"shape {tuple(output.shape)} differs from the original's {tuple(original.shape)}"
    out_finite, ref_finite = torch.isfinite(output), torch.isfinite(original)
    if not bool(torch.equal(out_finite, ref_finite)):
        bad = int((out_finite != ref_finite).sum())
        return f"{bad} elements are NaN/Inf where the original's are finite (or the reverse)"
    reference = original[ref_finite].double()
    if reference.numel() == 0:
        return None
    stats = error_stats(output[ref_finite], reference)
    abs_limit = abs_share * float(reference.abs().max())
    if stats.rel_l2 > rel_limit:
        return f"relative L2 difference from the original {stats.rel_l2:.3g} exceeds {rel_limit:g} (no float64 truth)"
    if stats.max_abs > abs_limit:
        return (
            f"max abs difference from the original {stats.max_abs:.3g} exceeds {abs_share:g} x max|original| "
            f"= {abs_limit:.3g} (no float64 truth)"
        )
    return None


def _compare(
    seed: int,
    kind: str,
    name: str,
    output: torch.Tensor | None,
    original: torch.Tensor | None,
    truth: torch.Tensor | None,
    tolerance: Tolerance,
    scale: float,
) -> Check:
    """Compare one tensor; ``scale`` is the largest magnitude among all tensors of its kind."""
    if output is None or original is None:
        if output is None and original is None:
            return Check(seed, kind, name, True)
        missing = "the optimized model" if output is None else "the original"
        return Check(seed, kind, name, False, f"{missing} produced no {kind.replace('_', ' ')} for it")
    if output.dtype != original.dtype:
        return Check(seed, kind, name, False, f"dtype {output.dtype} differs from the original's {original.dtype}")
    if output.shape != original.shape:
        return Check(
            seed, kind, name, False, f"shape {tuple(output.shape)} differs from the original's {tuple(original.shape)}"
        )
    output, original = output.detach(), original.detach()
    if not original.is_floating_point():
        same = bool(torch.equal(output, original))
        differ = "" if same else f"{int((output != original).sum())} elements differ from the original"
        return Check(seed, kind, name, same, differ)
    reference = truth.detach().double() if truth is not None else original.double()
    # The bare rule, no family floor (evaluate/errors.py): a floor is one op's condition on one
    # draw, computed from that op's inputs and float64 reference, and here there is no op, only a
    # model's tensor; what a site's floor would allow at the model's outputs depends on the
    # layers after it, which nothing computes. The original's own error after all its layers is
    # the base, and MODEL_TOLERANCE's wider floor_ulps the slack. If anything, this is stricter
    # than validation: a kernel admitted on its floor can fail here, and that failure is reported
    # (diagnose names the replacement). It is never more lenient.
    reason: str | None = (
        check_close(output, reference, original, tolerance) if truth is not None else _fallback_close(output, original)
    )
    error = error_stats(output, reference)
    reference_error = error_stats(original, reference) if truth is not None else None
    if reason is not None and _near_zero(reference, scale) and _finite_alike(output, reference):
        # A tensor that is zero up to rounding (BERT's key-bias gradient: softmax ignores a constant
        # shift) has no relative accuracy to keep; its errors are judged against the scale of all
        # tensors of its kind instead.
        eps = torch.finfo(output.dtype).eps
        base = reference_error.max_abs if reference_error is not None else 0.0
        if error.max_abs <= tolerance.k * base + tolerance.floor_ulps * eps * scale:
            reason = None
    return Check(
        seed, kind, name, reason is None, reason or "",
        _stats(error), _stats(reference_error) if reference_error is not None else {},
    )  # fmt: skip


# A tensor whose largest magnitude is below this share of the largest among its kind is "zero up
# to rounding" (see _compare).
NEAR_ZERO_SHARE = 1e-3


def _near_zero(reference: torch.Tensor, scale: float) -> bool:
    finite = reference[torch.isfinite(reference)]
    return finite.numel() == 0 or float(finite.abs().max()) <= NEAR_ZERO_SHARE * scale


def _finite_alike(output: torch.Tensor, reference: torch.Tensor) -> bool:
    return output.shape == reference.shape and bool(torch.equal(torch.isfinite(output), torch.isfinite(reference)))


def _scale(tensors: Iterable[torch.Tensor | None]) -> float:
    """The largest finite magnitude among floating-point ``tensors`` (0 if none)."""
    best = 0.0
    for t in tensors:
        if t is not None and t.is_floating_point() and t.numel():
            finite = t[torch.isfinite(t)]
            if finite.numel():
                best = max(best, float(finite.abs().max()))
    return best


def _fp64_fits(model: nn.Module, device: torch.device, train: bool = False) -> bool:
    """Whether a float64 copy of the model's parameters and buffers (and with ``train`` their
    gradients) takes at most :data:`FP64_MEMORY_SHARE` of the free memory on ``device``."""
    tensors = [*model.parameters(), *model.buffers()]
    if any(t.is_meta for t in tensors):
        return False
    need = sum(t.numel() * 8 for t in tensors if t.is_floating_point()) * (2 if train else 1)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
    else:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):  # not a POSIX system: assume it fits
            return True
    return need <= FP64_MEMORY_SHARE * free


def _to_fp64(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.double()
    return value


def _device_of(model: nn.Module, inputs: Sequence[Any]) -> torch.device:
    for value in (*inputs, *model.parameters(), *model.buffers()):
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


def _named_params(fn: Callable[..., Any], model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The parameters whose gradients a run of ``fn`` produces (see the module docstring)."""
    owner = fn if isinstance(fn, nn.Module) else model
    return [(name.replace("_orig_mod.", ""), p) for name, p in owner.named_parameters()]


@dataclass
class _Run:
    """One model's outputs (and gradients) on one input set."""

    outputs: list[tuple[str, torch.Tensor]]
    grads: dict[str, torch.Tensor | None] = field(default_factory=dict)
    input_grads: dict[str, torch.Tensor | None] = field(default_factory=dict)


def _loss_weights(outputs: Sequence[tuple[str, torch.Tensor]], seed: int) -> dict[str, torch.Tensor]:
    """Fixed random weights per floating-point output, drawn on the CPU from ``seed``."""
    generator = torch.Generator().manual_seed(10_007 * seed + 1)
    return {
        name: torch.randn(t.shape, generator=generator, dtype=torch.float64)
        for name, t in outputs
        if t.is_floating_point()
    }


def _run(
    fn: Callable[..., Any],
    model: nn.Module,
    inputs: Sequence[Any],
    *,
    train: bool,
    seed: int,
    weights: dict[str, torch.Tensor] | None = None,
) -> tuple[_Run, dict[str, torch.Tensor]]:
    """Run ``fn(*inputs)``; with ``train``, backpropagate the weighted-sum loss and collect the
    gradients (leaving ``.grad`` cleared). Returns the run and the loss weights used."""
    if not train:
        with torch.no_grad():
            return _Run(_leaves(fn(*inputs), "output")), weights or {}
    params = _named_params(fn, model)
    for _, p in params:
        p.grad = None
    leaf_inputs = [
        x.detach().clone().requires_grad_(True) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
        for x in inputs
    ]
    outputs = _leaves(fn(*leaf_inputs), "output")
    if weights is None:
        weights = _loss_weights(outputs, seed)
    # d(loss)/d(output) = w, rounded to the output's dtype: the same seed gradient for every model.
    terms = [
        (t * weights[name].to(t.device, t.dtype)).double().sum()
        for name, t in outputs
        if name in weights and t.requires_grad
    ]
    if not terms:
        raise ValueError("train=True: no output of the model requires a gradient")
    torch.stack(terms).sum().backward()
    run = _Run(
        [(name, t.detach()) for name, t in outputs],
        {name: None if p.grad is None else p.grad.detach().clone() for name, p in params},
        {
            f"input[{i}]": None if x.grad is None else x.grad.detach().clone()
            for i, x in enumerate(leaf_inputs)
            if isinstance(x, torch.Tensor) and x.requires_grad
        },
    )
    for _, p in params:
        p.grad = None
    return run, weights


def _check_runs(seed: int, optimized: _Run, original: _Run, truth: _Run | None, tolerance: Tolerance) -> list[Check]:
    names = [n for n, _ in original.outputs]
    if [n for n, _ in optimized.outputs] != names:
        got = [n for n, _ in optimized.outputs]
        return [Check(seed, "output", "structure", False, f"the optimized model returned {got}, the original {names}")]
    judge = truth if truth is not None else original  # whose magnitudes set each kind's scale
    truth_outputs = dict(truth.outputs) if truth is not None else {}
    scale = _scale(t for _, t in judge.outputs)
    checks = [
        _compare(seed, "output", name, out, orig, truth_outputs.get(name), tolerance, scale)
        for (name, out), (_, orig) in zip(optimized.outputs, original.outputs, strict=True)
    ]
    for kind, opt_map, orig_map, truth_map, judge_map in (
        ("grad", optimized.grads, original.grads, truth.grads if truth else {}, judge.grads),
        (
            "input_grad",
            optimized.input_grads,
            original.input_grads,
            truth.input_grads if truth else {},
            judge.input_grads,
        ),
    ):
        scale = _scale(judge_map.values())
        for name in sorted(set(opt_map) | set(orig_map)):
            if name not in orig_map or name not in opt_map:
                which = "original" if name not in orig_map else "optimized"
                checks.append(Check(seed, kind, name, False, f"the {which} model has no such parameter"))
                continue
            checks.append(
                _compare(seed, kind, name, opt_map[name], orig_map[name], truth_map.get(name), tolerance, scale)
            )
    return checks


# Two runs of the original on the same inputs may differ by this many units of the dtype's
# epsilon (relative L2): a GPU reduction with atomics is not bitwise reproducible, random noise is.
REPEAT_ULPS = 4.0


def _determinism_checks(model: nn.Module, inputs: Sequence[Any], seed: int) -> list[Check]:
    """The original run twice on the same inputs must agree; if it does not (random ops, dropout
    left on), no comparison with it means anything, and the failure says so."""
    with torch.no_grad():
        first, second = _leaves(model(*inputs), "output"), _leaves(model(*inputs), "output")
    failed = []
    for (name, a), (_, b) in zip(first, second, strict=True):
        if not a.is_floating_point():
            same = bool(torch.equal(a, b))
            rel = 0.0 if same else 1.0
        else:
            same = bool(torch.equal(torch.isfinite(a), torch.isfinite(b)))
            rel = error_stats(b, a.double()).rel_l2 if same and a.numel() else (0.0 if same else 1.0)
            same = same and rel <= REPEAT_ULPS * torch.finfo(a.dtype).eps
        if not same:
            reason = (
                f"the original model's outputs differ between two runs on the same inputs (relative L2 {rel:.3g}): "
                "random ops or dropout are active, and verification needs a deterministic forward"
            )
            failed.append(Check(seed, "output", f"{name} (original run twice)", False, reason))
    return failed
