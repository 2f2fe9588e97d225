"""The harness must be impossible to fool: every planted bad kernel is rejected, for its reason.

Each module in :mod:`kernelsmith.testing.bad_kernels` breaks one rule of DESIGN.md ("The harness
must be impossible to fool"). Here they are evaluated the way outside candidates are, through
:class:`~kernelsmith.evaluate.pool.Evaluator` worker processes running the Triton interpreter,
and every test asserts both the failure kind *and* that the error names the problem. Two correct
controls must come back "ok", so the rejections cannot come from a harness that rejects all.

Most candidates are evaluated with the static gate on (as in real use). Those the gate stops
are evaluated again with ``static_gate=False``, to prove that the run-time defense behind the
gate catches them too. The interpreter is slow and every worker costs a process start, so each
group of candidates is evaluated once, in parallel, by a module-scoped fixture, and the tests
look their results up by name. Rules that need a GPU (side streams, CUDA faults, real timings)
are in tests/gpu/test_harness_gpu.py.

Holes the planted kernels once found (frame tampering, PyTorch on a joined thread, a too-tame
"large" distribution, failure kinds) stay here as regression tests.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import torch

from kernelsmith.evaluate import errors
from kernelsmith.evaluate.pool import Evaluator
from kernelsmith.evaluate.protocol import Candidate, EvalResult
from kernelsmith.ops import get_op
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec
from kernelsmith.testing.bad_kernels import NAMES, source

# Small shapes: the interpreter is slow. The softmax width is not a power of two (the masks of
# a correct kernel are exercised, and torch_fallback's kernel fails there), and wide enough that
# the "large" distribution overflows exp in every draw (see test_softmax_large_distribution...).
RMSNORM = get_op("rmsnorm").spec((16, 64), "float32")
SOFTMAX = get_op("softmax").spec((16, 1000), "float32")
CONFIG = Config(num_warps=4)

# Bound in this (the caller's) process before any candidate runs; tampering candidates must not
# be able to change them.
ORIGINAL_CHECK_CLOSE = errors.check_close
ORIGINAL_TORCH_EQUAL = torch.equal

# Planted kernels that need a GPU (tests/gpu/test_harness_gpu.py).
GPU_ONLY = {"side_stream", "out_of_bounds"}


@dataclass(frozen=True)
class Case:
    """One planted candidate and what the harness must say about it."""

    kernel: str  # a module of kernelsmith.testing.bad_kernels
    status: str
    says: tuple[str, ...] = ()  # fragments the error must contain
    config: Config = field(default=CONFIG)
    text: str = ""  # source to use instead of the module's (a variation of it)

    def candidate(self) -> Candidate:
        return Candidate("planted", self.config, self.text or source(self.kernel))


def _syntax_error_source() -> str:
    """correct_rmsnorm with an unclosed parenthesis inside its @triton.jit body."""
    text = source("correct_rmsnorm")
    broken = text.replace("rstd = tl.rsqrt(", "rstd = tl.rsqrt((", 1)
    assert broken != text
    return broken


# ---- the cases -------------------------------------------------------------------------------
# Gate on, as in real use. Keys are test ids.
RMSNORM_CASES: dict[str, Case] = {
    "control": Case("correct_rmsnorm", "ok"),
    # rule 1: outputs are NaN-poisoned, every element compared
    "rule1_never_writes": Case("never_writes", "validate", ("1024 elements are NaN/Inf",)),
    "rule1_drops_last_rows": Case("drops_last_rows", "validate", ("7x64", "NaN/Inf")),
    "rule1_half_columns": Case("half_columns", "validate", ("512 elements are NaN/Inf",)),
    # rule 2: inputs compared bit for bit with clones
    "rule2_mutates_x": Case("mutates_input", "cheat", ("modified its inputs",)),
    "rule2_zeroes_weight": Case("zeroes_weight", "cheat", ("modified its inputs",)),
    # rule 3: scale-aware tolerance (zeros and identity canaries; constant: see softmax)
    "rule3_zeros": Case("writes_zeros", "validate", ("16x64", "relative L2 error")),
    "rule3_identity": Case("writes_identity", "validate", ("16x64", "relative L2 error")),
    # rule 4: several distributions (eps matters for "small"; it may also show on "normal")
    "rule4_no_eps": Case("rmsnorm_no_eps", "validate", ("output 0 wrong on", "error")),
    # rule 7: the outputs must stay the harness's own tensors (these pass the static gate)
    "rule7_replaces_output": Case("replaces_output", "cheat", ("output storage was replaced",)),
    "rule7_swaps_data": Case("swaps_output_data", "cheat", ("output storage was replaced",)),
    "rule7_set_storage": Case("sets_output_storage", "cheat", ("PyTorch", "aten.set_")),
    # rule 8: tolerance relative to PyTorch's own float32 error
    "rule8_half_math": Case("half_precision_math", "validate", ("16x64", "relative L2 error")),
    # rule 9: a second run on outputs poisoned with another value must agree bit for bit
    "rule9_reads_output": Case("reads_output", "validate", ("bit for bit", "uninitialized")),
    # the static gate stops these before they are imported (run time: RMSNORM_UNGATED_CASES)
    "gate_data_ptr_cache": Case("caches_by_data_ptr", "cheat", ("static gate", "'data_ptr'")),
    "gate_thread": Case("background_thread", "cheat", ("static gate", "'threading'")),
    "gate_tamper_check_close": Case("tampers_check_close", "cheat",
                                    ("static gate", "kernelsmith.evaluate.errors")),
    "gate_tamper_torch_equal": Case("tampers_torch_equal", "cheat",
                                    ("static gate", "module attribute (torch.equal)")),
    "gate_exit": Case("exits", "cheat", ("static gate", "'os'")),
    "gate_segfault": Case("segfaults", "cheat", ("static gate", "'ctypes'")),
    # build failures
    "config_outside_space": Case("correct_rmsnorm", "build", ("outside the variant's space",
                                                              "num_warps=3"),
                                 config=Config(num_warps=3)),
}

# Gate off: the run-time defenses behind the gate.
RMSNORM_UNGATED_CASES: dict[str, Case] = {
    "control": Case("correct_rmsnorm", "ok"),
    "rule5_data_ptr_cache": Case("caches_by_data_ptr", "cheat",
                                 ("outputs written while timing are wrong",)),
    "rule6_thread": Case("background_thread", "cheat", ("started a thread",)),
    "rule10_torch_equal": Case("tampers_torch_equal", "cheat", ("tampered", "torch.equal")),
    "build_syntax_error": Case("correct_rmsnorm", "build", ("syntax error", "never closed"),
                               text=_syntax_error_source()),
}

SOFTMAX_CASES: dict[str, Case] = {
    "control": Case("correct_softmax", "ok"),
    "rule3_constant": Case("writes_constant", "validate", ("16x1000", "relative L2 error")),
    "rule4_hardcoded_rows": Case("hardcoded_rows", "validate", ("wrong on softmax(1x1000",)),
    "rule4_no_max_subtraction": Case("softmax_no_max", "validate", ("large inputs", "NaN/Inf")),
    "gate_torch_softmax": Case("torch_softmax", "cheat", ("static gate", "torch.softmax")),
    "gate_try_except": Case("torch_fallback", "cheat", ("static gate", "try/except")),
    "gate_lazy_subclass": Case("lazy_subclass", "cheat", ("static gate", "torch._C")),
    "rule7_torch_in_joined_thread": Case("torch_in_joined_thread", "cheat"),
}

SOFTMAX_UNGATED_CASES: dict[str, Case] = {
    "control": Case("correct_softmax", "ok"),
    "rule7_torch_softmax": Case("torch_softmax", "cheat",
                                ("computed with PyTorch", "aten._softmax")),
    "rule7_try_except_fallback": Case("torch_fallback", "cheat",
                                      ("computed with PyTorch", "aten._softmax")),
    "rule7_lazy_subclass": Case("lazy_subclass", "cheat",
                                ("LazyTensor", "not a plain torch.Tensor")),
}

# Process isolation, in one worker, in this order: each failure must leave the evaluator able
# to evaluate the next candidate correctly.
ISOLATION_TIMEOUT_S = 15.0
ISOLATION_SEQUENCE: list[tuple[str, Case]] = [
    ("hang", Case("hangs", "timeout", (f"no answer within {ISOLATION_TIMEOUT_S:.0f} s",))),
    ("exit", Case("exits", "crash", ("exit code 3",))),
    ("segfault", Case("segfaults", "crash", ("worker died",))),
    ("tamper", Case("tampers_check_close", "cheat",
                    ("tampered", "kernelsmith.evaluate.errors.check_close"))),
    ("after_tamper_zeros", Case("writes_zeros", "validate", ("relative L2 error",))),
    ("after_all_control", Case("correct_rmsnorm", "ok")),
]


# ---- evaluation, once per group ----------------------------------------------------------------
def _evaluate(evaluator: Evaluator, spec: OpSpec, cases: dict[str, Case],
              static_gate: bool = True) -> dict[str, EvalResult]:
    candidates = [c.candidate() for c in cases.values()]
    results = evaluator.evaluate(spec, candidates, static_gate=static_gate)
    return dict(zip(cases, results, strict=True))


@pytest.fixture(scope="module")
def evaluator() -> Iterator[Evaluator]:
    with Evaluator("interpreter", workers=2, timeout_s=180) as ev:
        yield ev


@pytest.fixture(scope="module")
def rmsnorm_results(evaluator: Evaluator) -> dict[str, EvalResult]:
    return _evaluate(evaluator, RMSNORM, RMSNORM_CASES)


@pytest.fixture(scope="module")
def rmsnorm_ungated_results(evaluator: Evaluator) -> dict[str, EvalResult]:
    return _evaluate(evaluator, RMSNORM, RMSNORM_UNGATED_CASES, static_gate=False)


@pytest.fixture(scope="module")
def softmax_results(evaluator: Evaluator) -> dict[str, EvalResult]:
    return _evaluate(evaluator, SOFTMAX, SOFTMAX_CASES)


@pytest.fixture(scope="module")
def softmax_ungated_results(evaluator: Evaluator) -> dict[str, EvalResult]:
    return _evaluate(evaluator, SOFTMAX, SOFTMAX_UNGATED_CASES, static_gate=False)


@pytest.fixture(scope="module")
def isolation_results() -> list[EvalResult]:
    """The isolation sequence, in a one-worker evaluator (so each candidate follows the last in
    the same worker slot) with the static gate off (it would stop most of them)."""
    cases = [case for _, case in ISOLATION_SEQUENCE]
    with Evaluator("interpreter", workers=1, timeout_s=ISOLATION_TIMEOUT_S) as ev:
        return ev.evaluate(RMSNORM, [c.candidate() for c in cases], static_gate=False)


def _assert_result(result: EvalResult, case: Case) -> None:
    assert result.status == case.status, f"{case.kernel}: {result.status}: {result.error}"
    for fragment in case.says:
        assert fragment in result.error, f"{case.kernel}: {fragment!r} not in {result.error!r}"
    if case.status == "ok":
        assert result.error == ""
        assert result.metrics["median_us"] > 0  # it was timed, and its timing outputs verified
        assert result.metrics["timer"] == "host-clock-interpreter"


# ---- the tests ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(RMSNORM_CASES))
def test_rmsnorm_planted(name: str, rmsnorm_results: dict[str, EvalResult]) -> None:
    _assert_result(rmsnorm_results[name], RMSNORM_CASES[name])


@pytest.mark.parametrize("name", list(RMSNORM_UNGATED_CASES))
def test_rmsnorm_planted_without_gate(name: str,
                                      rmsnorm_ungated_results: dict[str, EvalResult]) -> None:
    _assert_result(rmsnorm_ungated_results[name], RMSNORM_UNGATED_CASES[name])


def _params(cases: dict[str, Case]) -> list[object]:
    return list(cases)


@pytest.mark.parametrize("name", _params(SOFTMAX_CASES))
def test_softmax_planted(name: str, softmax_results: dict[str, EvalResult]) -> None:
    _assert_result(softmax_results[name], SOFTMAX_CASES[name])


@pytest.mark.parametrize("name", list(SOFTMAX_UNGATED_CASES))
def test_softmax_planted_without_gate(name: str,
                                      softmax_ungated_results: dict[str, EvalResult]) -> None:
    _assert_result(softmax_ungated_results[name], SOFTMAX_UNGATED_CASES[name])


def test_failures_carry_the_candidate_and_its_source_hash(
        rmsnorm_results: dict[str, EvalResult]) -> None:
    """Results stay attributable: the candidate travels back, and a rejection after loading
    records which source was judged."""
    for name, case in RMSNORM_CASES.items():
        result = rmsnorm_results[name]
        assert result.candidate.source == (case.text or source(case.kernel))
        assert result.candidate.config == case.config
    for name in ("control", "rule2_mutates_x", "rule9_reads_output"):
        assert len(rmsnorm_results[name].source_hash) == 16


def test_data_ptr_cache_passes_validation_and_fails_only_while_timing(
        rmsnorm_ungated_results: dict[str, EvalResult]) -> None:
    """Rule 5 is a timing-phase defense: validation (fresh inputs per run) cannot see the cache,
    and only the in-place refill of the timing inputs exposes it."""
    error = rmsnorm_ungated_results["rule5_data_ptr_cache"].error
    assert "outputs written while timing" in error
    assert "wrong on" not in error  # not a validation failure


@pytest.mark.parametrize("step", range(len(ISOLATION_SEQUENCE)),
                         ids=[name for name, _ in ISOLATION_SEQUENCE])
def test_isolation_sequence(step: int, isolation_results: list[EvalResult]) -> None:
    """A hang, an exit, a segfault and harness tampering, one after another in the same worker
    slot: each gets its own failure kind, and every candidate after them is judged correctly
    (the zeros after the tampering are still rejected, so the tampered checker did not survive;
    the control at the end is "ok")."""
    _assert_result(isolation_results[step], ISOLATION_SEQUENCE[step][1])


def test_tampering_never_reaches_the_callers_process(isolation_results: list[EvalResult]) -> None:
    tamper = dict(zip([n for n, _ in ISOLATION_SEQUENCE], isolation_results, strict=True))["tamper"]
    assert tamper.status == "cheat"
    assert errors.check_close is ORIGINAL_CHECK_CLOSE
    assert torch.equal is ORIGINAL_TORCH_EQUAL
    # and the caller's checker still rejects zeros
    ref = torch.randn(8, 8, dtype=torch.float64)
    assert errors.check_close(torch.zeros(8, 8), ref, ref.float(), get_op("rmsnorm").tolerance)


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


@pytest.fixture(scope="module")
def frame_tampering_result() -> EvalResult:
    """In an evaluator of its own: when the hole below is open, this candidate leaves its
    worker's harness rewired, and no other test's candidate should be judged there."""
    with Evaluator("interpreter", workers=1, timeout_s=120) as ev:
        [result] = ev.evaluate(RMSNORM, [Case("rewrites_harness_globals", "cheat").candidate()])
    return result


def test_rewiring_the_harness_through_its_frames_is_rejected(
        frame_tampering_result: EvalResult) -> None:
    assert frame_tampering_result.status != "ok", "a kernel that writes zeros was accepted"
    assert frame_tampering_result.status == "cheat", frame_tampering_result.error


@pytest.fixture(scope="module")
def compile_error_results(evaluator: Evaluator) -> dict[str, EvalResult]:
    cases = {
        "gated_syntax_error": Case("correct_rmsnorm", "build", text=_syntax_error_source()),
        "undefined_name": Case("undefined_name", "build"),
    }
    return _evaluate(evaluator, RMSNORM, cases)


def test_syntax_error_is_a_build_failure_with_the_gate_on(
        compile_error_results: dict[str, EvalResult]) -> None:
    result = compile_error_results["gated_syntax_error"]
    assert result.status == "build", result.error
    assert "syntax" in result.error.lower()


def test_undefined_name_in_a_kernel_is_a_build_failure(
        compile_error_results: dict[str, EvalResult]) -> None:
    result = compile_error_results["undefined_name"]
    assert "undefined_scale" in result.error
    assert result.status == "build", result.error


# ---- the planted kernels themselves --------------------------------------------------------------
def test_every_planted_kernel_is_exercised() -> None:
    """No planted kernel is left without a test (here or, for GPU-only ones, in tests/gpu)."""
    covered = {c.kernel for group in (RMSNORM_CASES, RMSNORM_UNGATED_CASES, SOFTMAX_CASES,
                                      SOFTMAX_UNGATED_CASES) for c in group.values()}
    covered |= {c.kernel for _, c in ISOLATION_SEQUENCE}
    covered |= {"undefined_name", "rewrites_harness_globals"}
    assert covered | GPU_ONLY == set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_planted_kernel_is_a_documented_candidate_module(name: str) -> None:
    tree = ast.parse(source(name))
    doc = ast.get_docstring(tree)
    assert doc and len(doc) > 80, f"{name} needs a docstring saying which rule it attacks"
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert "build" in functions


def test_source_rejects_unknown_names() -> None:
    with pytest.raises(KeyError, match="no planted kernel"):
        source("not_a_kernel")
    assert "__init__" not in NAMES
