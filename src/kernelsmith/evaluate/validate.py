"""Proving a candidate computes the op's function, in the worker process.

Each numbered rule of DESIGN.md ("The harness must be impossible to fool") maps to code here:

1. Outputs are allocated by the harness and pre-filled before every run, in a way chosen with
   secret randomness (NaN, random finite values, zeros, or untouched memory: rule 12, so that a
   kernel reading its output buffer cannot tell validation from a user's process, where outputs
   are ``torch.empty``); every run is paired with one on fresh random values, so an element never
   written cannot hold the right answer in both. The references are computed before the
   candidate runs, from clones of the inputs.
2. Inputs are compared bit for bit with their clones after the run; the few a family declares
   written (a decode step's KV cache, :meth:`OpFamily.written_inputs`) with the state its
   :meth:`OpFamily.reference_written` gives, computed before the candidate runs.
3. Tolerances scale with the reference, and *canaries* (zeros, a constant, the input itself)
   must fail the same tolerance on the same data, else the check could not tell them apart.
4. Every run draws a fresh secret seed; several shapes (the target and tails such as 1 and an
   odd row count) and several value distributions are checked.
5. (timing) see :mod:`kernelsmith.evaluate._worker_timing`: outputs produced while timing are verified.
6. Python threads are counted before and after; side-stream work is checked while timing.
7. Outputs must stay the exact ``torch.Tensor`` objects the harness allocated (type, storage,
   shape, strides, dtype); torch operations issued by the candidate are seen by a dispatch mode.
8. The tolerance is relative to PyTorch's own error in the same dtype (see ``errors``), with the
   family's floor for the op's condition on the draw (:meth:`OpFamily.error_floors`, computed
   from the inputs and the float64 references before the candidate runs).
9. A second run on outputs pre-filled *differently* (one of the two always with fresh random
   values, which no laundering of NaN or zeros can equal) must match the first bit for bit.
10. The harness's own functions are checked for tampering after every candidate call.
"""

from __future__ import annotations

import _thread
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import triton
from torch.utils._python_dispatch import TorchDispatchMode

from kernelsmith.evaluate import errors
from kernelsmith.ops._base import NO_FLOOR, ErrorFloor, Launcher, OpFamily
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
        (torch, "zeros"),
        (torch, "randn"),
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
    "kernelsmith.evaluate._worker_candidates",
    "kernelsmith.evaluate._worker_timing",
    "kernelsmith.evaluate.device_lock",
    "kernelsmith.ops._base",
    "kernelsmith.ops._softmax_condition",  # the families' error floors (rule 8)
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
    """Records aten operations the candidate issues while it runs, besides views, allocations and
    ``library_ops`` (a built-in variant's declared allowance: :attr:`Variant.library_ops`)."""

    def __init__(self, library_ops: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.issued: list[str] = []
        self.allowed = _ALLOWED_OPS | library_ops

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = str(func)
        if name not in self.allowed and not _issued_by_triton():
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


# ---- rules 1, 9 and 12: how output buffers are pre-filled -------------------------------------
# In a user's process a runner's outputs are ``torch.empty``: whatever the allocator hands out.
# If validation always poisoned them with NaN, a kernel could read its output buffer first and
# behave only when it sees NaN. So every run draws, with secret randomness, one of these:
PREFILLS = ("nan", "random", "zeros", "untouched")
# Refilling a buffer in place (between the timing halves) cannot make it untouched memory.
REFILLS = ("nan", "random", "zeros")


@dataclass(frozen=True)
class Prefill:
    """One way of pre-filling output buffers; ``seed`` makes ``"random"`` reproducible, so the
    values can be generated again to tell which elements a kernel never wrote."""

    kind: str
    seed: int = 0

    @classmethod
    def secret(cls, kinds: Sequence[str] = PREFILLS) -> Prefill:
        return cls(secrets.choice(tuple(kinds)), secrets.randbits(62))

    def values(self, shape: Sequence[int], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor | None:
        """The buffer's contents before the kernel runs; None for untouched memory (unknown)."""
        if self.kind == "untouched":
            return None
        if self.kind == "zeros" or (self.kind == "nan" and not dtype.is_floating_point):
            return torch.zeros(tuple(shape), dtype=dtype, device=device)
        if self.kind == "nan":
            return torch.full(tuple(shape), float("nan"), dtype=dtype, device=device)
        generator = torch.Generator(device=device).manual_seed(self.seed)
        if not dtype.is_floating_point:
            high = 2 if dtype == torch.bool else 100
            return torch.randint(0, high, tuple(shape), generator=generator, device=device).to(dtype)
        # Normal values at a scale drawn from the seed too (2^-6 .. 2^6: finite in every float
        # dtype), so that neither the values nor their magnitude are a fixed signature.
        scale = 2.0 ** ((self.seed % 13) - 6)
        draw = torch.randn(tuple(shape), generator=generator, dtype=torch.float32, device=device)
        return draw.mul_(scale).to(dtype)

    def describe(self) -> str:
        return {"nan": "NaN", "random": "random values", "zeros": "zeros", "untouched": "untouched memory"}[self.kind]


def allocate_outputs(
    op: OpFamily, spec: OpSpec, device: torch.device | str, prefill: Prefill | None = None
) -> list[torch.Tensor]:
    """Fresh output buffers for ``spec``, pre-filled by ``prefill`` (default: a secret choice)."""
    prefill = prefill or Prefill.secret()
    outputs = []
    for t in op.output_specs(spec):
        filled = prefill.values(t.shape, t.torch_dtype, device)
        outputs.append(torch.empty(t.shape, dtype=t.torch_dtype, device=device) if filled is None else filled)
    return outputs


def prefill_(tensors: Iterable[torch.Tensor]) -> None:
    """Refill output buffers in place, each set the same secret way (the timing loop's rule 5
    refill between its halves: the kernel must write them again, whatever they held)."""
    prefill = Prefill.secret(REFILLS)
    for t in tensors:
        values = prefill.values(t.shape, t.dtype, t.device)
        assert values is not None  # REFILLS has no untouched memory
        t.copy_(values)


def _prefill_pair() -> tuple[Prefill, Prefill]:
    """The pre-fills of a run and of its rule 9 repeat, in secret order: one is always fresh
    random values, the other any kind. A kernel that reads its output cannot launder both to the
    same value (NaN and zeros can be: ``where(y != y, 0, y)``), and an element it never writes
    cannot hold the right answer in the random one."""
    pair = (Prefill.secret(("random",)), Prefill.secret())
    return pair if secrets.randbits(1) else (pair[1], pair[0])


def _rerun_problem(
    first: torch.Tensor, second: torch.Tensor, fills: tuple[Prefill, Prefill]
) -> str | None:
    """Rule 9 (and 1): None when two runs on differently pre-filled buffers agree bit for bit,
    else what differs: elements never written, or a race or a read of the buffer's old contents.

    An element never written holds its pre-fill in *every* run whose pre-fill is known (one run
    is always random values); a written one can equal the random pre-fill by chance (a few in a
    million bfloat16 elements). So "never written" is said only when every differing element
    holds the pre-fills: a kernel that writes everything but mixes in what the buffer held
    (rules 9 and 12) differs in written elements too, and is named for that.
    """
    differ = _bits(first) != _bits(second)
    if not bool(differ.any()):
        return None
    held = torch.ones_like(differ)
    for out, fill in zip((first, second), fills, strict=True):
        values = fill.values(out.shape, out.dtype, out.device)
        if values is not None:
            held &= _bits(out) == _bits(values)
    differing = int(differ.sum())
    never_written = int((held & differ).sum())
    if never_written == differing:
        return f"{never_written} elements were never written (they still hold the harness's pre-fill)"
    return (
        f"two runs on outputs pre-filled with {fills[0].describe()} and {fills[1].describe()} differ "
        f"bit for bit in {differing} elements: the kernel reads uninitialized memory or races"
        + (f" ({never_written} of them still hold the pre-fills: never written)" if never_written else "")
    )


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a tensor, so NaN == NaN and -0.0 != 0.0 in comparisons."""
    view_dtype = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(view_dtype)


def _canary_problem(
    op: OpFamily,
    spec: OpSpec,
    inputs: Sequence[torch.Tensor],
    ref64: torch.Tensor,
    lowp: torch.Tensor,
    floor: ErrorFloor = NO_FLOOR,
) -> str | None:
    """Rule 3: a zero, constant or identity output must fail the tolerance on this data (the
    tolerance a candidate is held to: with the family's error ``floor`` for this output).

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
        # (made in float64 and rounded: a mean past the dtype's range, spikes times a weight in
        # float16, is an infinity there, not an error)
        "constant": torch.full_like(lowp, float(finite.mean()), dtype=torch.float64).to(lowp.dtype),
    }
    if inputs and inputs[0].shape == lowp.shape:
        canaries["identity"] = inputs[0].to(lowp.dtype)
    pytorch_error = float((lowp.double() - ref64).abs().nan_to_num(0.0).max())
    for name, canary in canaries.items():
        if name == "identity" and float((canary.double() - ref64).abs().nan_to_num(0.0).max()) <= pytorch_error:
            continue  # the op *is* the identity here (a bias gradient over one row is dy): no wrong answer
        if errors.check_close(canary, ref64, lowp, op.tolerance, floor) is None:
            return f"the tolerance cannot tell a {name} output from the right one on this data"
    return None


def expected_inputs(op: OpFamily | None, spec: OpSpec | None, before: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Rule 2: every input's state after a correct call, from clones ``before`` of the state before it.

    An input is expected unchanged (its clone), except those the *family* declares written
    (:meth:`OpFamily.written_inputs`), whose state is the family's :meth:`OpFamily.reference_written`.
    Asked of the family in the worker before the candidate runs: nothing a candidate does can
    widen the declaration or change the expectation of its own call.
    """
    expected = list(before)
    if op is None or spec is None:
        return expected
    written = op.written_inputs(spec)
    if written:
        states = op.reference_written(spec, before)
        if len(states) != len(written):
            raise ValueError(f"{op.name}: reference_written gave {len(states)} tensors for inputs {written}")
        for i, state in zip(written, states, strict=True):
            expected[i] = state
    return expected


def input_problem(
    inputs: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], written: Sequence[int] = ()
) -> tuple[str, str] | None:
    """None when every input is bit for bit in its expected state, else (failure kind, message).

    An input the op does not write that changed is a "cheat" (rule 2), checked first; a written
    one left in the wrong state is a wrong answer ("validate"): a row stored elsewhere or wrongly,
    or one the op must write left stale.
    """
    order = [i for i in range(len(inputs)) if i not in written] + [i for i in written]
    for i in order:
        t, want = inputs[i], expected[i]
        if torch.equal(_bits(t), _bits(want)):
            continue
        if i not in written:
            return "cheat", f"the candidate modified its inputs (input {i}, which the op does not write)"
        wrong = int((_bits(t) != _bits(want)).sum())
        return "validate", (f"the candidate left input {i}, which the op writes, wrong in {wrong} elements "
                            "(a row written elsewhere or wrongly, or one it must write left stale)")  # fmt: skip
    return None


def run_checked(
    launcher: Launcher,
    inputs: Sequence[torch.Tensor],
    outputs: Sequence[torch.Tensor],
    synchronize: Callable[[], None],
    op: OpFamily | None = None,
    spec: OpSpec | None = None,
    library_ops: frozenset[str] = frozenset(),
) -> None:
    """One candidate call under the rule 2, 6, 7 and 10 checks; raises Rejected.

    ``library_ops``: the aten ops rule 7 allows besides views and allocations, a built-in
    variant's :attr:`~kernelsmith.ops._base.Variant.library_ops` (never a kernel file's: empty).

    With ``op`` and ``spec``, the inputs the family declares written must be left in the state its
    :meth:`~OpFamily.reference_written` gives from their state before *this* call (so a repeated
    call on the same inputs is checked against the same state, the write being idempotent);
    without them, or for a family that writes nothing, every input must be left unchanged.
    A wrong written input is a "validate" failure (a wrong answer), any other change a "cheat".
    """
    written = op.written_inputs(spec) if op is not None and spec is not None else ()
    clones = expected_inputs(op, spec, [t.clone() for t in inputs])
    snapshots = [_Snapshot.of(t) for t in outputs]
    threads_before = threading.active_count()
    starts_before = _ThreadStarts.count
    watch = TorchOpWatch(library_ops)
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
    changed = input_problem(inputs, clones, written)
    if changed:
        raise Rejected(*changed)
    for t, snap in zip(outputs, snapshots, strict=True):
        problem = snap.problem(t)
        if problem:
            raise Rejected("cheat", problem)


def _distribution_orders(own: list[str], stress: list[str], n_specs: int) -> list[list[str]]:
    """The distributions each validation shape is checked on, in order (rule 4).

    The target shape: every one of the family's own distributions. A tail shape: one, taken in
    turn, the stress data first (it is a property of rows, and tails have the target's row
    width, so a small tail shows it as well as the target and costs less), then the next ones
    until each output has been checked on data that tells the canaries apart (rule 3). Stress
    data no tail takes (too few tails) is checked on the target too.
    """
    tails = n_specs - 1
    rotation = stress + own
    orders = [own + stress[tails:]]
    for i in range(tails):
        start = i % len(rotation)
        orders.append(rotation[start:] + rotation[:start])
    return orders


def validate(
    op: OpFamily,
    spec: OpSpec,
    build: Callable[[OpSpec, Any], Launcher],
    config: Any,
    device: torch.device | str,
    synchronize: Callable[[], None],
    library_ops: frozenset[str] = frozenset(),
) -> int:
    """Check a candidate on the target shape and tail shapes; returns the number of runs.

    Raises Rejected with kind "validate" for wrong results and "cheat" for harness abuse.
    ``library_ops``: a built-in variant's declared aten ops (:func:`run_checked`).
    """
    runs = 0
    specs = op.validation_specs(spec)
    orders = _distribution_orders(list(op.distributions), list(op.stress_distributions), len(specs))
    for index, vspec in enumerate(specs):
        launcher = build(vspec, config)
        order = orders[index]
        told: set[int] = set()  # outputs checked on data that tells the canaries apart
        blind: dict[int, list[str]] = {}  # output index -> why a distribution could not tell
        for distribution in order:
            seed = secrets.randbits(62)  # rule 4: fresh and secret on every evaluation
            inputs = op.validation_inputs(vspec, seed, distribution, device)
            # Both runs' outputs are allocated before the references are computed, so untouched
            # memory cannot be a block the references just freed (it could hold the answer).
            fills = _prefill_pair()
            first, second = (allocate_outputs(op, vspec, device, fill) for fill in fills)
            pristine = [t.clone() for t in inputs]
            # (with rule 8's floor for the op's condition on this draw: the family's, from the
            # inputs and the float64 references, before the candidate runs)
            refs = errors.references(op, vspec, pristine)
            refs64, lowps, floors = refs.fp64, refs.lowp, refs.floors
            # (a family that writes inputs writes the same rows again in the second run: the call is
            # idempotent there, and each run is checked against the state its own start implies)
            run_checked(launcher, inputs, first, synchronize, op, vspec, library_ops)
            run_checked(launcher, inputs, second, synchronize, op, vspec, library_ops)
            where = f"{vspec.describe()} ({distribution} inputs)"
            for k, (out, out2) in enumerate(zip(first, second, strict=True)):
                problem = _rerun_problem(out, out2, fills)
                if problem:
                    raise Rejected("validate", f"output {k} wrong on {where}: {problem}")
            for k, (out, ref64, lowp, floor) in enumerate(zip(first, refs64, lowps, floors, strict=True)):
                canary = _canary_problem(op, vspec, pristine, ref64, lowp, floor)
                if canary:
                    blind.setdefault(k, []).append(f"{canary} ({distribution})")
                else:
                    told.add(k)
                reason = errors.check_close(out, ref64, lowp, op.tolerance, floor)
                if reason:
                    raise Rejected("validate", f"output {k} wrong on {where}: {reason}")
            runs += 2
            if index > 0 and len(told) == len(first):
                break
        for k, why in blind.items():
            if k not in told:
                raise Rejected("validate", f"harness: output {k} of {vspec.describe()}: {'; '.join(why)}")
    return runs
