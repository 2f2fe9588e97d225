"""Where evaluations run: the local pool of one host, or a Ray cluster.

The tuner needs six things of whatever runs its candidates (:class:`Executor`): evaluate a
batch, submit one, evaluate several together (timed interleaved), confirm a winner in fresh
workers, measure the copy ceiling, close. Two executors provide them:

- ``"local"``: :class:`kernelsmith.evaluate.pool.Evaluator`, worker processes on this host,
  pinned to every chosen GPU (``devices``);
- ``"ray"``: :class:`kernelsmith.evaluate.ray_executor.RayExecutor`, Ray actors holding one GPU
  each, every actor running the same sandboxed worker process on its node.

Either way the harness runs in the worker, the decisions are made here, and what crosses the
boundary is data: the candidate's source and config out, records and failures back.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Protocol

from kernelsmith.evaluate.confirm import Confirmation
from kernelsmith.evaluate.protocol import Candidate, CeilingResult, EvalResult, TimingSettings
from kernelsmith.exceptions import KernelsmithError
from kernelsmith.spec import OpSpec

EXECUTORS = ("local", "ray")


class ExecutorUnavailable(KernelsmithError, RuntimeError):
    """The executor asked for cannot run here (an unreachable Ray address, say): one line,
    raised before any tuning starts."""


class Executor(Protocol):
    """What the tuner uses of an evaluator; ``n_workers`` is how many candidates it keeps in
    flight."""

    mode: str
    n_workers: int

    def evaluate(
        self, spec: OpSpec, candidates: Sequence[Candidate], timing: TimingSettings | None = None, measure: bool = True
    ) -> list[EvalResult]: ...

    def submit(
        self, spec: OpSpec, candidate: Candidate, timing: TimingSettings | None = None, measure: bool = True
    ) -> Future[EvalResult]: ...

    def evaluate_together(
        self, spec: OpSpec, candidates: Sequence[Candidate], timing: TimingSettings | None = None
    ) -> list[EvalResult]: ...

    def confirm(
        self,
        spec: OpSpec,
        candidates: Sequence[Candidate],
        timing: TimingSettings | None = None,
        copy_gbps: float | None = None,
    ) -> Confirmation: ...

    def measure_ceiling(self) -> CeilingResult: ...

    def close(self) -> None: ...

    def __enter__(self) -> Executor: ...

    def __exit__(self, *exc: object) -> None: ...


def check_executor(executor: str, ray_address: str | None = None) -> None:
    """Fail early, in one line: an unknown executor, Ray missing, or a Ray address that does not
    answer. Called before the database is written or any worker starts."""
    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}, not {executor!r}")
    if executor == "ray":
        from kernelsmith.evaluate.ray_executor import connect

        connect(ray_address)
    elif ray_address:
        raise ValueError("a Ray address needs executor='ray' (--executor ray)")


def make_executor(
    mode: str,
    workers: int | None = None,
    *,
    devices: Sequence[int | str] | str | None = None,
    executor: str = "local",
    ray_address: str | None = None,
) -> Executor:
    """The executor named by ``executor`` for ``mode``; ``devices`` applies to the local pool
    (on Ray, the cluster's scheduler gives each actor its GPU)."""
    check_executor(executor, ray_address)
    if executor == "ray":
        if devices is not None:
            raise ValueError("devices applies to the local executor; on Ray each actor is given its GPU")
        from kernelsmith.evaluate.ray_executor import RayExecutor

        return RayExecutor(mode, workers, address=ray_address)
    from kernelsmith.evaluate.pool import Evaluator

    return Evaluator(mode, workers, devices=devices)
