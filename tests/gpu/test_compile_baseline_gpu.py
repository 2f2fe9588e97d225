"""On a GPU a decision is measured against torch.compile as well as eager (issue 14, item 4).

GPU only. With the default setting (``KERNELSMITH_COMPILE_BASELINE=auto``), the final re-check
times the op's reference compiled by torch.compile in the worker beside the eager one; the
decision stores its median and the paired speedup, and a kernel is kept only if it beats both.
"""

from __future__ import annotations

import pytest

from kernelsmith.db import current_fingerprint, open_database
from kernelsmith.ops import get_op
from kernelsmith.tuner import tune_spec
from kernelsmith.versus import TORCH_COMPILE, versus

pytestmark = pytest.mark.gpu


def test_a_gpu_decision_stores_the_torch_compile_baseline(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KERNELSMITH_COMPILE_BASELINE", raising=False)  # the default: auto, on a GPU
    spec = get_op("rmsnorm").spec((4096, 4096), "bf16")
    db_path = str(tmp_path / "compile.db")
    result = tune_spec(spec, budget=4, db=db_path, mode="gpu")
    with open_database(db_path) as db:
        decision = db.get_decision(current_fingerprint("gpu").hash, spec.workload_hash)
    assert decision is not None
    metrics = decision.metrics
    assert "torch.compile baseline unavailable" not in metrics.get("note", ""), metrics.get("note")
    assert metrics["compile_median_us"] > 0 and result.compile_us == metrics["compile_median_us"]
    assert 0 < metrics["compile_ci_low"] <= metrics["compile_speedup"] <= metrics["compile_ci_high"]
    if decision.winner == "kernel":  # kept only with a confident win over torch.compile too
        assert metrics["compile_ci_low"] > 1.0 and metrics["ci_low"] > 1.0
        assert versus(decision.winner, metrics).against == TORCH_COMPILE
