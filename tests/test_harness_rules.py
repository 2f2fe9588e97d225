"""The harness must be impossible to fool: every planted bad kernel is rejected, for its reason.

Untrusted kernels are kernel files (docs/kernel-files.md): Triton device code and a declarative
launch that kernelsmith's own launcher runs. :mod:`kernelsmith.testing.bad_kernels` holds two
kinds of planted kernels, and this file shows each rejected:

- its *kernel files* break a rule on the device (never writing, zeros, mutating an input, reading
  the output, a loop that never ends, ...): they pass the gate, so they are evaluated the way
  outside candidates are, through :class:`~kernelsmith.evaluate.pool.Evaluator` worker processes
  running the Triton interpreter, and every test asserts the failure kind *and* that the error
  names the problem. Two correct controls must come back "ok", so the rejections cannot come from
  a harness that rejects all;
- its *host modules* are attacks that need host Python (threads, forged replies, tampering,
  detecting the worker, ...): the gate rejects each before anything runs, and the tests show the
  line that names the attack.

The run-time defenses behind the gate (thread counts, the dispatch mode that sees PyTorch compute,
output identity, tampering checks, rule 5's refill while timing) can no longer be reached by a
candidate, but they stay: the tests at the end call them in this process with cheating Python
launchers written here (tests are trusted code). The interpreter is slow and every worker costs a
process start, so each group of kernel files is evaluated once, in parallel, by a module-scoped
fixture. Rules that need a GPU (side streams, CUDA faults, real timings) are in
tests/gpu/test_harness_gpu.py.
"""

from __future__ import annotations

import ast
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import pytest
import torch

import kernelsmith.evaluate.validate as validate_module
from kernelsmith.evaluate import errors
from kernelsmith.evaluate.kernel_file import check_kernel_file, parse_kernel_file
from kernelsmith.evaluate.pool import Evaluator
from kernelsmith.evaluate.protocol import Candidate, EvalResult, TimingSettings
from kernelsmith.evaluate.validate import Rejected, allocate_outputs, run_checked, validate
from kernelsmith.ops import get_op
from kernelsmith.ops._base import Launcher
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec
from kernelsmith.testing.bad_kernels import HOST_MODULES, KERNEL_FILES, NAMES, source
from kernelsmith.testing.harness import caches_by_address, evaluate_launcher

# Small shapes: the interpreter is slow. The softmax width is not a power of two (the masks of
# a correct kernel are exercised), and wide enough that the "large" distribution overflows exp
# in every draw (see test_softmax_large_distribution...).
RMSNORM = get_op("rmsnorm").spec((16, 64), "float32")
SOFTMAX = get_op("softmax").spec((16, 1000), "float32")
CONFIG = Config(num_warps=4)

# Bound in this (the caller's) process before any candidate runs.
ORIGINAL_CHECK_CLOSE = errors.check_close
ORIGINAL_TORCH_EQUAL = torch.equal

# Planted kernel files that need a GPU (tests/gpu/test_harness_gpu.py).
GPU_ONLY = {"out_of_bounds"}


@dataclass(frozen=True)
class Case:
    """One planted kernel file and what the harness must say about it."""

    kernel: str  # a kernel file of kernelsmith.testing.bad_kernels
    status: str
    says: tuple[str, ...] = ()  # fragments the error must contain
    config: Config = field(default=CONFIG)
    text: str = ""  # source to use instead of the file's (a variation of it)

    def candidate(self) -> Candidate:
        return Candidate("planted", self.config, self.text or source(self.kernel))


def _syntax_error_source() -> str:
    """correct_rmsnorm with an unclosed parenthesis inside its @triton.jit body."""
    text = source("correct_rmsnorm")
    broken = text.replace("rstd = tl.rsqrt(", "rstd = tl.rsqrt((", 1)
    assert broken != text
    return broken


# ---- kernel files: the cases -------------------------------------------------------------------
RMSNORM_CASES: dict[str, Case] = {
    "control": Case("correct_rmsnorm", "ok"),
    # rule 1: outputs are pre-filled (one run of each pair with random values), every element compared
    "rule1_never_writes": Case("never_writes", "validate", ("1024 elements were never written",)),
    "rule1_drops_last_rows": Case("drops_last_rows", "validate", ("x64", "never written")),  # a tail shape
    "rule1_half_columns": Case("half_columns", "validate", ("512 elements were never written",)),
    # rule 2: inputs compared bit for bit with clones
    "rule2_mutates_x": Case("mutates_input", "cheat", ("modified its inputs",)),
    "rule2_zeroes_weight": Case("zeroes_weight", "cheat", ("modified its inputs",)),
    # rule 3: scale-aware tolerance (zeros and identity canaries; constant: see softmax)
    "rule3_zeros": Case("writes_zeros", "validate", ("16x64", "relative L2 error")),
    "rule3_identity": Case("writes_identity", "validate", ("16x64", "relative L2 error")),
    # rule 4: several distributions (eps matters for "small"; it may also show on "normal")
    "rule4_no_eps": Case("rmsnorm_no_eps", "validate", ("output 0 wrong on", "error")),
    # rule 8: tolerance relative to PyTorch's own float32 error
    "rule8_half_math": Case("half_precision_math", "validate", ("16x64", "relative L2 error")),
    # rule 9: a second run on outputs pre-filled with another value must agree bit for bit
    "rule9_reads_output": Case("reads_output", "validate", ("bit for bit",)),
    # rule 12: a kernel that recognises the harness's NaN poison and skips work elsewhere
    "rule12_detects_poison": Case("detects_poison", "validate"),
    # build failures
    "config_outside_space": Case("correct_rmsnorm", "build", ("num_warps=3",), config=Config(num_warps=3)),
    "syntax_error": Case("correct_rmsnorm", "build", ("syntax error", "never closed"), text=_syntax_error_source()),
    "undefined_name": Case("undefined_name", "cheat", ("undefined_scale",)),
}

SOFTMAX_CASES: dict[str, Case] = {
    "control": Case("correct_softmax", "ok"),
    "rule3_constant": Case("writes_constant", "validate", ("16x1000", "relative L2 error")),
    "rule4_hardcoded_rows": Case("hardcoded_rows", "validate", ("wrong on softmax(1x1000",)),
    "rule4_no_max_subtraction": Case("softmax_no_max", "validate", ("large inputs", "NaN/Inf")),
}

# Blind spots of the validation data (issue 12): kernels wrong only on inputs or row counts the
# harness once never produced (a huge element, NaN/Inf, denormals, a row-count residue).
BLIND_CASES: dict[str, Case] = {
    "huge_values": Case("wrong_on_huge_values", "validate"),
    "nonfinite_inputs": Case("wrong_on_nonfinite", "validate"),
    "denormals": Case("wrong_on_denormals", "validate"),
    "row_residue": Case("wrong_on_row_residue", "validate"),
}

# Process isolation, in one worker slot, in this order: each failure must leave the evaluator
# able to evaluate the next candidate correctly.
ISOLATION_TIMEOUT_S = 15.0
ISOLATION_SEQUENCE: list[tuple[str, Case]] = [
    ("hang", Case("hangs", "timeout", ("no answer within the time limit",))),
    ("host_module", Case("takes_over_worker", "cheat", ("kernel",), text=source("takes_over_worker"))),
    ("after_takeover_zeros", Case("writes_zeros", "validate", ("relative L2 error",))),
    ("after_all_control", Case("correct_rmsnorm", "ok")),
]


# ---- evaluation, once per group ----------------------------------------------------------------
def _evaluate(evaluator: Evaluator, spec: OpSpec, cases: dict[str, Case]) -> dict[str, EvalResult]:
    results = evaluator.evaluate(spec, [c.candidate() for c in cases.values()])
    return dict(zip(cases, results, strict=True))


@pytest.fixture(scope="module")
def evaluator() -> Iterator[Evaluator]:
    with Evaluator("interpreter", workers=2, timeout_s=180) as ev:
        yield ev


@pytest.fixture(scope="module")
def rmsnorm_results(evaluator: Evaluator) -> dict[str, EvalResult]:
    return _evaluate(evaluator, RMSNORM, RMSNORM_CASES)


@pytest.fixture(scope="module")
def softmax_results(evaluator: Evaluator) -> dict[str, EvalResult]:
    return _evaluate(evaluator, SOFTMAX, SOFTMAX_CASES)


@pytest.fixture(scope="module")
def blind_results(evaluator: Evaluator) -> dict[str, EvalResult]:
    return _evaluate(evaluator, RMSNORM, BLIND_CASES)


@pytest.fixture(scope="module")
def isolation_results() -> list[EvalResult]:
    """The isolation sequence, in a one-worker evaluator (each candidate follows the last in the
    same worker slot)."""
    cases = [case for _, case in ISOLATION_SEQUENCE]
    with Evaluator("interpreter", workers=1, timeout_s=ISOLATION_TIMEOUT_S) as ev:
        return ev.evaluate(RMSNORM, [c.candidate() for c in cases])


def _assert_result(result: EvalResult, case: Case) -> None:
    assert result.status == case.status, f"{case.kernel}: {result.status}: {result.error}"
    for fragment in case.says:
        assert fragment in result.error, f"{case.kernel}: {fragment!r} not in {result.error!r}"
    if case.status == "ok":
        assert result.error == ""
        assert result.metrics["median_us"] > 0  # it was timed, and its timing outputs verified
        assert result.metrics["timer"] == "host-clock-interpreter"


# ---- kernel files: the tests -------------------------------------------------------------------
@pytest.mark.parametrize("name", list(RMSNORM_CASES))
def test_rmsnorm_planted(name: str, rmsnorm_results: dict[str, EvalResult]) -> None:
    _assert_result(rmsnorm_results[name], RMSNORM_CASES[name])


@pytest.mark.parametrize("name", list(SOFTMAX_CASES))
def test_softmax_planted(name: str, softmax_results: dict[str, EvalResult]) -> None:
    _assert_result(softmax_results[name], SOFTMAX_CASES[name])


@pytest.mark.parametrize("name", list(BLIND_CASES))
def test_blind_spots_of_the_validation_data(name: str, blind_results: dict[str, EvalResult]) -> None:
    _assert_result(blind_results[name], BLIND_CASES[name])


def test_device_level_cheats_pass_the_gate() -> None:
    """The kernel files' cheats are device code the grammar allows: only the harness can stop
    them (the tests above), so the gate must not be what rejects them."""
    gated = {"undefined_name"}  # a name no kernel body may use: the gate's business
    for name in sorted(set(KERNEL_FILES) - gated):
        assert check_kernel_file(source(name)) == [], name
    assert any("undefined_scale" in p for p in check_kernel_file(source("undefined_name")))


def test_failures_carry_the_candidate_and_its_source_hash(rmsnorm_results: dict[str, EvalResult]) -> None:
    """Results stay attributable: the candidate travels back, and a rejection after loading
    records which source was judged."""
    for name, case in RMSNORM_CASES.items():
        result = rmsnorm_results[name]
        assert result.candidate.source == (case.text or source(case.kernel))
        assert result.candidate.config == case.config
    for name in ("control", "rule2_mutates_x", "rule9_reads_output"):
        assert len(rmsnorm_results[name].source_hash) == 16


@pytest.mark.parametrize("step", range(len(ISOLATION_SEQUENCE)), ids=[name for name, _ in ISOLATION_SEQUENCE])
def test_isolation_sequence(step: int, isolation_results: list[EvalResult]) -> None:
    """A device loop that never ends, then a host module that would take the worker over, one
    after another in the same worker slot: each gets its own failure kind, and every candidate
    after them is judged correctly (the zeros after the takeover attempt are still rejected; the
    control at the end is "ok")."""
    _assert_result(isolation_results[step], ISOLATION_SEQUENCE[step][1])


def test_softmax_large_distribution_overflows_exp_in_the_validated_shapes() -> None:
    """The softmax_no_max kernel is rejected only when some "large" input overflows exp in
    float32 (> 88.7). At the width used above (1000) that is certain; this pins it, seed by seed,
    for the target shape together with the 7-row tail that also draws "large"."""
    op = get_op("softmax")
    for seed in range(20):
        target = op.make_inputs(SOFTMAX, seed, "large", "cpu")[0]
        tail = op.make_inputs(op.validation_specs(SOFTMAX)[2], seed, "large", "cpu")[0]
        assert max(float(target.max()), float(tail.max())) > 88.8


def test_softmax_large_distribution_overflows_exp_at_any_width() -> None:
    op = get_op("softmax")
    spec = op.spec((16, 48), "float32")
    for seed in range(20):
        x = op.make_inputs(spec, seed, "large", "cpu")[0]
        assert float(x.max()) > 88.8, f"seed {seed}: max {float(x.max()):.1f}"


# ---- host modules: the gate rejects every one, naming the attack ----------------------------------
# module -> a fragment of the gate's problem that names the construct the attack needs.
HOST_ATTACKS: dict[str, str] = {
    "background_thread": "`import threading` is not allowed",
    "caches_by_data_ptr": "function build has 0 decorators",
    "caches_by_version": "function build has 0 decorators",
    "counts_calls": "`import itertools` is not allowed",
    "detects_worker_argv": "`import sys` is not allowed",
    "detects_worker_environ": "`import os` is not allowed",
    "detects_worker_stack": "`import inspect` is not allowed",
    "disabled_dispatch": "function build has 0 decorators",
    "exits": "`import os` is not allowed",
    "forges_reply": "`from multiprocessing.connection import Connection` is not allowed",
    "forks_child": "`import os` is not allowed",
    "getattr_string": "unknown name 'getattr'",
    "lazy_dispatch_mode": "class",
    "lazy_subclass": "class",
    "leaves_daemon": "`import subprocess` is not allowed",
    "numpy_compute": "`import numpy as np` is not allowed",
    "reads_clock": "`import time` is not allowed",
    "rebinds_reference": "`from kernelsmith.ops import get_op` is not allowed",
    "reexports_forbidden": "`from kernelsmith.ops._launch import os` is not allowed",
    "replaces_output": "function build has 0 decorators",
    "rewrites_harness_files": "`import pathlib` is not allowed",
    "rewrites_harness_globals": "gi_frame",
    "samples_values": "function build has 0 decorators",
    "segfaults": "`import ctypes` is not allowed",
    "sends_crafted_pickle": "`import pickle` is not allowed",
    "sets_output_storage": "function build has 0 decorators",
    "side_stream": "function build has 0 decorators",
    "slows_baseline": "`import time` is not allowed",
    "swaps_code_object": "__code__",
    "swaps_output_data": "function build has 0 decorators",
    "takes_over_worker": "`import sys` is not allowed",
    "tampers_check_close": "kernelsmith.evaluate",
    "tampers_torch_equal": "function _always_equal has 0 decorators",
    "torch_fallback": "function build has 0 decorators",
    "torch_in_joined_thread": "`from dataclasses import inspect` is not allowed",
    "torch_softmax": "`import torch` is not allowed",
    "writes_database": "`import sqlite3` is not allowed",
}


def test_every_host_module_has_its_expected_rejection() -> None:
    assert set(HOST_ATTACKS) == set(HOST_MODULES)


@pytest.mark.parametrize("name", sorted(HOST_ATTACKS))
def test_host_module_is_rejected_by_the_gate_before_anything_runs(name: str) -> None:
    problems = check_kernel_file(source(name))
    assert any(HOST_ATTACKS[name] in p for p in problems), problems
    assert all(p.startswith("line ") for p in problems), problems  # each names its line
    assert any("the file has no LAUNCH" in p for p in problems)  # and it is no kernel file at all


@pytest.fixture(scope="module")
def host_results(evaluator: Evaluator) -> dict[str, EvalResult]:
    """A few host modules through a worker, as an attacker would submit them."""
    names = ["forges_reply", "sends_crafted_pickle", "rebinds_reference", "exits"]
    return dict(zip(names, evaluator.evaluate(RMSNORM, [Candidate("planted", CONFIG, source(n)) for n in names]),
                    strict=True))


@pytest.mark.parametrize("name", ["forges_reply", "sends_crafted_pickle", "rebinds_reference", "exits"])
def test_the_worker_gates_host_modules_too(name: str, host_results: dict[str, EvalResult]) -> None:
    """The worker loads ``Candidate.source`` only as a kernel file: a forged reply, a crafted
    pickle, a rebound reference never run there either."""
    result = host_results[name]
    assert result.status == "cheat", f"{name}: {result.status}: {result.error}"
    assert HOST_ATTACKS[name] in result.error


def test_tampering_never_reaches_the_callers_process(isolation_results: list[EvalResult]) -> None:
    assert errors.check_close is ORIGINAL_CHECK_CLOSE
    assert torch.equal is ORIGINAL_TORCH_EQUAL
    ref = torch.randn(8, 8, dtype=torch.float64)
    assert errors.check_close(torch.zeros(8, 8), ref, ref.float(), get_op("rmsnorm").tolerance)


# ---- the run-time defenses behind the gate, in this process --------------------------------------
# Candidates cannot run host code any more, so these checks of validate.run_checked and of the
# worker's timing are exercised with Python launchers written here: each wraps the correct
# RMSNorm kernel file's honest launcher with one cheat.
def honest(spec: OpSpec = RMSNORM) -> Launcher:
    return parse_kernel_file(source("correct_rmsnorm")).build(spec, CONFIG)


def _run_once(launcher: Launcher, spec: OpSpec = RMSNORM) -> None:
    op = get_op(spec.op)
    inputs = list(op.make_inputs(spec, 1, "normal", "cpu"))
    run_checked(launcher, inputs, allocate_outputs(op, spec, "cpu"), lambda: None)


# Threads a cheat left running. The Triton interpreter patches ``triton.language`` for the kernel it
# runs and restores it afterwards, process-wide, so a leaked thread still interpreting would break
# the next test's kernel: each test joins them before it ends.
_LEAKED_THREADS: list[threading.Thread] = []


def _thread(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
    thread = threading.Thread(target=honest(), args=(inputs, outputs))
    _LEAKED_THREADS.append(thread)
    thread.start()  # rule 6: the work goes on after the launcher returns


def _torch_in_joined_thread(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
    def work() -> None:
        outputs[0][...] = inputs[0] * torch.rsqrt(inputs[0].pow(2).mean(-1, keepdim=True) + 1e-6) * inputs[1]

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()


def _torch_compute(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
    outputs[0].copy_(torch.nn.functional.rms_norm(inputs[0], inputs[0].shape[-1:], inputs[1], 1e-6))


def _replaces_output(inputs: Sequence[torch.Tensor], outputs: list[torch.Tensor]) -> None:
    mine = inputs[0].new_empty(inputs[0].shape)
    honest()(inputs, [mine])
    outputs[0] = mine


def _swaps_output_data(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
    mine = inputs[0].new_empty(inputs[0].shape)
    honest()(inputs, [mine])
    outputs[0].data = mine


def _sets_output_storage(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
    mine = inputs[0].new_empty(inputs[0].shape)
    honest()(inputs, [mine])
    outputs[0].set_(mine)  # type: ignore[call-overload]


class _Lazy(torch.Tensor):
    pass


def _lazy_subclass(inputs: Sequence[torch.Tensor], outputs: list[torch.Tensor]) -> None:
    outputs[0] = outputs[0].as_subclass(_Lazy)


RUN_TIME_CHEATS: dict[str, tuple[Callable[..., None], tuple[str, ...]]] = {
    "rule6_thread": (_thread, ("started a thread",)),
    "rule7_torch_in_joined_thread": (_torch_in_joined_thread, ("the candidate",)),
    "rule7_torch_compute": (_torch_compute, ("computed with PyTorch",)),
    "rule7_replaces_output": (_replaces_output, ("output storage was replaced",)),
    "rule7_swaps_output_data": (_swaps_output_data, ("output storage was replaced",)),
    "rule7_sets_output_storage": (_sets_output_storage, ("PyTorch", "aten.set_")),
    "rule7_lazy_subclass": (_lazy_subclass, ("_Lazy", "not a plain torch.Tensor")),
}


@pytest.mark.parametrize("name", list(RUN_TIME_CHEATS))
def test_run_time_check_behind_the_gate(name: str) -> None:
    launcher, says = RUN_TIME_CHEATS[name]
    try:
        with pytest.raises(Rejected) as caught:
            _run_once(launcher)
    finally:
        while _LEAKED_THREADS:
            _LEAKED_THREADS.pop().join()
    assert caught.value.kind == "cheat", str(caught.value)
    for fragment in says:
        assert fragment in str(caught.value)


def test_run_time_checks_accept_the_honest_launcher() -> None:
    _run_once(honest())  # no exception: the checks above are not rejecting everything
    assert validate(get_op("rmsnorm"), RMSNORM, lambda spec, config: honest(spec), CONFIG, "cpu", lambda: None) > 0


@pytest.mark.parametrize(("owner", "name", "label"), [
    (torch, "equal", "torch.equal"),
    (errors, "check_close", "kernelsmith.evaluate.errors.check_close"),
])
def test_rule10_replacing_a_harness_function_is_tampering(owner: object, name: str, label: str) -> None:
    original = getattr(owner, name)

    def tamper(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        honest()(inputs, outputs)
        setattr(owner, name, lambda *args, **kwargs: True)

    try:
        with pytest.raises(Rejected, match="tampered") as caught:
            _run_once(tamper)
    finally:
        setattr(owner, name, original)
    assert label in str(caught.value)


def test_rule10_rebinding_a_global_of_a_harness_module_is_tampering(monkeypatch: pytest.MonkeyPatch) -> None:
    """What rewrites_harness_globals did through frames: a name the validation code looks up
    (its ``errors``) rebound in the module itself. The sealed identities catch it."""
    monkeypatch.setattr(validate_module, "_SEALED", {})
    validate_module.seal_harness()
    real = validate_module.errors

    def rebind(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        honest()(inputs, outputs)
        validate_module.errors = None  # type: ignore[assignment]

    try:
        with pytest.raises(Rejected, match="tampered") as caught:
            _run_once(rebind)
    finally:
        validate_module.errors = real
    assert "kernelsmith.evaluate.validate.errors" in str(caught.value)


# Timing with these settings calls the launcher about 48 times.
LONG_TIMING = TimingSettings(warmup_ms=0.0, rounds=48, input_sets=2, flush_l2=False)


def test_rule5_a_cache_by_address_passes_validation_and_fails_while_timing() -> None:
    """Only the in-place refill of the timing inputs, halfway through, exposes the cache (which
    engages once validation is over, however many calls that took)."""
    result = evaluate_launcher(RMSNORM, caches_by_address(CONFIG), timing=LONG_TIMING)
    assert result.status == "cheat", result.error
    assert "outputs written while timing are wrong" in result.error


def test_rule5_the_honest_launcher_is_timed() -> None:
    result = evaluate_launcher(RMSNORM, lambda spec, config: honest(spec), timing=LONG_TIMING)
    assert result.status == "ok", result.error
    assert result.metrics["median_us"] > 0


# ---- the planted kernels themselves --------------------------------------------------------------
def test_every_planted_kernel_is_exercised() -> None:
    """No planted kernel is left without a test (here or, for GPU-only ones, in tests/gpu)."""
    covered = {c.kernel for group in (RMSNORM_CASES, SOFTMAX_CASES, BLIND_CASES) for c in group.values()}
    covered |= {c.kernel for _, c in ISOLATION_SEQUENCE}
    covered |= set(HOST_ATTACKS)
    assert covered | GPU_ONLY == set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_planted_kernel_is_documented_in_its_form(name: str) -> None:
    tree = ast.parse(source(name))
    doc = ast.get_docstring(tree)
    assert doc and len(doc) > 80, f"{name} needs a docstring saying which rule it attacks"
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    if name in KERNEL_FILES:
        assert "build" not in functions  # device code and a launch block, nothing else
    else:
        # an attacker's module, and the docstring says why it cannot run any more
        assert "build" in functions and "kernel file" in " ".join(doc.split())


def test_source_rejects_unknown_names() -> None:
    with pytest.raises(KeyError, match="no planted kernel"):
        source("not_a_kernel")
    assert "__init__" not in NAMES
