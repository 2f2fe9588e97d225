"""benchmarks/decision_agreement.py without a GPU: its rows cover every family, its options parse,
and its flag and table say where the decision and the independent timing of the served call
disagree. (Its --smoke run tunes in the Triton interpreter, minutes on two cores, so it is not
run here; the GPU session runs the script itself.)"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from benchmark_scripts import load_benchmark
from kernelsmith.ops import op_names


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("decision_agreement")


def test_every_family_has_a_row_and_the_norms_a_small_and_a_large_one(bench: ModuleType) -> None:
    assert {w.op for w in bench.ROWS} == set(op_names())
    for norm in ("rmsnorm", "layernorm", "add_rmsnorm"):
        assert {w.size for w in bench.ROWS if w.op == norm} == {"small", "large"}
    for w in bench.ROWS:  # every row's spec, full size and smoke size, is one the family accepts
        assert w.spec(False).op == w.spec(True).op == w.op


def test_the_options_follow_the_benchmarks_conventions(bench: ModuleType) -> None:
    args = bench.parse_args(["--json", "/tmp/a.json", "--only", "rmsnorm,softmax", "--budget", "8"])
    assert (args.out, args.budget, args.smoke) == ("/tmp/a.json", 8, False)
    assert [w.label for w in bench.selected(args.only)] == ["rmsnorm (small)", "rmsnorm (large)", "softmax"]
    assert not any(w.op.endswith("_backward") for w in bench.selected("", skip_backward=True))
    with pytest.raises(SystemExit, match="no rows for nope"):
        bench.selected("softmax,nope")


def _row(mode: str, ci: list[float], do_bench: tuple[float, float], replayed: tuple[float, float]) -> dict[str, Any]:
    return {"op": "decode_matmul (qkv)", "decision": {"timing_mode": mode, "ci": ci, "speedup": 1.2,
                                                      "median_us": 10.0, "baseline_us": 12.0},
            "us": {"do_bench": {"served": do_bench[0], "baseline": do_bench[1]},
                   "cudagraph": {"served": 5.0, "baseline": 5.5},
                   "replay_flushed": {"served": replayed[0], "baseline": replayed[1]},
                   "host_us": {"served": 8.0, "baseline": 90.0}}}  # fmt: skip


def test_a_row_is_flagged_when_the_matching_independent_speedup_is_outside_the_ci(bench: ModuleType) -> None:
    # The case: stream timing said 5.5x, do_bench of the served call 0.97x.
    stream = _row("stream", [5.0, 6.0], (10.0, 9.7), (10.0, 11.0))
    bench.agreement(stream)
    assert stream["compared_with"] == "do_bench" and stream["disagrees"]
    assert stream["speedups"]["do_bench"] == pytest.approx(0.97)
    # A graph-replay decision is compared with the flushed graph replays: 1.1x is inside its CI.
    graph = _row("graph-replay", [1.05, 1.3], (10.0, 30.0), (10.0, 11.0))
    bench.agreement(graph)
    assert graph["compared_with"] == "replay_flushed" and not graph["disagrees"]
    assert graph["speedups"]["cudagraph"] == pytest.approx(1.1) and graph["speedups"]["do_bench"] == 3.0
    # A timing that failed (an uncapturable call) gives no ratio and no flag.
    failed = _row("graph-replay", [1.05, 1.3], (10.0, 30.0), (10.0, 11.0))
    failed["us"]["replay_flushed"]["baseline"] = "RuntimeError: operation not permitted when stream is capturing"
    bench.agreement(failed)
    assert failed["speedups"]["replay_flushed"] is None and not failed["disagrees"]


def test_the_table_shows_the_mode_both_ratios_and_the_flag(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    row = _row("stream", [5.0, 6.0], (10.0, 9.7), (10.0, 11.0))
    bench.agreement(row)
    report = {"gpu": "test GPU", "date": "today", "budget": 8, "rows": [row, {"op": "softmax", "error": "boom"}]}
    bench.print_table(report)
    out = capsys.readouterr().out
    assert "stream" in out and "DISAGREES (do_bench)" in out and "0.97" in out and "1.10" in out
    assert "softmax" in out and "ERROR boom" in out
