"""benchmarks/ops_subset.py: the op benchmark's own rows, selected by the names the benchmark prints."""

from __future__ import annotations

import pytest

from benchmark_scripts import load_benchmark


def test_rows_are_selected_by_name_in_the_benchmarks_order_and_unknown_names_are_errors():
    subset, ops = load_benchmark("ops_subset"), load_benchmark("ops")
    chosen = subset.select(ops.WORKLOADS, ["rmsnorm:8192x4096:train", "layernorm:4096x8192"])
    assert [subset.row_name(w) for w in chosen] == ["layernorm:4096x8192", "rmsnorm:8192x4096:train"]
    assert [w.train for w in chosen] == [False, True]
    with pytest.raises(ValueError, match="no such rows: layernorm:4096x8193"):
        subset.select(ops.WORKLOADS, ["layernorm:4096x8193"])
