"""The family's error floor at every accuracy check, not only validation's (issue 19, trust).

Validation judges a candidate by ``check_close`` with the family's error floor for the op's
condition on the draw (:mod:`test_tolerance_floor`). Every other check of outputs now judges the
same way, through :func:`kernelsmith.evaluate.errors.references` (float64 references, PyTorch's
own answer and the floors, all from the draw's pristine inputs): rule 5's check of the outputs
written while timing, the serve checks (the op's and the decorator's), the decorator's and the
compile backend's checks of a stored kernel, the decorator's check of the function's own output,
and the test helpers. Otherwise a draw on which PyTorch's own error is small by luck would switch
off, at one of them, a kernel that validation accepted.

The draw is the attention spike draw of :mod:`test_validation_flakes` (scores up to 6.9e7). The
kernels are in-test launchers (no Triton): each writes the float64 reference scaled by a factor,
``WITHIN_FLOOR`` (an error of 0.8 of the family's floor, above the bare rule's limit: a correct
kernel there, as far as rounding the scores can tell) or ``CANARY`` (1% off: wrong). At each
check: within the floor passes, the canary fails, and within the floor fails when the family's
floor is taken away (so the floor, and not some other slack, is what lets it pass there).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace

import pytest
import torch

import kernelsmith
from kernelsmith import dispatch, servecheck
from kernelsmith.db import DecisionRecord
from kernelsmith.evaluate import worker
from kernelsmith.evaluate.errors import check_close, references, written_problem
from kernelsmith.evaluate.protocol import Candidate, EvalRequest, TimingSettings
from kernelsmith.frontends._backend_resolve import _Resolver
from kernelsmith.frontends._decorator_helpers import _differs_from_op
from kernelsmith.ops import get_op
from kernelsmith.ops._base import NO_FLOOR
from kernelsmith.space import Config
from kernelsmith.testing.kernels import assert_guarded_outputs, assert_matches_fp64

ATTENTION = get_op("attention")
DECODE = get_op("decode_attention")
# test_validation_flakes.ATTENTION_SPIKE_SEED: attention in float32, (2, 2, 5, 32) causal, spikes.
SPEC = ATTENTION.spec((2, 2, 5, 32), "float32", causal=True)
SEED = 3904735234890330547
CONSTANTS = dispatch.constants_json({"causal": True, "scale": float(SPEC.const("scale"))})


DRAW = tuple(ATTENTION.validation_inputs(SPEC, SEED, "spikes", "cpu"))


def draw() -> tuple[torch.Tensor, ...]:
    return tuple(t.clone() for t in DRAW)


def _within_floor_factor() -> float:
    """1 + 0.8 of the floor (the relative L2 one, or the max-abs one relative to the output's
    largest element, whichever is smaller): an error a floor admits."""
    inputs = draw()
    (ref64,) = ATTENTION.reference_fp64(SPEC, inputs)
    (floor,) = ATTENTION.error_floors(SPEC, inputs, (ref64,))
    return 1.0 + 0.8 * min(floor.rel_l2, floor.max_abs / float(ref64.abs().max()))


WITHIN_FLOOR = _within_floor_factor()
CANARY = 1.01
# (factor, with the family's floor, accepted)
CASES = [(WITHIN_FLOOR, True, True), (CANARY, True, False), (WITHIN_FLOOR, False, False)]
IDS = ["within-floor", "canary", "within-floor-without-the-floor"]


def scaled(inputs: Sequence[torch.Tensor], factor: float) -> torch.Tensor:
    (ref64,) = ATTENTION.reference_fp64(SPEC, inputs)
    return (ref64 * factor).float()


class Scaled:
    """A launcher writing the float64 reference times ``factor``."""

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __call__(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        outputs[0].copy_(scaled(inputs, self.factor))


class Corrupting:
    """A launcher that zeroes q, then writes the exact answer *for the zeroed q*: right only
    against references computed after it ran, on the inputs it wrote."""

    def __call__(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        inputs[0].zero_()
        outputs[0].copy_(scaled(inputs, 1.0))


def runner_of(launcher) -> dispatch.KernelRunner:  # type: ignore[no-untyped-def]
    return dispatch.KernelRunner.build(ATTENTION, SPEC, launcher, "in_test", Config({}), "in-test")


DECISION = DecisionRecord("fp", SPEC.workload_hash, ATTENTION.name, SPEC.to_dict(), "kernel", "in_test", "in-test")


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):  # type: ignore[no-untyped-def]
    """No kernel disabled or runner served by one test is another's; failures go to a scratch database."""
    monkeypatch.setattr(servecheck, "_DISABLED", {})
    monkeypatch.setattr(dispatch, "_RUNNERS", {})
    monkeypatch.setenv("KERNELSMITH_DB", str(tmp_path / "default.db"))


def floors_on(monkeypatch, on: bool) -> None:  # type: ignore[no-untyped-def]
    if not on:
        monkeypatch.setattr(ATTENTION, "error_floors", lambda spec, inputs, refs64: tuple(NO_FLOOR for _ in refs64))


# ---- the draw --------------------------------------------------------------------------------
def test_the_draw_is_one_where_only_the_floor_admits_the_kernel() -> None:
    inputs = draw()
    refs = references(ATTENTION, SPEC, inputs)
    out = scaled(inputs, WITHIN_FLOOR)
    assert check_close(out, refs.fp64[0], refs.lowp[0], ATTENTION.tolerance) is not None
    assert check_close(out, refs.fp64[0], refs.lowp[0], ATTENTION.tolerance, refs.floors[0]) is None
    assert refs.problem([scaled(inputs, CANARY)], ATTENTION.tolerance) is not None
    assert refs.problem([out], ATTENTION.tolerance) is None


# ---- serve checks ----------------------------------------------------------------------------
@pytest.mark.parametrize(("factor", "floor", "accepted"), CASES, ids=IDS)
def test_the_ops_serve_check(monkeypatch, tmp_path, factor: float, floor: bool, accepted: bool) -> None:
    floors_on(monkeypatch, floor)
    policy = servecheck.CheckPolicy(True, 1, 0.0)
    checked = dispatch.CheckedRunner(runner_of(Scaled(factor)), ATTENTION.name, CONSTANTS, policy, "interpreter",
                                     str(tmp_path / "serve.db"))  # fmt: skip
    inputs = draw()
    (result,) = checked(inputs)
    assert checked.check is not None and (checked.check.failure is None) == accepted, checked.check.failure
    want = scaled(inputs, factor) if accepted else ATTENTION.reference(SPEC, inputs)[0]
    assert torch.equal(result, want)  # the kernel's answer, or the trusted one


@pytest.mark.parametrize(("factor", "floor", "accepted"), CASES, ids=IDS)
def test_the_decorators_serve_check(monkeypatch, tmp_path, factor: float, floor: bool, accepted: bool) -> None:
    floors_on(monkeypatch, floor)
    db = str(tmp_path / "serve.db")
    state = kernelsmith.optimize(lambda *t: ATTENTION.reference(SPEC, t)[0], db=db, check=True).kernelsmith
    serve = servecheck.ServeCheck(servecheck.CheckPolicy(True, 1, 0.0), "test", "interpreter", db)
    runner = runner_of(Scaled(factor))
    inputs = draw()
    state._checked_call(serve, ATTENTION, SPEC, runner, inputs, inputs, {}, lambda: runner(inputs)[0])
    assert (serve.failure is None) == accepted, serve.failure


# ---- the decorator's and the backend's checks of a stored kernel -----------------------------
def _decorator_check(monkeypatch, launcher) -> tuple[bool, str]:  # type: ignore[no-untyped-def]
    state = kernelsmith.optimize(lambda *t: ATTENTION.reference(SPEC, t)[0], check=False).kernelsmith
    monkeypatch.setattr(state, "_stored_or_tuned", lambda *args: DECISION)
    monkeypatch.setattr(dispatch, "build_runner", lambda family, spec, decision, db=None: runner_of(launcher))
    runner = state._runner(("key",), ATTENTION, SPEC, "interpreter", draw())
    return runner is not None, state.reasons.get(("key",), "")


def _backend_check(monkeypatch, launcher) -> tuple[bool, str]:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(ATTENTION, "make_inputs", lambda spec, seed, distribution="normal", device="cpu": draw())
    monkeypatch.setattr(dispatch, "build_runner", lambda family, spec, decision, db=None: runner_of(launcher))
    found = _Resolver(db=None, tune=False, budget=1, strategy="auto")._checked_runner(
        ATTENTION, SPEC, DECISION, torch.device("cpu")
    )
    return not isinstance(found[0], str), str(found[1])


@pytest.mark.parametrize("check", [_decorator_check, _backend_check], ids=["decorator", "backend"])
@pytest.mark.parametrize(("factor", "floor", "accepted"), CASES, ids=IDS)
def test_the_stored_kernel_check(monkeypatch, check, factor: float, floor: bool, accepted: bool) -> None:  # type: ignore[no-untyped-def]
    floors_on(monkeypatch, floor)
    kept, why = check(monkeypatch, Scaled(factor))
    assert kept == accepted, why


@pytest.mark.parametrize("check", [_decorator_check, _backend_check], ids=["decorator", "backend"])
def test_the_stored_kernel_check_takes_its_references_before_the_kernel_runs(monkeypatch, check) -> None:  # type: ignore[no-untyped-def]
    kept, why = check(monkeypatch, Corrupting())
    assert not kept and "output 0" in why, why


@pytest.mark.parametrize(("factor", "floor", "accepted"), CASES, ids=IDS)
def test_the_check_of_the_functions_own_output(monkeypatch, factor: float, floor: bool, accepted: bool) -> None:
    floors_on(monkeypatch, floor)
    inputs = draw()
    problem = _differs_from_op(ATTENTION, SPEC, inputs, scaled(inputs, factor))
    assert (problem is None) == accepted, problem


# ---- rule 5: the outputs written while timing ------------------------------------------------
def _timed(monkeypatch, launcher) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """The worker's timing (in this process) of ``launcher``, every input set the spike draw."""
    monkeypatch.setattr(ATTENTION, "make_inputs", lambda spec, seed, distribution="normal", device="cpu": draw())
    loaded = worker._Loaded(Candidate("in_test", Config({})), lambda spec, config: launcher, launcher, "in-test",
                            0.0, 0.0)  # fmt: skip
    request = EvalRequest(SPEC.to_dict(), (loaded.candidate,), "interpreter",
                          replace(TimingSettings.interpreter(), rounds=4))  # fmt: skip
    results, _ = worker._time(ATTENTION, SPEC, [loaded], request, torch.device("cpu"), None)
    return results[0].status, results[0].error or ""


@pytest.mark.parametrize(("factor", "floor", "accepted"), CASES, ids=IDS)
def test_rule5_while_timing(monkeypatch, factor: float, floor: bool, accepted: bool) -> None:
    floors_on(monkeypatch, floor)
    status, error = _timed(monkeypatch, Scaled(factor))
    assert (status == "ok") == accepted, error
    if not accepted:
        assert status == "cheat" and "outputs written while timing are wrong" in error


def test_rule5_judges_against_the_inputs_as_refilled_not_as_the_kernel_left_them(monkeypatch) -> None:
    status, error = _timed(monkeypatch, Corrupting())
    assert status == "cheat" and "outputs written while timing are wrong" in error, error


# ---- the test helpers ------------------------------------------------------------------------
@pytest.mark.parametrize(("factor", "floor", "accepted"), CASES, ids=IDS)
def test_the_test_helpers(monkeypatch, factor: float, floor: bool, accepted: bool) -> None:
    floors_on(monkeypatch, floor)
    inputs = draw()
    out = scaled(inputs, factor)
    for check in (
        lambda: assert_matches_fp64(ATTENTION, SPEC, inputs, out, "in-test"),
        lambda: assert_guarded_outputs(ATTENTION, SPEC, inputs, [out], [torch.full((4,), torch.nan)], ["o"], "t"),
    ):
        if accepted:
            check()
        else:
            with pytest.raises(AssertionError, match="error"):
                check()


# ---- inputs a family writes ------------------------------------------------------------------
WRITE_SPEC = DECODE.spec((2, 4, 24, 16), "float32", kv_heads=2, q_len=2, write_kv=True)


def test_decode_attentions_floor_leaves_float64_inputs_alone() -> None:
    """``error_floors`` with ``write_kv`` writes the new rows into float64 copies of the caches;
    for float64 inputs ``.double()`` would have been the caches themselves."""
    inputs = [t.double() if t.is_floating_point() else t for t in DECODE.make_inputs(WRITE_SPEC, 5, "full", "cpu")]
    before = [t.clone() for t in inputs]
    refs64 = DECODE.reference_fp64(WRITE_SPEC, [t.clone() for t in inputs])
    DECODE.error_floors(WRITE_SPEC, inputs, refs64)
    assert all(torch.equal(t, b) for t, b in zip(inputs, before, strict=True))


def test_decode_attentions_float64_reference_leaves_float64_inputs_alone() -> None:
    """``reference_fp64`` with ``write_kv`` writes the new rows into float64 copies of the caches
    too (the same ``.double()`` aliasing): the caller's caches keep their old rows, and the
    reference still attends over the written ones (it equals the one of the float32 draw)."""
    drawn = DECODE.make_inputs(WRITE_SPEC, 5, "full", "cpu")
    inputs = [t.double() if t.is_floating_point() else t for t in drawn]
    before = [t.clone() for t in inputs]
    (out,) = DECODE.reference_fp64(WRITE_SPEC, inputs)
    assert all(torch.equal(t, b) for t, b in zip(inputs, before, strict=True))
    (expected,) = DECODE.reference_fp64(WRITE_SPEC, list(drawn))  # (float32 inputs: .double() copies)
    assert torch.equal(out, expected)


def test_references_leave_the_pristine_inputs_of_a_writing_family_alone() -> None:
    inputs = list(DECODE.make_inputs(WRITE_SPEC, 6, "full", "cpu"))
    before = [t.clone() for t in inputs]
    refs = references(DECODE, WRITE_SPEC, inputs)
    assert all(torch.equal(t, b) for t, b in zip(inputs, before, strict=True))
    assert refs.problem(list(DECODE.reference(WRITE_SPEC, [t.clone() for t in inputs])), DECODE.tolerance) is None


def test_written_problem_names_a_wrong_cache_write_and_puts_the_update_back() -> None:
    before = list(DECODE.make_inputs(WRITE_SPEC, 7, "full", "cpu"))
    right = [t.clone() for t in before]
    DECODE.reference(WRITE_SPEC, right)  # PyTorch's reference writes the caches as the call must
    assert written_problem(DECODE, WRITE_SPEC, right, before) is None
    wrong = [t.clone() for t in right]
    wrong[2][0, 0, -1] += 1.0  # one value row written wrongly
    problem = written_problem(DECODE, WRITE_SPEC, wrong, before)
    assert problem is not None and "[2]" in problem
    assert all(torch.equal(a, b) for a, b in zip(wrong, right, strict=True))  # the update is put back


def test_the_constants_name_the_spec() -> None:
    """(the serve checks rebuild the spec from the call's inputs and these constants)"""
    assert ATTENTION.spec_for(*draw(), **json.loads(CONSTANTS)) == SPEC
