"""The harness on a real GPU: the rules that the Triton interpreter cannot exercise.

Side streams, CUDA faults, caching during CUDA-event timing and the metrics of a real
measurement need a GPU; every test here is marked ``gpu`` and skipped without one. The planted
kernel files are those of :mod:`kernelsmith.testing.bad_kernels`, evaluated through worker
processes like any outside candidate; tests/test_harness_rules.py holds the rules the
interpreter can show. Attacks that need host code (a side stream, a thread, a cache by address)
cannot be candidates any more (the gate rejects them; see test_harness_rules.py), so the
run-time defenses behind the gate are exercised here with Python launchers written in the test
and evaluated by the worker's code in this process (:mod:`kernelsmith.testing.harness`).
Candidates are grouped so that each group is evaluated once, in parallel across two workers, by
a module-scoped fixture.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pytest
import torch

from kernelsmith.evaluate.kernel_file import parse_kernel_file
from kernelsmith.evaluate.pool import Evaluator
from kernelsmith.evaluate.protocol import Candidate, EvalResult
from kernelsmith.ops import get_op, op_names
from kernelsmith.ops._base import Launcher
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec
from kernelsmith.testing.bad_kernels import source
from kernelsmith.testing.harness import caches_by_address, evaluate_launcher

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


def by_name(evaluator: Evaluator, spec: OpSpec, names: list[str]) -> dict[str, EvalResult]:
    results = evaluator.evaluate(spec, [planted(n) for n in names])
    return dict(zip(names, results, strict=True))


@pytest.fixture(scope="module")
def evaluator() -> Iterator[Evaluator]:
    with Evaluator("gpu", workers=2) as ev:
        yield ev


@pytest.fixture(scope="module")
def rmsnorm_group(evaluator: Evaluator) -> dict[str, EvalResult]:
    return by_name(evaluator, RMSNORM, ["correct_rmsnorm", "out_of_bounds", "reads_output", "detects_poison",
                                        "undefined_name"])


@pytest.fixture(scope="module")
def rmsnorm_fp32(evaluator: Evaluator) -> dict[str, EvalResult]:
    return by_name(evaluator, RMSNORM_FP32, ["correct_rmsnorm", "half_precision_math"])


@pytest.fixture(scope="module")
def after_fault(evaluator: Evaluator, rmsnorm_group: dict[str, EvalResult]) -> dict[str, EvalResult]:
    """Evaluated after the CUDA fault in rmsnorm_group, with the same evaluator."""
    return by_name(evaluator, RMSNORM_LARGE, ["correct_rmsnorm"])


@pytest.fixture(scope="module")
def softmax_group(evaluator: Evaluator) -> dict[str, EvalResult]:
    return by_name(evaluator, SOFTMAX, ["correct_softmax", "softmax_no_max", "writes_constant", "torch_softmax"])


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


def test_correct_rmsnorm_is_measured(rmsnorm_group: dict[str, EvalResult]) -> None:
    assert_measured(rmsnorm_group["correct_rmsnorm"])
    # 64 MiB moved: no real kernel does that beyond the H200's ~4.8 TB/s
    assert rmsnorm_group["correct_rmsnorm"].metrics["gbps"] < 5000


def test_correct_softmax_is_measured(softmax_group: dict[str, EvalResult]) -> None:
    assert_measured(softmax_group["correct_softmax"])


def test_rule8_precision_downgrade(rmsnorm_fp32: dict[str, EvalResult]) -> None:
    """float32 RMSNorm computed in float16 is rejected; the same kernel in float32 is not."""
    assert_measured(rmsnorm_fp32["correct_rmsnorm"])
    result = rmsnorm_fp32["half_precision_math"]
    assert result.status == "validate", result.error
    assert "error" in result.error and "wrong on" in result.error


def test_rule9_reads_output(rmsnorm_group: dict[str, EvalResult]) -> None:
    result = rmsnorm_group["reads_output"]
    assert result.status == "validate", result.error
    assert "bit for bit" in result.error


def test_rule12_a_kernel_that_detects_the_poison_is_rejected(rmsnorm_group: dict[str, EvalResult]) -> None:
    result = rmsnorm_group["detects_poison"]
    assert result.status == "validate", result.error


def test_cuda_fault_is_contained(rmsnorm_group: dict[str, EvalResult], after_fault: dict[str, EvalResult]) -> None:
    """An illegal memory access fails that candidate only; the evaluator then goes on to
    measure a correct kernel (after_fault, evaluated afterwards)."""
    result = rmsnorm_group["out_of_bounds"]
    assert result.status in ("runtime", "crash"), result.error
    assert "illegal" in result.error.lower() or "worker died" in result.error
    assert_measured(after_fault["correct_rmsnorm"])


def test_an_undefined_name_is_stopped_before_compiling(rmsnorm_group: dict[str, EvalResult]) -> None:
    result = rmsnorm_group["undefined_name"]
    assert result.status == "cheat", result.error
    assert "undefined_scale" in result.error


def test_softmax_cheats_on_gpu(softmax_group: dict[str, EvalResult]) -> None:
    no_max = softmax_group["softmax_no_max"]
    assert no_max.status == "validate", no_max.error
    assert "large inputs" in no_max.error
    constant = softmax_group["writes_constant"]
    assert constant.status == "validate", constant.error
    torch_op = softmax_group["torch_softmax"]
    assert torch_op.status == "cheat" and "`import torch` is not allowed" in torch_op.error


# ---- run-time defenses behind the gate, with Python launchers written here -------------------------
def honest(spec: OpSpec) -> Launcher:
    return parse_kernel_file(source("correct_rmsnorm")).build(spec, CONFIG)


def side_stream_build(spec: OpSpec, config: Config) -> Launcher:
    """Rule 6: the kernel runs on a stream the launcher made; the timed stream never sees it."""
    launcher = honest(spec)
    side = torch.cuda.Stream()

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            launcher(inputs, outputs)

    return launch


def background_thread_build(spec: OpSpec, config: Config) -> Launcher:
    launcher = honest(spec)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        threading.Thread(target=launcher, args=(inputs, outputs), daemon=True).start()

    return launch


def test_rule6_side_stream_is_caught() -> None:
    result = evaluate_launcher(RMSNORM_LARGE, side_stream_build, mode="gpu")
    assert result.status == "cheat", f"{result.status}: {result.error} {result.metrics}"
    assert "work continued after the timed region" in result.error


def test_rule6_side_stream_check_spares_a_correct_kernel() -> None:
    """The same shape, the same check: a kernel on the current stream is not flagged."""
    assert_measured(evaluate_launcher(RMSNORM_LARGE, lambda spec, config: honest(spec), mode="gpu"))


def test_rule6_background_thread() -> None:
    result = evaluate_launcher(RMSNORM, background_thread_build, mode="gpu")
    assert result.status == "cheat", result.error
    assert "started a thread" in result.error


CHUNKS = 16


def chunked_build(spec: OpSpec, config: Config) -> Launcher:
    """A correct RMSNorm issued as CHUNKS launches, one per block of rows, all on the current
    stream: host issue time of many launches, like the persistent layernorm and split-KV write_kv
    that rule 6 once rejected on a busy host (h32)."""
    rows, n = spec.inputs[0].shape
    # Up to CHUNKS blocks of rows (validation's small and tail specs have fewer rows than CHUNKS:
    # no empty block), one launcher per block size.
    bounds = sorted({rows * c // CHUNKS for c in range(CHUNKS + 1)})
    blocks = list(itertools.pairwise(bounds))
    launchers = {b - a: honest(get_op("rmsnorm").spec((b - a, n), spec.inputs[0].dtype)) for a, b in blocks}

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        for a, b in blocks:
            launchers[b - a]([inputs[0][a:b], inputs[1]], [outputs[0][a:b]])

    return launch


@contextmanager
def busy_host(processes: int) -> Iterator[None]:
    """``processes`` spinning Python processes (not threads: the worker times in its own process,
    whose GIL no outside compile thread shares): every core contended, as during a search that
    compiles ahead while other workers compile."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()


def test_rule6_spares_a_correct_multi_launch_kernel_on_a_busy_host() -> None:
    """Twice as many spinning processes as cores: issuing 16 launches takes the host far longer
    than the device takes to run them, in every round; the side-work check must leave the host's
    issue time out and keep the kernel."""
    assert RMSNORM_LARGE.inputs[0].shape[0] % CHUNKS == 0
    with busy_host(2 * (os.cpu_count() or 8)):
        result = evaluate_launcher(RMSNORM_LARGE, chunked_build, mode="gpu")
    assert_measured(result)


def test_rule6_side_stream_is_still_caught_on_a_busy_host() -> None:
    """The same load does not hide a side stream: its work is in every round's tail."""
    with busy_host(2 * (os.cpu_count() or 8)):
        result = evaluate_launcher(RMSNORM_LARGE, side_stream_build, mode="gpu")
    assert result.status == "cheat", f"{result.status}: {result.error} {result.metrics}"
    assert "work continued after the timed region" in result.error


def test_rule5_data_ptr_cache_is_caught_while_timing() -> None:
    """Rule 5 under CUDA-event timing: the cache engages once validation is over (validation's
    stress data would catch it otherwise), so what catches it is the timing phase's refill."""
    result = evaluate_launcher(RMSNORM, caches_by_address(CONFIG), mode="gpu")
    assert result.status == "cheat", result.error
    assert "outputs written while timing are wrong" in result.error


# ---- the package's own kernels pass the same validation -------------------------------------------
# Every registered family, at one large and one odd shape in its own --shape terms.
BUILTIN_SHAPES: dict[str, list[tuple[int, ...]]] = {
    "rope": [(2, 8, 256, 128), (1, 3, 17, 64)],
    "cross_entropy": [(512, 32000), (3, 50257)],
    "cross_entropy_backward": [(512, 32000), (3, 50257)],
    "attention": [(2, 8, 512, 128), (1, 3, 17, 64)],  # B x H x S x D
    "matmul": [(1024, 1024, 512), (17, 1000, 129)],  # M x N x K
    "decode_matmul": [(1, 4096, 4096), (5, 1000, 129)],  # M x N x K, M <= 64
    "decode_attention": [(1, 32, 1024, 64), (3, 8, 17, 16)],  # B x H x L x D
    # tokens x hidden x vocabulary
    "linear_cross_entropy": [(256, 512, 8192), (17, 80, 1001)],
    "linear_cross_entropy_backward": [(256, 512, 8192), (17, 80, 1001)],
    "linear_cross_entropy_fused": [(256, 512, 8192), (17, 80, 1001)],
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


# ---- the agent templates on the GPU --------------------------------------------------------------
TEMPLATE_SHAPES = {"cross_entropy": (512, 32000), "gelu_tanh": (4096, 4096), "swiglu": (4096, 4096)}


@pytest.fixture(scope="module")
def template_results(evaluator: Evaluator) -> dict[str, EvalResult]:
    """Each agent template at its first config, through the worker, compiled for the GPU."""
    from kernelsmith.agent.templates import OPS, template_source

    results = {}
    for op_name in OPS:
        text = template_source(op_name) or ""
        spec = get_op(op_name).spec(TEMPLATE_SHAPES.get(op_name, (4096, 4096)), "bfloat16")
        config = parse_kernel_file(text).space(spec).configs()[0]
        (results[op_name],) = evaluator.evaluate(spec, [Candidate("template", config, text)], measure=False)
    return results


def test_agent_templates_compile_and_validate_on_the_gpu(template_results: dict[str, EvalResult]) -> None:
    failed = {op: f"{r.status}: {r.error[:300]}" for op, r in template_results.items() if not r.ok}
    assert not failed, failed
