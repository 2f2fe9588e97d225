"""Loading candidates in the worker, and the device lock its GPU work runs under.

Part of the worker (:mod:`kernelsmith.evaluate.worker`). A candidate is one of the op family's
built-in variants or the text of a kernel file, whose Python never runs here
(docs/kernel-files.md): :func:`_load` gives its ``build`` and source hash once its config is in
its space, and :func:`_classify` tells a build failure from a runtime one (and from one that may
have left the process in a bad state). :func:`_gpu_lock` serializes device work across the
workers that share a GPU; :func:`_compile` compiles a candidate outside it, except for workloads
too large to hold beside other workers' (:func:`compile_needs_lock`). A candidate loaded,
compiled and validated is a :class:`_Loaded`, which :mod:`~kernelsmith.evaluate._worker_timing`
times.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from kernelsmith.evaluate.device_lock import device_lock
from kernelsmith.evaluate.kernel_file import KernelFileError, check_kernel_file, parse_kernel_file
from kernelsmith.evaluate.protocol import Candidate
from kernelsmith.evaluate.validate import Rejected, allocate_outputs, run_checked
from kernelsmith.ops._base import Launcher, OpFamily
from kernelsmith.space import Space
from kernelsmith.spec import OpSpec


@dataclass
class _Loaded:
    """A candidate that loaded, compiled and passed validation: what
    :func:`~kernelsmith.evaluate._worker_timing._time` times."""

    candidate: Candidate
    build: Callable[[OpSpec, Any], Launcher]
    launcher: Launcher
    source_hash: str
    started: float
    validate_s: float  # loading, compiling and validating


# ---- loading candidates ------------------------------------------------------------------------
def _load_source(source: str) -> tuple[Callable[..., Launcher], Callable[[OpSpec], Space], str]:
    """``build``, ``space`` and source hash of candidate source, which must be a kernel file.

    There is no other form: a candidate's own Python never runs here (docs/kernel-files.md). A
    file that fails the gate is a "cheat" whose message lists what is wrong and what is allowed;
    one that passes but will not load (Triton refuses a function) is a "build" failure.
    """
    try:
        compile(source, "<candidate>", "exec")  # compiled only, never run: to tell typos from the gate
    except (SyntaxError, ValueError) as exc:
        raise Rejected("build", f"syntax error in candidate source: {exc}") from exc
    problems = check_kernel_file(source)
    if problems:
        raise Rejected("cheat", "kernel file: " + "; ".join(problems[:6]))
    try:
        kernel_file = parse_kernel_file(source)
    except KernelFileError as exc:
        raise Rejected("build", f"kernel file: {exc}") from exc
    return kernel_file.build, kernel_file.space, kernel_file.source_hash


def library_ops_of(op: OpFamily, candidate: Candidate) -> frozenset[str]:
    """Rule 7's allowance for ``candidate``: its built-in variant's declared library ops; none for
    a kernel file, whatever variant name it carries (its launcher is generated from the file)."""
    return frozenset() if candidate.source else op.variant(candidate.variant).library_ops


def _load(
    op: OpFamily, spec: OpSpec, candidate: Candidate, static_gate: object = None
) -> tuple[Callable[..., Launcher], str]:
    """``build`` and source hash of a candidate whose config is in its space. ``static_gate`` is
    ignored (a request can no longer turn the gate off) until the protocol drops the field."""
    if candidate.source:
        build, space_fn, source_hash = _load_source(candidate.source)
    else:
        variant = op.variant(candidate.variant)
        build, space_fn, source_hash = variant.build, variant.space, variant.source_hash
    try:
        problems = space_fn(spec).violations(candidate.config)
        if candidate.source and not problems:
            build(spec, candidate.config)  # launch expressions that fail for this workload: a build failure
    except KernelFileError as exc:
        raise Rejected("build", f"kernel file: {exc}") from exc
    if problems:
        raise Rejected(
            "build", f"config {candidate.config.key} is outside the variant's space: {'; '.join(problems)}"
        )
    return build, source_hash


def _classify(exc: BaseException) -> tuple[str, bool]:
    """Failure kind of an exception raised by candidate code, and whether to recycle."""
    name = type(exc).__name__
    text = str(exc)
    # InterpreterError is how the Triton interpreter reports what the compiler would reject.
    if (
        name in {"CompilationError", "OutOfResources", "PTXASError", "InterpreterError"}
        or "CompilationError" in text[:200]
    ):
        return "build", False
    cuda_fault = "CUDA error" in text or "illegal" in text.lower() or name == "AcceleratorError"
    return "runtime", cuda_fault


# ---- the device lock, and compiling outside it -------------------------------------------------
@contextlib.contextmanager
def _gpu_lock(path: str) -> Iterator[None]:
    """Serialize device work across workers that share one GPU (released if the holder dies).

    Validation (full-size float64 references) and timing hold it: one worker's validation running
    beside another's timing would distort the measurement, and several full-size validations at
    once can exhaust the device's memory. Compilation runs outside it, in parallel.
    """
    with device_lock(path):
        yield


# A workload whose tensors take more than this share of the device's memory is compiled under the
# device lock too: eight workers each holding a full-size set of zero inputs would not fit.
COMPILE_UNLOCKED_SHARE = 0.02


def _workload_bytes(op: OpFamily, spec: OpSpec) -> int:
    """Bytes of one full-size set of the workload's inputs and outputs."""
    tensors = (*spec.inputs, *op.output_specs(spec))
    return sum(t.numel * t.torch_dtype.itemsize for t in tensors)


def compile_needs_lock(nbytes: int, device_properties: Any) -> bool:
    """Whether compiling (one launch per validation shape on zero inputs) must hold the lock."""
    return nbytes > COMPILE_UNLOCKED_SHARE * int(device_properties.total_memory)


def _compile(
    op: OpFamily, spec: OpSpec, build: Callable[..., Launcher], config: Any, device: torch.device,
    synchronize: Callable[[], None], library_ops: frozenset[str] = frozenset(),
) -> None:
    """Compile a candidate for every shape validation will run, outside the device lock.

    Triton compiles on a kernel's first launch (once per specialization: a row count of 1, or
    one divisible by 16, is its own), so each validation shape is launched once on zero inputs,
    under the same call checks as any other candidate call. Only this brief launch touches the
    device outside the lock; the compilation itself runs on the host, in parallel across workers.
    """
    for vspec in op.validation_specs(spec):
        launcher = build(vspec, config)
        inputs = [torch.empty_strided(t.shape, t.strides, dtype=t.torch_dtype, device=device).zero_()
                  for t in vspec.inputs]
        run_checked(launcher, inputs, allocate_outputs(op, vspec, device), synchronize, op, vspec, library_ops)

