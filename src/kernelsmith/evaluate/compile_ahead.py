"""Compiling the search's next candidates while the workers are busy (issue 19: search cost).

A worker compiles a candidate on its first launch (Triton compiles once per specialization),
then validates and times it under the device lock. The search keeps one candidate in flight per
worker, so a candidate proposed beyond that waits for a worker doing nothing. With compile-ahead
(:class:`CompileAhead`, switched by ``KERNELSMITH_COMPILE_AHEAD``) such a waiting candidate is
compiled here, in the tuning process, in a few background threads, while the workers validate
and time the ones before it. The workers share Triton's on-disk cache with this process
(:func:`kernelsmith.evaluate.pool.user_triton_cache`), so when the candidate reaches its worker,
the first launch loads a ready binary instead of compiling.

How it compiles: with Triton's own ahead-of-time path, the JIT's ``run(..., warmup=True)``,
which compiles (and fills the on-disk cache) without launching. A family's launcher is a plain
callable that ends in ``kernel[grid](...)``; :func:`compile_variant` calls it on meta tensors (the
workload's shapes, dtypes and strides, no memory; a meta tensor's address is 0, 16-byte aligned
like the device's allocations, and a view keeps its offset), built so that each of their launches
is a warmup (:class:`WarmupLaunch`, through the launch seam every family uses; Triton itself is not
patched). Nothing runs on the device and no device memory is taken, and no module is loaded (a
warmup never reads a compiled kernel's launch handle), so compiling here never overlaps a timing
measurement's use of the GPU; only the worker's first launch loads the module, as before.
(Triton's ``run`` still asks the driver for the current device and stream, which initializes
CUDA in the tuning process where nothing had yet.)

The trust boundary: only built-in variants, kernelsmith's own code, are built here. A kernel
file (an agent's or an LLM's source) is never built in this process; it goes to its worker,
where it is compiled as before (docs/kernel-files.md).

Failures: a Triton compile error (``CompilationError`` and its kinds, ``PTXASError``) does not
depend on the process that compiles, so it is the candidate's "build" failure, recorded with
the message a worker would have written, and the candidate is not sent to a worker. Anything
else (a launcher that cannot run on meta tensors, say) is not the candidate's fault: it is logged
and the candidate goes to its worker as if it had not been compiled ahead (the worker compiles it).
A specialization this process got differently from the worker costs only time: a cache miss.

What compile-ahead did is :meth:`CompileAhead.report`, which the search logs and stores in its
decision's metrics (``compile_ahead``), so a GPU run with the setting on and off shows the saving.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from kernelsmith.evaluate.protocol import Candidate, EvalResult
from kernelsmith.ops._base import OpFamily
from kernelsmith.ops._launch import launches_through
from kernelsmith.spec import OpSpec

log = logging.getLogger(__name__)

# How many candidates beyond the workers' the search proposes and compiles ahead, and how many
# threads compile them. A deeper queue makes an adaptive strategy propose with fewer results.
COMPILE_AHEAD_DEPTH = 4
COMPILE_AHEAD_THREADS = 4

# Exceptions (by class name, anywhere in the class's bases) that mean Triton could not compile the
# kernel: the candidate's own failure, as the worker's classification of a "build" failure.
COMPILE_ERRORS = frozenset({"CompilationError", "PTXASError"})

# What compiling one candidate ahead came to (:attr:`Ahead.status`).
COMPILED = "compiled"
FAILED = "failed"  # a compile error: the candidate's "build" failure
NOT_COMPILED = "not-compiled"  # not compiled here (a kernel file, or not compilable here): its worker compiles it

CompileFn = Callable[[OpFamily, OpSpec, Candidate], None]


@dataclass(frozen=True)
class Ahead:
    """The outcome of compiling one candidate ahead; ``error`` says why it failed or was not compiled."""

    candidate: Candidate
    status: str
    seconds: float = 0.0
    error: str = ""


# ---- Triton launches that only compile ----------------------------------------------------------
class WarmupLaunch:
    """What a launcher built by :func:`compile_variant` calls instead of a launch: Triton's
    ``kernel.run(..., grid=grid, warmup=True)``, which compiles the specialization of these
    arguments (and fills the on-disk cache) and launches nothing. Given to the launchers through
    :func:`kernelsmith.ops._launch.launches_through`, the seam every family's launch goes through,
    so Triton itself is never patched and no other launch, on any thread, is touched."""

    def __init__(self, kernel: Any, grid: Any) -> None:
        self.kernel, self.grid = kernel, grid

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.kernel.run(*args, grid=self.grid, warmup=True, **kwargs)


def compile_variant(family: OpFamily, spec: OpSpec, candidate: Candidate) -> None:
    """Compile a built-in variant's candidate for every shape its worker validates and times
    (the workload and its tail shapes, as the worker's ``_compile``), launching nothing.

    The launchers are built so that each of their launches is a :class:`WarmupLaunch`: a direct
    launcher (:mod:`kernelsmith.ops._launch`) would read the compiled kernel's launch handle,
    which loads the module onto the device, here, in the tuning process.
    """
    variant = family.variant(candidate.variant)
    for vspec in family.validation_specs(spec):
        with launches_through(WarmupLaunch):
            launcher = variant.build(vspec, candidate.config)
        inputs = [torch.empty_strided(t.shape, t.strides, dtype=t.torch_dtype, device="meta") for t in vspec.inputs]
        outputs = [torch.empty(t.shape, dtype=t.torch_dtype, device="meta") for t in family.output_specs(vspec)]
        launcher(inputs, outputs)


def _is_compile_error(exc: BaseException) -> bool:
    return any(kind.__name__ in COMPILE_ERRORS for kind in type(exc).__mro__)


# ---- the compiler of one search ----------------------------------------------------------------
class CompileAhead:
    """Compiles one search's waiting candidates in background threads (module docstring).

    ``compile_fn`` is the seam tests replace (default :func:`compile_variant`); it is never
    called for a candidate with source (a kernel file). :meth:`start` returns the future of an
    :class:`Ahead`, which never raises.
    """

    def __init__(
        self,
        family: OpFamily,
        spec: OpSpec,
        compile_fn: CompileFn = compile_variant,
        threads: int = COMPILE_AHEAD_THREADS,
        depth: int = COMPILE_AHEAD_DEPTH,
    ) -> None:
        self.family, self.spec, self.compile_fn, self.depth = family, spec, compile_fn, depth
        self._threads = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kernelsmith-compile-ahead")
        self._lock = threading.Lock()
        self.outcomes: list[Ahead] = []
        self.waited_s = 0.0  # the search waited this long for a compile here while a worker was free
        self.sent_uncompiled = 0  # waiting candidates a worker took before their compile here started

    def start(self, candidate: Candidate) -> Future[Ahead]:
        if candidate.source:  # untrusted source is built only in a worker (the trust boundary)
            future: Future[Ahead] = Future()
            future.set_result(self._keep(Ahead(candidate, NOT_COMPILED, error="a kernel file: built in its worker")))
            return future
        return self._threads.submit(self._compile, candidate)

    def _compile(self, candidate: Candidate) -> Ahead:
        started = time.perf_counter()
        try:
            self.compile_fn(self.family, self.spec, candidate)
            status, error = COMPILED, ""
        except Exception as exc:
            error = f"{type(exc).__name__}: {str(exc)[:2000]}"  # the form of a worker's failure message
            if _is_compile_error(exc):
                status = FAILED
            else:  # not the candidate's fault: its worker compiles it, as without compile-ahead
                status = NOT_COMPILED
                log.debug("%s not compiled ahead: %s", candidate.key, error)
        return self._keep(Ahead(candidate, status, time.perf_counter() - started, error))

    def _keep(self, outcome: Ahead) -> Ahead:
        with self._lock:
            self.outcomes.append(outcome)
        return outcome

    @staticmethod
    def failure(outcome: Ahead, source_hash: str) -> EvalResult:
        """A candidate that failed to compile here, as the "build" failure its worker would report."""
        return EvalResult(outcome.candidate, "build", outcome.error, source_hash=source_hash, seconds=outcome.seconds)

    def report(self) -> dict[str, Any]:
        """What compile-ahead did: how many candidates it compiled, failed or left to their worker,
        the seconds it compiled here (off the timing path) and the seconds the search waited for
        it with a worker free (on the timing path)."""
        with self._lock:
            outcomes = list(self.outcomes)
        count = {status: sum(o.status == status for o in outcomes) for status in (COMPILED, FAILED, NOT_COMPILED)}
        return {
            "compiled": count[COMPILED],
            "failed": count[FAILED],
            "not_compiled": count[NOT_COMPILED],
            "sent_uncompiled": self.sent_uncompiled,
            "ahead_s": round(sum(o.seconds for o in outcomes), 3),
            "waited_s": round(self.waited_s, 3),
        }

    def close(self) -> None:
        """Cancel compiles not started, wait for those running (seconds at most)."""
        self._threads.shutdown(wait=True, cancel_futures=True)
