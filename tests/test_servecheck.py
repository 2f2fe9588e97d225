"""Serve checks (DESIGN.md rule 12): a kept kernel is compared where it serves, in the user's
process, with the user's function (decorator) or the op's reference (``kernelsmith::kernel``).

The served kernels here are trusted in-test launchers that compute RMSNorm with PyTorch and turn
wrong after a number of calls, as a kernel that tells validation from service would: right on
its first calls, wrong later. They stand in for a stored winner (``dispatch.build_runner`` is
replaced), so these tests need no Triton at all.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest
import torch

import kernelsmith
from kernelsmith import dispatch, servecheck
from kernelsmith.db import current_fingerprint, open_database
from kernelsmith.ops import get_op
from kernelsmith.space import Config
from test_decorator import _store_forward_and_backward, hf_rmsnorm, store_decision

RMSNORM = get_op("rmsnorm")
CONSTANTS = dispatch.constants_json({"eps": 1e-6})
REAL_BUILD_RUNNER = dispatch.build_runner


class Flaky:
    """A launcher right on its first ``right`` calls and doubling its answer after."""

    def __init__(self, right: int) -> None:
        self.right, self.calls = right, 0

    def __call__(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        self.calls += 1
        outputs[0].copy_(hf_rmsnorm(inputs[0], inputs[1]))
        if self.calls > self.right:
            outputs[0].mul_(2.0)


@pytest.fixture(autouse=True)
def _fresh_process_state(monkeypatch):
    """Kernels disabled and op runners served by one test are not another's."""
    monkeypatch.setattr(servecheck, "_DISABLED", {})
    monkeypatch.setattr(dispatch, "_RUNNERS", {})
    for name in ("KERNELSMITH_CHECK", "KERNELSMITH_CHECK_RATE", "KERNELSMITH_CHECK_FIRST"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def db(tmp_path) -> str:
    return str(tmp_path / "serve.db")


def serve(monkeypatch, launcher: Flaky) -> None:
    """Every stored rmsnorm winner is served by ``launcher``."""

    def build_runner(family, spec, decision, db=None):
        return dispatch.KernelRunner.build(family, spec, launcher, decision.variant, Config(decision.config),
                                           decision.source_hash)

    monkeypatch.setattr(dispatch, "build_runner", build_runner)


def counting(monkeypatch, owner, name: str) -> list[int]:
    """Count the calls of ``owner.name``."""
    calls: list[int] = []
    original = getattr(owner, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def serve_check_trials(db: str | None = None) -> list:
    with open_database(db) as database:
        return [t for t in database.trials(op="rmsnorm") if t.status == servecheck.SERVE_CHECK]


# ---- the decorator -------------------------------------------------------------------------------
def test_a_kernel_that_turns_wrong_is_caught_the_call_gets_the_users_answer_and_it_is_disabled(
    db, monkeypatch, caplog
):
    monkeypatch.setenv("KERNELSMITH_CHECK_RATE", "1.0")
    x, w = torch.randn(6, 64), torch.randn(64)
    store_decision(db, RMSNORM.spec_for(x, w, eps=1e-6))
    launcher = Flaky(right=1 + 3)  # the adoption trial, then three served calls
    serve(monkeypatch, launcher)
    fn = kernelsmith.optimize(hf_rmsnorm, mode="db", db=db)
    fn(x, w)  # the slow path: the function's own result, the runner adopted after its trial
    for _ in range(3):
        assert torch.allclose(fn(x, w), hf_rmsnorm(x, w))
    assert fn.kernelsmith.stats["kernel_calls"] == 3 and fn.kernelsmith.stats["checks"] == 3
    with caplog.at_level(logging.WARNING, logger="kernelsmith.servecheck"):
        wrong_call = fn(x, w)  # the kernel doubles its answer now
    assert torch.equal(wrong_call, hf_rmsnorm(x, w))  # the user's own answer, not the kernel's
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "disabled" in warnings[0].getMessage()
    assert "failed a serve check" in next(iter(fn.kernelsmith.reasons.values()))
    # disabled for this key: later calls run the function and never the kernel again
    launches = launcher.calls
    for _ in range(3):
        assert torch.equal(fn(x, w), hf_rmsnorm(x, w))
    assert launcher.calls == launches and fn.kernelsmith.stats["kernel_calls"] == 3
    # recorded, with what went wrong, as a trial of the kept candidate
    (trial,) = serve_check_trials(db)
    assert trial.fingerprint == current_fingerprint("interpreter").hash and trial.variant == "whole_row"
    assert trial.workload == RMSNORM.bucket(RMSNORM.spec_for(x, w, eps=1e-6)).workload_hash
    assert "relative L2 error" in trial.error and "6x64" in trial.error
    # and disabled for the workload in this process: another function does not adopt it (the
    # real build_runner refuses it before building anything)
    monkeypatch.setattr(dispatch, "build_runner", REAL_BUILD_RUNNER)
    again = kernelsmith.optimize(hf_rmsnorm, mode="db", db=db)
    again(x, w)
    again(x, w)
    assert again.kernelsmith.stats["kernel_calls"] == 0
    assert "failed serve check" in next(iter(again.kernelsmith.reasons.values()))


def test_with_checking_off_no_check_runs(db, monkeypatch):
    monkeypatch.setenv("KERNELSMITH_CHECK", "0")
    x, w = torch.randn(6, 64), torch.randn(64)
    store_decision(db, RMSNORM.spec_for(x, w, eps=1e-6))
    serve(monkeypatch, Flaky(right=1))  # wrong from its first served call on
    user_calls: list[int] = []

    def rmsnorm(x, weight, eps=1e-6):
        user_calls.append(1)
        return hf_rmsnorm(x, weight, eps)

    fn = kernelsmith.optimize(rmsnorm, mode="db", db=db)
    fn(x, w)
    first_calls = len(user_calls)  # recognition and its checks call the function
    references = counting(monkeypatch, type(RMSNORM), "reference_fp64")
    for _ in range(5):
        served = fn(x, w)
    assert len(user_calls) == first_calls and references == [] and fn.kernelsmith.stats["checks"] == 0
    assert torch.allclose(served, 2 * hf_rmsnorm(x, w))  # unchecked: what the kernel wrote is returned
    assert serve_check_trials(db) == []


def test_checking_on_compares_the_first_calls_with_the_users_function(db, monkeypatch):
    x, w = torch.randn(6, 64), torch.randn(64)
    store_decision(db, RMSNORM.spec_for(x, w, eps=1e-6))
    serve(monkeypatch, Flaky(right=100))
    user_calls: list[int] = []

    def rmsnorm(x, weight, eps=1e-6):
        user_calls.append(1)
        return hf_rmsnorm(x, weight, eps)

    fn = kernelsmith.optimize(rmsnorm, mode="db", db=db, check=0.0)  # the first calls, no sample
    fn(x, w)
    first_calls = len(user_calls)
    for _ in range(10):
        fn(x, w)
    assert len(user_calls) - first_calls == 3 == fn.kernelsmith.stats["checks"]
    assert fn.kernelsmith.stats["kernel_calls"] == 10


def test_a_check_is_not_made_during_cuda_graph_capture_and_stays_due(db, monkeypatch):
    monkeypatch.setenv("KERNELSMITH_CHECK_RATE", "1.0")
    x, w = torch.randn(6, 64), torch.randn(64)
    store_decision(db, RMSNORM.spec_for(x, w, eps=1e-6))
    serve(monkeypatch, Flaky(right=1))  # wrong on every served call
    fn = kernelsmith.optimize(hf_rmsnorm, mode="db", db=db)
    fn(x, w)
    references = counting(monkeypatch, type(RMSNORM), "reference_fp64")
    with monkeypatch.context() as capture:  # what a CUDA graph capture looks like to the check
        capture.setattr(torch.cuda, "is_available", lambda: True)
        capture.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
        captured = fn(x, w)
    assert references == [] and fn.kernelsmith.stats["checks"] == 0  # no check, no synchronization
    assert torch.allclose(captured, 2 * hf_rmsnorm(x, w))  # the kernel ran (it is what a graph records)
    assert torch.equal(fn(x, w), hf_rmsnorm(x, w))  # the next call out of capture is checked and caught
    assert fn.kernelsmith.stats["checks"] == 1 and len(serve_check_trials(db)) == 1


def test_a_failing_backward_returns_the_references_gradients(db, monkeypatch):
    """Training: the forward is compared with the function, the tuned backward with its family's
    reference; a backward turned wrong gives the reference's gradients and disables the key."""
    monkeypatch.setenv("KERNELSMITH_CHECK_RATE", "1.0")
    x = torch.randn(6, 64, requires_grad=True)
    w = torch.randn(64, requires_grad=True)
    _store_forward_and_backward(db, "rmsnorm", (x.detach(), w.detach()), eps=1e-6)
    dy = torch.randn(6, 64)

    def build_runner(family, spec, decision, db=None):
        if family.name == "rmsnorm":
            return dispatch.KernelRunner.build(family, spec, Flaky(right=100), decision.variant, Config())
        real = family.variant(decision.variant).build(spec, Config(decision.config))
        calls: list[int] = []

        def doubled(inputs, outputs):  # a backward kernel right for its adoption trial, wrong after
            real(inputs, outputs)
            calls.append(1)
            if len(calls) > 1:
                outputs[0].mul_(2.0)

        return dispatch.KernelRunner.build(family, spec, doubled, decision.variant, Config(decision.config))

    monkeypatch.setattr(dispatch, "build_runner", build_runner)
    fn = kernelsmith.optimize(hf_rmsnorm, mode="db", db=db)
    fn(x, w)  # recognize and adopt (the backward runner's trial is not checked against gradients)
    fn(x, w).backward(dy)
    want = torch.autograd.grad(hf_rmsnorm(x, w), (x, w), dy)
    assert torch.allclose(x.grad, want[0], atol=1e-5) and torch.allclose(w.grad, want[1], atol=1e-4)
    assert "failed a serve check" in next(iter(fn.kernelsmith.reasons.values()))
    assert serve_check_trials(db) == []  # the forward was right
    with open_database(db) as database:
        recorded = [t for t in database.trials(op="rmsnorm_backward") if t.status == servecheck.SERVE_CHECK]
    assert len(recorded) == 1 and "backward" in recorded[0].error
    calls = fn.kernelsmith.stats["kernel_calls"]
    fn(x, w).backward(dy)  # the key runs the function now
    assert fn.kernelsmith.stats["kernel_calls"] == calls


# ---- the kernelsmith::kernel op --------------------------------------------------------------------
def test_the_op_checks_its_runner_against_the_reference_and_falls_back(monkeypatch):
    monkeypatch.setenv("KERNELSMITH_CHECK_RATE", "1.0")
    x, w = torch.randn(5, 64), torch.randn(64)
    store_decision(None, RMSNORM.spec_for(x, w, eps=1e-6))  # the op serves from the default database
    launcher = Flaky(right=3)
    serve(monkeypatch, launcher)
    references = counting(monkeypatch, type(RMSNORM), "reference")
    reference = RMSNORM.reference(RMSNORM.spec_for(x, w, eps=1e-6), (x, w))[0]
    for _ in range(3):
        assert torch.allclose(torch.ops.kernelsmith.kernel("rmsnorm", [x, w], CONSTANTS)[0], reference)
    assert len(references) == 1 + 3  # one above, then one per checked call
    out = torch.ops.kernelsmith.kernel("rmsnorm", [x, w], CONSTANTS)[0]
    assert torch.equal(out, reference)  # the reference's answer, not the doubled one
    (key,) = dispatch._RUNNERS
    assert dispatch._RUNNERS[key] is None  # the table entry is the fallback now
    launches = launcher.calls
    assert torch.equal(torch.ops.kernelsmith.kernel("rmsnorm", [x, w], CONSTANTS)[0], reference)
    assert launcher.calls == launches
    (trial,) = serve_check_trials()
    assert "kernelsmith::kernel" in trial.error


def test_an_installed_runner_is_checked_and_its_failure_recorded_in_the_backends_database(db, monkeypatch):
    monkeypatch.setenv("KERNELSMITH_CHECK_RATE", "1.0")
    x, w = torch.randn(5, 64), torch.randn(64)
    spec = RMSNORM.spec_for(x, w, eps=1e-6)
    runner = dispatch.KernelRunner.build(RMSNORM, spec, Flaky(right=0), "whole_row", Config(), "abc")
    dispatch.install_runner("rmsnorm", [x.to("meta"), w.to("meta")], CONSTANTS, runner, torch.device("cpu"), db)
    out = torch.ops.kernelsmith.kernel("rmsnorm", [x, w], CONSTANTS)[0]
    assert torch.equal(out, RMSNORM.reference(spec, (x, w))[0])
    (trial,) = serve_check_trials(db)
    assert trial.source_hash == "abc" and trial.workload == RMSNORM.bucket(spec).workload_hash


def test_the_op_makes_no_check_under_compile_tracing_or_with_checking_off(monkeypatch):
    x, w = torch.randn(5, 64), torch.randn(64)
    spec = RMSNORM.spec_for(x, w, eps=1e-6)
    runner = dispatch.KernelRunner.build(RMSNORM, spec, Flaky(right=0), "whole_row", Config())
    references = counting(monkeypatch, type(RMSNORM), "reference_fp64")
    with monkeypatch.context() as tracing:
        tracing.setattr(torch.compiler, "is_compiling", lambda: True)
        dispatch.install_runner("rmsnorm", [x, w], CONSTANTS, runner)
        torch.ops.kernelsmith.kernel("rmsnorm", [x, w], CONSTANTS)
    assert references == []
    torch.ops.kernelsmith.kernel("rmsnorm", [x, w], CONSTANTS)  # traced no more: the due check runs
    assert len(references) == 1
    monkeypatch.setenv("KERNELSMITH_CHECK", "0")
    dispatch.install_runner("rmsnorm", [x, w], CONSTANTS, runner)
    (served,) = dispatch._RUNNERS.values()
    assert served is not None and served.check is None  # no check state at all: nothing to enter
    for _ in range(5):
        torch.ops.kernelsmith.kernel("rmsnorm", [x, w], CONSTANTS)
    assert len(references) == 1


# ---- the policy and the sample ---------------------------------------------------------------------
def test_the_policy_reads_the_argument_over_the_environment(monkeypatch):
    assert servecheck.CheckPolicy.resolve() == servecheck.CheckPolicy(True, 3, 1e-3)
    monkeypatch.setenv("KERNELSMITH_CHECK", "0")
    monkeypatch.setenv("KERNELSMITH_CHECK_RATE", "0.01")
    assert not servecheck.CheckPolicy.resolve().enabled
    assert servecheck.CheckPolicy.resolve(True) == servecheck.CheckPolicy(True, 3, 0.01)
    assert servecheck.CheckPolicy.resolve(0.5) == servecheck.CheckPolicy(True, 3, 0.5)
    with pytest.raises(ValueError, match="rate"):
        kernelsmith.optimize(hf_rmsnorm, check=2.0)
    monkeypatch.setenv("KERNELSMITH_CHECK_RATE", "often")
    with pytest.raises(ValueError, match="KERNELSMITH_CHECK_RATE"):
        servecheck.CheckPolicy.resolve()


@pytest.mark.parametrize("rate", [0.0, 0.2])
def test_after_the_first_calls_a_secret_fraction_is_checked(monkeypatch, rate):
    x, w = torch.randn(3, 16), torch.randn(16)
    spec = RMSNORM.spec_for(x, w, eps=1e-6)
    runner = dispatch.KernelRunner.build(RMSNORM, spec, Flaky(right=10**9), "whole_row", Config())
    checked = dispatch.CheckedRunner(runner, "rmsnorm", CONSTANTS, servecheck.CheckPolicy(True, 3, rate), "interpreter")
    for _ in range(1000):
        checked([x, w])
    assert checked.check is not None
    if rate == 0.0:
        assert checked.check.checked == 3
    else:  # 3 + Binomial(997, 0.2): mean 202, standard deviation 12.6
        assert 3 + 140 < checked.check.checked < 3 + 265
    gaps = {checked.check._gap() for _ in range(50)}
    assert rate == 0.0 or len(gaps) > 5  # not a fixed period a kernel could count


def test_under_torch_compile_the_op_checks_when_the_graph_runs(db, monkeypatch):
    """The decorator emits ``kernelsmith::kernel`` while traced (its own check is never made
    there); the op checks its calls when the compiled code runs, and catches the wrong one."""
    monkeypatch.setenv("KERNELSMITH_DB", db)  # where the op looks its winner up
    monkeypatch.setenv("KERNELSMITH_CHECK_RATE", "1.0")
    x, w = torch.randn(6, 64), torch.randn(64)
    store_decision(db, RMSNORM.spec_for(x, w, eps=1e-6))
    serve(monkeypatch, Flaky(right=1 + 2))  # the adoption trial and two calls of the compiled code
    fn = kernelsmith.optimize(hf_rmsnorm, mode="db", db=db)
    fn(x, w)
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b: fn(a, b) + 1.0, backend="eager")
    for _ in range(4):
        assert torch.allclose(compiled(x, w), hf_rmsnorm(x, w) + 1.0)  # the third: the reference's
    assert fn.kernelsmith.stats["checks"] == 0
    (trial,) = serve_check_trials(db)
    assert trial.error.startswith("kernelsmith::kernel")
