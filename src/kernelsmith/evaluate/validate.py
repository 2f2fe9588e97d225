"""Proving a candidate computes the op's function, in the worker process.

Each numbered rule of DESIGN.md ("The harness must be impossible to fool") maps to code here:

1. Outputs are allocated by the harness and poisoned with NaN before every run; the references
   are computed before the candidate runs, from clones of the inputs.
2. Inputs are compared bit for bit with their clones after the run.
3. Tolerances scale with the reference, and *canaries* (zeros, a constant, the input itself)
   must fail the same tolerance on the same data, else the check could not tell them apart.
4. Every run draws a fresh secret seed; several shapes (the target and tails such as 1 and an
   odd row count) and several value distributions are checked.
5. (timing) see :mod:`kernelsmith.evaluate.worker`: outputs produced while timing are verified.
6. Python threads are counted before and after; side-stream work is checked while timing.
7. Outputs must stay the exact ``torch.Tensor`` objects the harness allocated (type, storage,
   shape, strides, dtype); torch operations issued by the candidate are seen by a dispatch mode.
8. The tolerance is relative to PyTorch's own error in the same dtype (see ``errors``).
9. A second run on outputs poisoned with a *different* value must match the first bit for bit.
10. The harness's own functions are checked for tampering after every candidate call.
"""

from __future__ import annotations

import _thread
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import triton
from torch.utils._python_dispatch import TorchDispatchMode

from kernelsmith.evaluate import errors
from kernelsmith.ops._base import Launcher, OpFamily
from kernelsmith.spec import OpSpec


class Rejected(Exception):
    """A candidate failed a check; ``kind`` is the failure kind stored in the database.

    Used only inside the worker: the worker turns it into an EvalResult at its boundary.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


# ---- rule 10: the harness's own functions, bound before any candidate loads -----------------
def _critical_bindings() -> list[tuple[object, str, object]]:
    owners: list[tuple[object, str]] = [
        (torch, "equal"),
        (torch, "isfinite"),
        (torch, "full"),
        (torch, "empty"),
        (torch.linalg, "vector_norm"),
        (torch.Tensor, "double"),
        (torch.Tensor, "clone"),
        (torch.Tensor, "copy_"),
        (torch.Tensor, "fill_"),
        (torch.Tensor, "__eq__"),
        (torch.cuda, "Event"),
        (torch.cuda, "synchronize"),
        (time, "perf_counter"),
        (threading, "active_count"),
        (errors, "check_close"),
        (errors, "error_stats"),
        (sys, "modules"),
    ]
    return [(owner, name, getattr(owner, name)) for owner, name in owners]


_BINDINGS = _critical_bindings()


# Every top-level name of the harness's own modules, by identity. A candidate that reaches a
# harness module (through a frame, say) and rebinds a name there (``errors`` to a fake) changes
# one of these identities. Sealed by the worker once everything is imported.
_HARNESS_MODULES = (
    "__main__",
    "kernelsmith.evaluate.validate",
    "kernelsmith.evaluate.errors",
    "kernelsmith.evaluate.timing",
    "kernelsmith.evaluate.worker",
    "kernelsmith.ops._base",
)
_SEALED: dict[str, dict[str, int]] = {}


def seal_harness() -> None:
    """Remember the identity of every global of the harness modules (called before candidates load)."""
    for module_name in _HARNESS_MODULES:
        module = sys.modules.get(module_name)
        if module is not None:
            _SEALED[module_name] = {k: id(v) for k, v in vars(module).items()}


def tampered_bindings() -> list[str]:
    """Names of harness or torch functions that were replaced since the worker started."""
    changed = []
    for owner, name, original in _BINDINGS:
        if getattr(owner, name, None) is not original:
            changed.append(f"{getattr(owner, '__name__', owner)}.{name}")
    for module_name, identities in _SEALED.items():
        module = sys.modules.get(module_name)
        if module is None:
            changed.append(f"sys.modules[{module_name!r}] removed")
            continue
        current = vars(module)
        changed.extend(f"{module_name}.{k}" for k, ident in identities.items() if id(current.get(k)) != ident)
    return changed


# ---- rule 7: torch operations issued by candidate code --------------------------------------
# Views and allocations a launcher may legitimately do; anything else is PyTorch computing
# what the kernel was supposed to compute.
_ALLOWED_OPS = frozenset(
    {
        "aten.view.default",
        "aten._unsafe_view.default",
        "aten.as_strided.default",
        "aten.reshape.default",
        "aten.alias.default",
        "aten.detach.default",
        "aten.t.default",
        "aten.transpose.int",
        "aten.permute.default",
        "aten.expand.default",
        "aten.select.int",
        "aten.slice.Tensor",
        "aten.unsqueeze.default",
        "aten.squeeze.dim",
        "aten.squeeze.default",
        "aten.empty.memory_format",
        "aten.empty_strided.default",
        "aten.empty_like.default",
        "aten.new_empty.default",
        "aten.new_empty_strided.default",
        "aten.flatten.using_ints",
    }
)


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_TRITON_DIR = os.path.dirname(triton.__file__) + os.sep
_STDLIB_DIR = os.path.dirname(threading.__file__) + os.sep


def _is_stdlib(filename: str) -> bool:
    return filename.startswith(_STDLIB_DIR) and "-packages" not in filename


def _nearest_caller_is(package_dirs: tuple[str, ...], skip: Callable[[str], bool]) -> bool:
    """True when the nearest caller frame that ``skip`` does not pass over belongs to one of
    ``package_dirs`` (this module's own frames are always passed over).

    Files are matched by the installed packages' real directories (not by a path fragment such
    as "/torch/", which a virtual environment's own path can contain).
    """
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename != __file__ and not skip(filename):
            return filename.startswith(package_dirs)
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _issued_by_triton() -> bool:
    """True when the nearest caller outside torch is Triton itself (its interpreter copies
    tensors to and from the host; that is the runtime's work, not the candidate's)."""
    return _nearest_caller_is((_TRITON_DIR,), lambda f: f.startswith(_TORCH_DIR))


# ---- rule 6: threads started during a candidate call ------------------------------------------
class _ThreadStarts:
    """Counts threads started by anything but torch and Triton themselves.

    Counting starts (not live threads) also catches a thread that the candidate starts *and*
    joins inside its call, whose work no per-thread watch would see.
    """

    count = 0

    @classmethod
    def install(cls) -> None:
        def counted(original: Callable[..., Any]) -> Callable[..., Any]:
            def start(*args: Any, **kwargs: Any) -> Any:
                # Threads that torch or Triton start (through the standard library or not)
                # are the runtime's; any other is the candidate's.
                if not _nearest_caller_is((_TORCH_DIR, _TRITON_DIR), _is_stdlib):
                    cls.count += 1
                return original(*args, **kwargs)

            return start

        threading.Thread.start = counted(threading.Thread.start)  # type: ignore[method-assign]
        _thread.start_new_thread = counted(_thread.start_new_thread)
        for private in ("_start_new_thread", "_start_joinable_thread"):
            if hasattr(threading, private):
                setattr(threading, private, counted(getattr(threading, private)))


_ThreadStarts.install()


class TorchOpWatch(TorchDispatchMode):
    """Records aten operations the candidate issues while it runs."""

    def __init__(self) -> None:
        super().__init__()
        self.issued: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = str(func)
        if name not in _ALLOWED_OPS and not _issued_by_triton():
            self.issued.append(name)
        return func(*args, **(kwargs or {}))


# ---- the checks --------------------------------------------------------------------------------
@dataclass
class _Snapshot:
    """Identity of a harness-allocated output: it must still be this exact tensor afterwards."""

    tensor: torch.Tensor
    data_ptr: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype

    @classmethod
    def of(cls, t: torch.Tensor) -> _Snapshot:
        return cls(t, t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)

    def problem(self, t: torch.Tensor) -> str | None:
        if type(t) is not torch.Tensor:
            return f"output became a {type(t).__name__}, not a plain torch.Tensor"
        if t is not self.tensor or t.data_ptr() != self.data_ptr:
            return "output storage was replaced"
        if (tuple(t.shape), tuple(t.stride()), t.dtype) != (self.shape, self.stride, self.dtype):
            return "output shape, strides or dtype changed"
        return None


def allocate_outputs(
    op: OpFamily, spec: OpSpec, device: torch.device | str, poison: float = float("nan")
) -> list[torch.Tensor]:
    return [torch.full(t.shape, poison, dtype=t.torch_dtype, device=device) for t in op.output_specs(spec)]


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a tensor, so NaN == NaN and -0.0 != 0.0 in comparisons."""
    view_dtype = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(view_dtype)


def _canary_problem(
    op: OpFamily, spec: OpSpec, inputs: Sequence[torch.Tensor], ref64: torch.Tensor, lowp: torch.Tensor
) -> str | None:
    """Rule 3: a zero, constant or identity output must fail the tolerance on this data.

    When the reference has no dynamic range (softmax over a width of 1 is all ones), a constant
    *is* the right answer, and there is nothing for a canary to tell apart; likewise the input
    itself when it is as close to the truth as PyTorch's answer. Data on which a canary passes
    anyway is *blind*: :func:`validate` then needs other data for that output.
    """
    finite = ref64[torch.isfinite(ref64)]
    if finite.numel() < 2 or float(finite.max() - finite.min()) == 0.0:
        return None
    canaries = {
        "zeros": torch.zeros_like(lowp),
        "constant": torch.full_like(lowp, float(finite.mean())),
    }
    if inputs and inputs[0].shape == lowp.shape:
        canaries["identity"] = inputs[0].to(lowp.dtype)
    pytorch_error = float((lowp.double() - ref64).abs().nan_to_num(0.0).max())
    for name, canary in canaries.items():
        if name == "identity" and float((canary.double() - ref64).abs().nan_to_num(0.0).max()) <= pytorch_error:
            continue  # the op *is* the identity here (a bias gradient over one row is dy): no wrong answer
        if errors.check_close(canary, ref64, lowp, op.tolerance) is None:
            return f"the tolerance cannot tell a {name} output from the right one on this data"
    return None


def run_checked(
    launcher: Launcher, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor], synchronize: Callable[[], None]
) -> None:
    """One candidate call under the rule 2, 6, 7 and 10 checks; raises Rejected."""
    clones = [t.clone() for t in inputs]
    snapshots = [_Snapshot.of(t) for t in outputs]
    threads_before = threading.active_count()
    starts_before = _ThreadStarts.count
    watch = TorchOpWatch()
    with watch:
        launcher(inputs, outputs)
    synchronize()
    if threading.active_count() > threads_before or _ThreadStarts.count > starts_before:
        raise Rejected("cheat", "the candidate started a thread (work outside the measured call)")
    tampered = tampered_bindings()
    if tampered:
        raise Rejected("cheat", f"the candidate tampered with the harness: {', '.join(tampered)}")
    if watch.issued:
        ops = ", ".join(sorted(set(watch.issued)))
        raise Rejected("cheat", f"the candidate computed with PyTorch instead of its kernel: {ops}")
    for t, clone in zip(inputs, clones, strict=True):
        if not torch.equal(_bits(t), _bits(clone)):
            raise Rejected("cheat", "the candidate modified its inputs")
    for t, snap in zip(outputs, snapshots, strict=True):
        problem = snap.problem(t)
        if problem:
            raise Rejected("cheat", problem)


def validate(
    op: OpFamily,
    spec: OpSpec,
    build: Callable[[OpSpec, Any], Launcher],
    config: Any,
    device: torch.device | str,
    synchronize: Callable[[], None],
) -> int:
    """Check a candidate on the target shape and tail shapes; returns the number of runs.

    Raises Rejected with kind "validate" for wrong results and "cheat" for harness abuse.
    """
    runs = 0
    distributions = list(op.distributions)
    for index, vspec in enumerate(op.validation_specs(spec)):
        launcher = build(vspec, config)
        # The target shape is checked on every distribution; a tail shape on one, taken in turn,
        # and on the next ones until each output has been checked on data that tells the
        # canaries apart (rule 3).
        start = index % len(distributions)
        order = distributions[start:] + distributions[:start]
        told: set[int] = set()  # outputs checked on data that tells the canaries apart
        blind: dict[int, list[str]] = {}  # output index -> why a distribution could not tell
        for distribution in order:
            seed = secrets.randbits(62)  # rule 4: fresh and secret on every evaluation
            inputs = op.make_inputs(vspec, seed, distribution, device)
            pristine = [t.clone() for t in inputs]
            refs64 = op.reference_fp64(vspec, pristine)
            lowps = op.reference(vspec, pristine)
            outputs = allocate_outputs(op, vspec, device)
            run_checked(launcher, inputs, outputs, synchronize)
            for k, (out, ref64, lowp) in enumerate(zip(outputs, refs64, lowps, strict=True)):
                canary = _canary_problem(op, vspec, pristine, ref64, lowp)
                if canary:
                    blind.setdefault(k, []).append(f"{canary} ({distribution})")
                else:
                    told.add(k)
                reason = errors.check_close(out, ref64, lowp, op.tolerance)
                if reason:
                    raise Rejected(
                        "validate", f"output {k} wrong on {vspec.describe()} ({distribution} inputs): {reason}"
                    )
            # Rule 9: poison with another value and run again: bitwise the same answer.
            again = allocate_outputs(op, vspec, device, poison=777.0)
            run_checked(launcher, inputs, again, synchronize)
            for out, out2 in zip(outputs, again, strict=True):
                if not torch.equal(_bits(out), _bits(out2)):
                    raise Rejected(
                        "validate",
                        f"two runs on {vspec.describe()} differ bit for bit: "
                        "the kernel reads uninitialized memory or races",
                    )
            runs += 2
            if index > 0 and len(told) == len(outputs):
                break
        for k, why in blind.items():
            if k not in told:
                raise Rejected("validate", f"harness: output {k} of {vspec.describe()}: {'; '.join(why)}")
    return runs
