"""Checks where the kernel serves (DESIGN.md rule 12): a kept kernel is compared, in the user's
own process and on the user's real inputs, with a result kernelsmith trusts.

Validation runs in a worker, and a kernel that can tell the worker from a user's process (its
output buffers, the data it sees, the time) could be right there and wrong here. So every
served kernel — a decorated function's entry, and each call key of the ``kernelsmith::kernel``
op the compile backend emits — has a :class:`ServeCheck`: its first ``first`` calls (default 3)
are compared, then a sampled fraction ``rate`` of later ones (default 1 in 1000), drawn with
secret randomness, so a kernel cannot count its way past the checks.

What a checked call compares with (the choice the design asks to justify): the harness's own
rule (:func:`kernelsmith.evaluate.errors.check_close`, DESIGN.md rule 8), ``err(kernel, fp64) <=
k * err(trusted, fp64) + floor``, with the family's float64 reference and error floors
(:func:`kernelsmith.evaluate.errors.references`, as validation's) computed from clones of the
call's inputs taken before anything runs, and the *trusted* result (the user's function for the
decorator, the family's PyTorch reference for the op) in the place of PyTorch's low-precision
answer: a draw is judged as validation would judge it, so a kernel validation accepted is not
switched off here by an ill-conditioned draw. Comparing with the trusted result alone would
need a tolerance without knowing how far that result itself is from the truth, which is either
too tight (a different summation order fails) or too loose. The
float64 reference is affordable: the front door already computed one for the same shapes in
this process when it adopted the runner (so it fits in memory), and after the first calls it
runs on one call in a thousand. If it cannot be computed (memory), the call is not judged: it
returns the trusted result, and the next call is checked instead.

A checked call costs a clone of the inputs (a kernel that writes to them is caught, and they
are restored), the trusted result, the float64 reference and a device synchronization. It is
never made while a CUDA graph is being captured or while torch.compile traces (the check would
synchronize, or be traced into the graph): such a call runs the kernel and the check stays due.

A failed check disables the kernel for the workload in this process (front doors then run the
user's function or the reference; :func:`disabled` tells :func:`kernelsmith.dispatch.build_runner`
to refuse it), records why in the database as a trial with status ``"serve-check"``, logs one
warning, and the failing call returns the trusted result, so the user never sees the wrong one.

Configuration: ``KERNELSMITH_CHECK=0`` turns checking off (for a hot path that has been checked
enough); ``KERNELSMITH_CHECK_RATE=0.01`` sets the sampled fraction; ``KERNELSMITH_CHECK_FIRST=3``
the number of first calls compared; ``kernelsmith.optimize(check=...)`` overrides the
environment for one function (False, True, or a rate). They are read when a kernel starts to be
served, not on every call.
"""

from __future__ import annotations

import logging
import math
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kernelsmith import settings
from kernelsmith.db import TrialRecord, current_fingerprint, open_database
from kernelsmith.evaluate.errors import References
from kernelsmith.ops import OpFamily
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec

log = logging.getLogger(__name__)

SERVE_CHECK = "serve-check"  # the status of the trial a failed check records
DEFAULT_FIRST: int = settings.setting("KERNELSMITH_CHECK_FIRST").default
DEFAULT_RATE: float = settings.setting("KERNELSMITH_CHECK_RATE").default
_SECRET = random.SystemRandom()  # the operating system's randomness: no seed a kernel could know


@dataclass(frozen=True)
class CheckPolicy:
    """Which calls of a served kernel are checked: the first ``first``, then a ``rate`` sample."""

    enabled: bool = True
    first: int = DEFAULT_FIRST
    rate: float = DEFAULT_RATE

    @classmethod
    def resolve(cls, check: bool | float | None = None) -> CheckPolicy:
        """The policy for ``check`` (an ``optimize(check=...)`` argument) over the environment:
        None reads ``KERNELSMITH_CHECK`` / ``_RATE`` / ``_FIRST``; False turns checking off;
        True keeps the environment's rate; a number in [0, 1] is the rate."""
        enabled = bool(settings.get("KERNELSMITH_CHECK"))
        rate = float(settings.get("KERNELSMITH_CHECK_RATE"))
        first = int(settings.get("KERNELSMITH_CHECK_FIRST"))
        if isinstance(check, bool):
            enabled = check
        elif check is not None:
            enabled, rate = True, float(check)
        if not 0.0 <= rate <= 1.0 or first < 0:
            raise ValueError(f"kernelsmith checks: a rate in [0, 1] and a first count >= 0, not {rate} and {first}")
        return cls(enabled, first, rate)


def _capturing_or_tracing() -> bool:
    """Whether a check now would synchronize inside a CUDA graph capture or be traced."""
    if torch.compiler.is_compiling():
        return True
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


# ---- kernels disabled in this process -----------------------------------------------------------
# (workload hash of the bucket, variant, source hash, config key) -> why
_DISABLED: dict[tuple[str, str, str, str], str] = {}


def _identity(family: OpFamily, spec: OpSpec, runner: Any) -> tuple[str, str, str, str]:
    return family.bucket(spec).workload_hash, runner.variant, runner.source_hash, Config(runner.config).key


def disabled(workload: str, variant: str, source_hash: str, config: dict[str, Any]) -> str | None:
    """Why this kernel is disabled for ``workload`` in this process (a failed serve check), or None."""
    return _DISABLED.get((workload, variant, source_hash, Config(config).key))


class ServeCheck:
    """The checks of one served kernel for one call key in this process.

    The caller's hot path is ``check.countdown -= 1`` and, when it reaches 0, ``check.due()``;
    :meth:`run` then makes the checked call. ``where`` names the front door in the records.
    """

    def __init__(
        self,
        policy: CheckPolicy,
        where: str,
        mode: str,
        db: Any = None,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        self.policy, self.where, self.mode, self.db, self.on_failure = policy, where, mode, db, on_failure
        self.countdown = 1 if policy.first > 0 else self._gap()
        self.checked = 0  # calls compared and found right
        self.failure: str | None = None

    def _gap(self) -> int:
        """Calls until the next sampled check: geometric with mean 1/rate, from secret randomness."""
        rate = self.policy.rate
        if rate <= 0.0:
            return sys.maxsize
        if rate >= 1.0:
            return 1
        return 1 + int(math.log(1.0 - _SECRET.random()) / math.log1p(-rate))

    def _schedule(self) -> None:
        self.countdown = 1 if self.checked < self.policy.first else self._gap()

    def due(self) -> bool:
        """Whether the call whose countdown reached 0 is checked now; not while a CUDA graph is
        captured or torch.compile traces (the countdown stays at 0: the next call is due)."""
        return self.failure is None and not _capturing_or_tracing()

    def run(
        self,
        family: OpFamily,
        spec: OpSpec,
        runner: Any,
        inputs: Sequence[torch.Tensor],
        trusted: Callable[[], Sequence[torch.Tensor]],
        reference64: Callable[[Sequence[torch.Tensor]], References],
        kernel: Callable[[], Sequence[torch.Tensor]],
    ) -> tuple[Sequence[torch.Tensor], bool]:
        """One checked call: (the results to return, whether they are the kernel's).

        ``trusted()`` computes the result kernelsmith trusts (it runs first, on the inputs as
        given; an exception from it is the caller's own and propagates), ``reference64(clones)``
        the float64 references and the family's floors from clones of the inputs taken before
        (:func:`kernelsmith.evaluate.errors.references` with ``lowp=False``), ``kernel()`` the
        served kernel's outputs; only the first ``len(trusted())`` outputs are compared.
        """
        clones = [t.detach().clone() for t in inputs]
        expected = list(trusted())
        try:
            refs = reference64(clones)
        except Exception as exc:  # memory, most likely: this call is not judged, the next one is
            log.info("%s: a serve check of %s could not run (%s: %s)", self.where, family.name, type(exc).__name__, exc)
            return expected, False
        try:
            outputs = list(kernel())
            problem = _inputs_changed(inputs, clones) or _not_close(outputs, refs, expected, family)
        except Exception as exc:  # a served kernel that raises is wrong, and must not break the call
            problem = f"{type(exc).__name__}: {exc}"
        if problem is None:
            self.checked += 1
            self._schedule()
            return outputs, True
        self._fail(family, spec, runner, problem)
        return expected, False

    def _fail(self, family: OpFamily, spec: OpSpec, runner: Any, problem: str) -> None:
        self.failure = problem
        identity = _identity(family, spec, runner)
        _DISABLED[identity] = problem
        log.warning(
            "%s: the kept %s kernel %s (%s) gave a wrong answer on %s, after %d right calls, and is disabled "
            "in this process (the trusted result was returned): %s",
            self.where, family.name, runner.variant, identity[3] or "default config", spec.describe(), self.checked,
            problem,
        )
        _record(family, spec, runner, problem, self.where, self.mode, self.db, identity[0])
        if self.on_failure is not None:
            self.on_failure(problem)


def _inputs_changed(inputs: Sequence[torch.Tensor], clones: Sequence[torch.Tensor]) -> str | None:
    """None when the kernel left its inputs as they were; else restores them and says so."""
    changed = [i for i, (t, c) in enumerate(zip(inputs, clones, strict=True)) if not torch.equal(_bits(t), _bits(c))]
    for i in changed:
        with torch.no_grad():
            inputs[i].copy_(clones[i])
    return f"the kernel modified its inputs {changed} (restored)" if changed else None


def _bits(t: torch.Tensor) -> torch.Tensor:
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.detach().contiguous().view(view)


def _not_close(
    outputs: Sequence[torch.Tensor], refs: References, expected: Sequence[torch.Tensor], family: OpFamily
) -> str | None:
    n = len(expected)  # the decorator trusts one output (the function's), the op all of them
    if len(outputs) < n:
        return f"the kernel gave {len(outputs)} outputs, the trusted result {n}"
    for k, (out, trusted) in enumerate(zip(outputs[:n], expected, strict=True)):
        if out.dtype != trusted.dtype:
            return f"output {k} is {out.dtype}, the trusted result {trusted.dtype}"
    return refs.problem(outputs[:n], family.tolerance, expected)


def _record(
    family: OpFamily, spec: OpSpec, runner: Any, problem: str, where: str, mode: str, db: Any, workload: str
) -> None:
    """The failure as a trial of the kept candidate (status "serve-check"), so that a later tuning
    of the workload counts it as failed and a person sees why (``kernelsmith report``)."""
    try:
        fingerprint = current_fingerprint(mode)
        with open_database(db) as database:
            database.put_fingerprint(fingerprint)
            database.add_trial(
                TrialRecord(
                    fingerprint=fingerprint.hash,
                    workload=workload,
                    op=family.name,
                    variant=runner.variant,
                    source_hash=runner.source_hash,
                    config=dict(runner.config),
                    status=SERVE_CHECK,
                    error=f"{where}, on {spec.describe()}: {problem}"[:2000],
                    metrics={"served_by": where, "call": spec.describe()},
                )
            )
    except Exception as exc:  # the database is a cache: a record lost is a warning, not an error
        log.warning("could not record the failed serve check of %s in the database: %s", family.name, exc)
