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

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch

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


def in_validation() -> bool:
    """Whether the caller runs inside the worker's validation (its compile step or ``validate``).

    For launchers that cheat only after validation, to show the timing phase's own checks
    (rule 5's refill) catch them: they count on the run itself rather than on a number of
    validation calls, which changes with the validation data (and differs between the GPU,
    which launches once per shape to compile first, and the interpreter).
    """
    from kernelsmith.evaluate.validate import validate
    from kernelsmith.evaluate.worker import _compile

    codes = {validate.__code__, _compile.__code__}
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code in codes:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def caches_by_address(config: Config) -> Callable[[OpSpec, Config], Launcher]:
    """A build for :func:`evaluate_launcher`: RMSNorm that, once validation is over, computes
    only the first call for each pair of input addresses and copies that answer on later calls.

    Rule 5's attack under timing (for the interpreter and under CUDA events alike): validation
    sees an honest kernel, so only the timing phase's in-place refill of its inputs, halfway
    through, can expose it. The kernels are the planted kernel files ``correct_rmsnorm`` and
    ``writes_identity`` (``out0 = in0``), at ``config``.
    """
    from kernelsmith.evaluate.kernel_file import parse_kernel_file
    from kernelsmith.testing.bad_kernels import source

    def build(spec: OpSpec, _: Config) -> Launcher:
        launcher = parse_kernel_file(source("correct_rmsnorm")).build(spec, config)
        copy = parse_kernel_file(source("writes_identity")).build(spec, config)
        cache: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

        def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
            if in_validation():
                launcher(inputs, outputs)
                return
            x, w = inputs
            key = (x.data_ptr(), w.data_ptr())
            if key not in cache:  # (x and w are kept, so that their addresses stay theirs)
                result = torch.empty_like(outputs[0])
                launcher(inputs, [result])
                cache[key] = (x, w, result)
            copy([cache[key][2], w], outputs)

        return launch

    return build
