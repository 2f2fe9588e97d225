"""The harness on a real GPU: the rules that the Triton interpreter cannot exercise.

Side streams, CUDA faults, caching during CUDA-event timing and the metrics of a real
measurement need a GPU; every test here is marked ``gpu`` and skipped without one. The planted
kernels are those of :mod:`kernelsmith.testing.bad_kernels`; tests/test_harness_rules.py holds
the rules the interpreter can show. Candidates are grouped so that each group is evaluated once,
in parallel across two workers, by a module-scoped fixture.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kernelsmith.evaluate.pool import Evaluator
from kernelsmith.evaluate.protocol import Candidate, EvalResult
from kernelsmith.ops import get_op, op_names
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec
from kernelsmith.testing.bad_kernels import source

pytestmark = pytest.mark.gpu

RMSNORM = get_op("rmsnorm").spec((4096, 4096), "bfloat16")
SOFTMAX = get_op("softmax").spec((4096, 4096), "bfloat16")
# Side-stream work is seen as the gap between event timing and timing with a device-wide
# synchronize; a kernel of several tens of microseconds makes that gap far larger than the
# host's own noise (at 4096 x 4096 bf16 an RMSNorm takes only about 15 us on an H200).
RMSNORM_LARGE = get_op("rmsnorm").spec((8192, 8192), "bfloat16")
RMSNORM_FP32 = get_op("rmsnorm").spec((1024, 4096), "float32")
CONFIG = Config(num_warps=8)


def planted(name: str, config: Config = CONFIG) -> Candidate:
    return Candidate("planted", config, source(name))


def by_name(evaluator: Evaluator, spec: OpSpec, names: list[str],
            static_gate: bool = True) -> dict[str, EvalResult]:
    results = evaluator.evaluate(spec, [planted(n) for n in names], static_gate=static_gate)
    return dict(zip(names, results, strict=True))


@pytest.fixture(scope="module")
def evaluator() -> Iterator[Evaluator]:
    with Evaluator("gpu", workers=2) as ev:
        yield ev


@pytest.fixture(scope="module")
def rmsnorm_ungated(evaluator: Evaluator) -> dict[str, EvalResult]:
    """Behind the static gate: the run-time defenses alone."""
    return by_name(evaluator, RMSNORM, ["correct_rmsnorm", "caches_by_data_ptr", "out_of_bounds",
                                        "background_thread", "reads_output", "undefined_name"],
                   static_gate=False)


@pytest.fixture(scope="module")
def rmsnorm_fp32(evaluator: Evaluator) -> dict[str, EvalResult]:
    return by_name(evaluator, RMSNORM_FP32, ["correct_rmsnorm", "half_precision_math"])


@pytest.fixture(scope="module")
def side_stream(evaluator: Evaluator, rmsnorm_ungated: dict[str, EvalResult]) -> dict[str, EvalResult]:
    """Evaluated after the CUDA fault in rmsnorm_ungated, with the same evaluator."""
    return by_name(evaluator, RMSNORM_LARGE, ["correct_rmsnorm", "side_stream"], static_gate=False)


@pytest.fixture(scope="module")
def softmax_gated(evaluator: Evaluator) -> dict[str, EvalResult]:
    return by_name(evaluator, SOFTMAX, ["correct_softmax", "softmax_no_max", "writes_constant",
                                        "torch_softmax"])


def assert_measured(result: EvalResult) -> None:
    assert result.status == "ok", result.error
    metrics = result.metrics
    assert metrics["timer"] == "cuda-events"
    assert metrics["median_us"] > 0
    assert metrics["gbps"] > 0
    assert metrics["baseline_median_us"] > 0
    samples = metrics["samples_us"]
    assert len(samples) >= 40 and all(s > 0 for s in samples)
    assert len(metrics["baseline_samples_us"]) == len(samples)


def test_correct_rmsnorm_is_measured(rmsnorm_ungated: dict[str, EvalResult]) -> None:
    assert_measured(rmsnorm_ungated["correct_rmsnorm"])
    # 64 MiB moved: no real kernel does that beyond the H200's ~4.8 TB/s
    assert rmsnorm_ungated["correct_rmsnorm"].metrics["gbps"] < 5000


def test_correct_softmax_is_measured(softmax_gated: dict[str, EvalResult]) -> None:
    assert_measured(softmax_gated["correct_softmax"])


def test_rule5_data_ptr_cache_is_caught_while_timing(rmsnorm_ungated: dict[str, EvalResult]) -> None:
    result = rmsnorm_ungated["caches_by_data_ptr"]
    assert result.status == "cheat", result.error
    assert "outputs written while timing are wrong" in result.error


def test_rule6_background_thread(rmsnorm_ungated: dict[str, EvalResult]) -> None:
    result = rmsnorm_ungated["background_thread"]
    assert result.status == "cheat", result.error
    assert "started a thread" in result.error


def test_rule6_side_stream_is_caught(side_stream: dict[str, EvalResult]) -> None:
    result = side_stream["side_stream"]
    assert result.status == "cheat", f"{result.status}: {result.error} {result.metrics}"
    assert "work continued after the timed region" in result.error


def test_rule6_side_stream_check_spares_a_correct_kernel(side_stream: dict[str, EvalResult]) -> None:
    """The same shape, the same check: a kernel on the current stream is not flagged."""
    assert_measured(side_stream["correct_rmsnorm"])


def test_rule8_precision_downgrade(rmsnorm_fp32: dict[str, EvalResult]) -> None:
    """float32 RMSNorm computed in float16 is rejected; the same kernel in float32 is not."""
    assert_measured(rmsnorm_fp32["correct_rmsnorm"])
    result = rmsnorm_fp32["half_precision_math"]
    assert result.status == "validate", result.error
    assert "error" in result.error and "wrong on" in result.error


def test_rule9_reads_output(rmsnorm_ungated: dict[str, EvalResult]) -> None:
    result = rmsnorm_ungated["reads_output"]
    assert result.status == "validate", result.error
    assert "bit for bit" in result.error


def test_cuda_fault_is_contained(rmsnorm_ungated: dict[str, EvalResult],
                                 side_stream: dict[str, EvalResult]) -> None:
    """An illegal memory access fails that candidate only; the evaluator then goes on to
    measure a correct kernel (in side_stream, evaluated afterwards)."""
    result = rmsnorm_ungated["out_of_bounds"]
    assert result.status in ("runtime", "crash"), result.error
    assert "illegal" in result.error.lower() or "worker died" in result.error
    assert_measured(side_stream["correct_rmsnorm"])


def test_compile_error_is_a_build_failure(rmsnorm_ungated: dict[str, EvalResult]) -> None:
    result = rmsnorm_ungated["undefined_name"]
    assert result.status == "build", result.error
    assert "undefined_scale" in result.error


def test_softmax_cheats_on_gpu(softmax_gated: dict[str, EvalResult]) -> None:
    no_max = softmax_gated["softmax_no_max"]
    assert no_max.status == "validate", no_max.error
    assert "large inputs" in no_max.error
    constant = softmax_gated["writes_constant"]
    assert constant.status == "validate", constant.error
    torch_op = softmax_gated["torch_softmax"]
    assert torch_op.status == "cheat" and "static gate" in torch_op.error


# ---- the package's own kernels pass the same validation -------------------------------------------
# Every registered family, at one large and one odd shape in its own --shape terms.
BUILTIN_SHAPES: dict[str, list[tuple[int, ...]]] = {
    "rope": [(2, 8, 256, 128), (1, 3, 17, 64)],
    "cross_entropy": [(512, 32000), (3, 50257)],
    "cross_entropy_backward": [(512, 32000), (3, 50257)],
    "attention": [(2, 8, 512, 128), (1, 3, 17, 64)],  # B x H x S x D
    "matmul": [(1024, 1024, 512), (17, 1000, 129)],  # M x N x K
}
DEFAULT_SHAPES = [(4096, 4096), (1, 4097)]
BUILTIN_CASES = [
    pytest.param(op_name, shape, id=f"{op_name}-{'x'.join(map(str, shape))}")
    for op_name in op_names()
    for shape in BUILTIN_SHAPES.get(op_name, DEFAULT_SHAPES)
]


@pytest.fixture(scope="module")
def compiling_evaluator() -> Iterator[Evaluator]:
    """Validation only (no timing): many workers compile in parallel on the host's cores."""
    with Evaluator("gpu", workers=8) as ev:
        yield ev


def builtin_candidates(op_name: str, shape: tuple[int, ...]) -> tuple[OpSpec, list[Candidate]]:
    """Two representative configs (the first and the middle one) of every variant with configs."""
    op = get_op(op_name)
    spec = op.spec(shape, "bfloat16")
    candidates = []
    for variant in op.variants:
        configs = variant.space(spec).configs()
        for config in dict.fromkeys(configs[:1] + configs[len(configs) // 2 :][:1]):
            candidates.append(Candidate(variant.name, config))
    assert candidates, f"{op_name} has no config at all for {shape}"
    return spec, candidates


@pytest.mark.parametrize(("op_name", "shape"), BUILTIN_CASES)
def test_builtin_variants_pass_validation(op_name: str, shape: tuple[int, ...],
                                          compiling_evaluator: Evaluator) -> None:
    spec, candidates = builtin_candidates(op_name, shape)
    results = compiling_evaluator.evaluate(spec, candidates, measure=False)
    failed = [f"{r.candidate.key}: {r.status}: {r.error[:300]}" for r in results if not r.ok]
    assert not failed, "\n".join(failed)
