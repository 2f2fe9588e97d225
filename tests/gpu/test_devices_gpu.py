"""The multi-device pool and the Ray executor on the lent one-GPU machine (issue 16).

With one GPU the multi-device path must run and change no figure: a pool pinned to ``devices=[0]``
(its workers' ``CUDA_VISIBLE_DEVICES`` set, the device's own lock) measures what the default pool
(no pinning) measures, and a Ray actor holding the GPU measures on it like a local worker. The
speed-up on several GPUs is measured in its own issue.
"""

from __future__ import annotations

import logging
import os

import pytest

from kernelsmith.evaluate.pool import Evaluator
from kernelsmith.evaluate.protocol import Candidate, TimingSettings
from kernelsmith.ops import get_op
from kernelsmith.space import Config
from kernelsmith.testing.bad_kernels import source

pytestmark = pytest.mark.gpu

SPEC = get_op("rmsnorm").spec((8192, 4096), "bfloat16")  # bandwidth-bound: stable timings
TIMING = TimingSettings(rounds=60)


def _candidates() -> list[Candidate]:
    family = get_op("rmsnorm")
    return [Candidate(v.name, c) for v in family.variants for c in v.space(SPEC)][:4]


def _medians(pool: Evaluator) -> dict[str, tuple[float, float]]:
    results = pool.evaluate(SPEC, _candidates(), TIMING)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    assert all(r.metrics["timer"] == "cuda-events" for r in results)
    return {r.candidate.key: (r.median_us, r.metrics["baseline_median_us"]) for r in results}


def test_one_gpu_pinned_measures_what_the_default_pool_measures() -> None:
    import torch

    if torch.cuda.device_count() != 1:
        pytest.skip("the one-GPU machine's test")
    with Evaluator("gpu", workers=2) as default:
        assert default.devices == [None]  # one GPU, devices=None: exactly the pool of before
        before = _medians(default)
    with Evaluator("gpu", workers=2, devices=[0]) as pinned:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        assert pinned.devices == [visible.split(",")[0].strip() if visible else "0"]
        assert all(slot.device == pinned.devices[0] for slot in pinned._slots.members)
        assert len(pinned.locks) == 1
        after = _medians(pinned)
    assert before.keys() == after.keys()
    for key, (us, base_us) in before.items():
        pinned_us, pinned_base_us = after[key]
        # The same kernels on the same device: the same figures, up to run-to-run noise.
        assert abs(pinned_us / us - 1) < 0.15, (key, us, pinned_us)
        assert abs(pinned_base_us / base_us - 1) < 0.15, (key, base_us, pinned_base_us)


def test_a_ray_actor_holds_the_gpu_and_measures_like_a_local_worker() -> None:
    ray = pytest.importorskip("ray")
    from kernelsmith.evaluate.ray_executor import RayExecutor

    ray.init(num_cpus=4, num_gpus=1, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    try:
        with RayExecutor("gpu") as executor:
            assert executor.n_workers == 1  # one actor per GPU of the cluster
            ceiling = executor.measure_ceiling()
            assert ceiling.ok and ceiling.copy_gbps > 100, ceiling.error
            results = executor.evaluate(SPEC, _candidates(), TIMING)
            assert all(r.ok and r.metrics["timer"] == "cuda-events" for r in results), [r.error for r in results]
            honest = Candidate("agent", Config(num_warps=8), source("correct_rmsnorm"))
            confirmation = executor.confirm(SPEC, [honest], TIMING, copy_gbps=ceiling.copy_gbps)
            assert confirmation.results[0].ok, confirmation.results[0].error
            assert confirmation.clean_baseline["median_us"] > 0
        with Evaluator("gpu", workers=1) as local:
            here = _medians(local)
        remote = {r.candidate.key: r.median_us for r in results}
        for key, (us, _) in here.items():
            assert abs(remote[key] / us - 1) < 0.15, (key, us, remote[key])
    finally:
        ray.shutdown()
