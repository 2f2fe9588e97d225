"""The worker's harness, run in this process on a Python launcher: trusted test code only.

Untrusted kernels are kernel files and never run host Python (docs/kernel-files.md), so the
run-time defenses behind the gate (rule 5's refill while timing, rule 6's side-stream check, the
thread and PyTorch watches of ``run_checked``) can no longer be reached by a candidate. They stay
in the harness, for the package's own variants and as depth behind the gate; tests keep them
covered by handing a cheating *Python* launcher, written in the test, to a
:class:`~kernelsmith.evaluate.worker.Worker` in their own process, as if it were one of the op
family's built-in variants. Never point this at text from outside the package.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from kernelsmith.evaluate.protocol import Candidate, EvalRequest, EvalResult, TimingSettings
from kernelsmith.ops import get_op
from kernelsmith.ops._base import Launcher, OpFamily, Variant
from kernelsmith.space import Config, Space
from kernelsmith.spec import OpSpec

VARIANT = "python_launcher"  # the name the launcher is evaluated under


@contextmanager
def _as_variant(family: OpFamily, build: Callable[[OpSpec, Config], Launcher]) -> Iterator[None]:
    """``family.variant(VARIANT)`` returns ``build`` as a variant with the empty config only."""
    variant = Variant(VARIANT, "a Python launcher written by a test", lambda spec: Space([]), build)
    original = family.variant
    family.variant = lambda name: variant if name == VARIANT else original(name)  # type: ignore[method-assign]
    try:
        yield
    finally:
        del family.variant  # the instance attribute: the class's method shows through again


def evaluate_launcher(
    spec: OpSpec, build: Callable[[OpSpec, Config], Launcher], mode: str = "interpreter",
    timing: TimingSettings | None = None,
) -> EvalResult:
    """Build, validate and time ``build``'s launchers with the worker's code, in this process."""
    from kernelsmith.evaluate.worker import Worker

    family = get_op(spec.op)
    settings = timing or (TimingSettings.interpreter() if mode == "interpreter" else TimingSettings())
    request = EvalRequest(spec.to_dict(), (Candidate(VARIANT, Config()),), mode, settings)
    with _as_variant(family, build):
        reply = Worker().handle(request)
    (result,) = reply.results
    return result  # type: ignore[no-any-return]
