"""The worker boundary on a real GPU (issue 12, parts 2 and 6): what the interpreter cannot show.

- The decisive run's baseline rule (:mod:`kernelsmith.evaluate.confirm`) must not call an honest
  kernel a cheat: on the device, the baseline timed beside a correct kernel file and the baseline
  timed alone in a clean process agree within the rule's margin, at a launch-bound shape and at
  a bandwidth-bound one.
- GPU workers run without an address-space cap (CUDA reserves more than any cap) and stay under
  the resident-memory cap the pool watches; their replies, the copy-bandwidth ceiling included,
  travel as schema-checked JSON.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelsmith.evaluate import sandbox
from kernelsmith.evaluate.confirm import BASELINE_SLOWDOWN
from kernelsmith.evaluate.pool import Evaluator, WorkerProcess
from kernelsmith.evaluate.protocol import Candidate, EvalRequest, TimingSettings
from kernelsmith.ops import get_op
from kernelsmith.space import Config
from kernelsmith.testing.bad_kernels import source

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("shape", [(8, 1024), (8192, 4096)], ids=["launch_bound", "bandwidth_bound"])
def test_an_honest_kernel_is_not_a_baseline_cheat(shape: tuple[int, int]) -> None:
    spec = get_op("rmsnorm").spec(shape, "bfloat16")
    honest = Candidate("agent", Config(num_warps=8), source("correct_rmsnorm"))
    with Evaluator("gpu", workers=1) as evaluator:
        confirmation = evaluator.confirm(spec, [honest], TimingSettings(rounds=100))
    [result] = confirmation.results
    assert result.ok, result.error
    beside = result.metrics["baseline_median_us"]
    alone = confirmation.clean_baseline["median_us"]
    assert beside < BASELINE_SLOWDOWN * alone, (beside, alone)
    assert result.metrics["timer"] == "cuda-events"


def test_gpu_workers_have_no_address_space_cap_and_stay_under_the_watched_one(tmp_path: Path) -> None:
    with Evaluator("gpu", workers=1) as evaluator:
        ceiling = evaluator.measure_ceiling()  # the ceiling's reply travels as JSON too
        assert ceiling.ok and ceiling.copy_gbps > 100, ceiling.error
        worker = WorkerProcess("gpu", str(tmp_path), evaluator.memory_cap)
        try:
            worker.start()
            assert worker.proc is not None
            limits = Path(f"/proc/{worker.proc.pid}/limits").read_text()
            [line] = [x for x in limits.splitlines() if x.startswith("Max address space")]
            assert line.split()[3] == "unlimited"
            spec = get_op("rmsnorm").spec((4096, 4096), "bfloat16")
            variant = get_op("rmsnorm").variants[0]
            candidate = Candidate(variant.name, next(iter(variant.space(spec))))
            reply = worker.call(EvalRequest(spec.to_dict(), (candidate,), "gpu", TimingSettings(rounds=10)), 300)
            assert reply.results[0].ok, reply.results[0].error
            assert sandbox.tree_rss_bytes(worker.proc.pid) < evaluator.memory_cap
        finally:
            worker.kill()
