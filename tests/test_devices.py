"""Every GPU of a host, tested with fake devices on the CPU.

The pool pins each worker to one device through ``CUDA_VISIBLE_DEVICES`` and gives each device
its own timing lock. No GPU is needed to check that logic: the workers here are the stand-in of
:mod:`kernelsmith.testing.fake_device_worker` (it reports the device and lock it was given and
when it held the lock), started in interpreter mode with an injected device list.
"""

from __future__ import annotations

import itertools
import logging
from pathlib import Path

import pytest

from kernelsmith.evaluate.pool import Evaluator, parse_devices, resolve_devices
from kernelsmith.evaluate.protocol import Candidate
from kernelsmith.ops import get_op
from kernelsmith.space import Config

FAKE = "kernelsmith.testing.fake_device_worker"
SPEC = get_op("rmsnorm").spec((4, 64), "float32")


def _candidates(sleeps_ms: list[int]) -> list[Candidate]:
    return [Candidate("fake", Config(sleep_ms=ms, index=i)) for i, ms in enumerate(sleeps_ms)]


def test_each_worker_is_pinned_to_one_device_round_robin() -> None:
    with Evaluator("interpreter", workers=4, devices=[0, 1], worker=(FAKE,)) as pool:
        assert pool.devices == ["0", "1"] and pool.n_workers == 4
        results = pool.evaluate(SPEC, _candidates([200] * 8))
        assert all(r.ok for r in results)
        devices = sorted({int(r.metrics["device"]) for r in results})
        assert devices == [0, 1]  # both devices served, and nothing else
        # Two workers per device: the slots' environments pin one device each.
        pinned = sorted(slot.device or "" for slot in pool._slots.members)
        assert pinned == ["0", "0", "1", "1"]


def test_at_least_one_worker_per_device() -> None:
    with Evaluator("interpreter", workers=1, devices="0,1,2", worker=(FAKE,)) as pool:
        assert pool.n_workers == 3 and pool.devices == ["0", "1", "2"]


def test_results_come_in_the_candidates_order() -> None:
    """The first candidates sleep longest, so they usually finish last; the results keep the
    candidates' order whatever the completion order was. Checked without comparing wall-clock
    times across workers (a loaded machine can start a short candidate late): each result names
    the candidate its worker evaluated, and its measured time is at least that candidate's sleep,
    so a result put in another candidate's place (a 0 ms one where the 600 ms one belongs) fails."""
    sleeps_ms = [600, 400, 200, 0, 0, 0]
    candidates = _candidates(sleeps_ms)
    with Evaluator("interpreter", workers=4, devices=[0, 1], worker=(FAKE,)) as pool:
        results = pool.evaluate(SPEC, candidates)
    assert [r.candidate for r in results] == candidates
    held_s = [r.metrics["end_s"] - r.metrics["start_s"] for r in results]
    assert all(held >= ms / 1000 - 1e-3 for held, ms in zip(held_s, sleeps_ms, strict=True)), held_s


def test_one_lock_per_device_serializes_only_that_device() -> None:
    with Evaluator("interpreter", workers=4, devices=[0, 1], worker=(FAKE,)) as pool:
        assert len(set(pool.locks.values())) == 2
        results = pool.evaluate(SPEC, _candidates([300] * 8))
    by_device: dict[int, list[tuple[float, float]]] = {}
    for r in results:
        by_device.setdefault(int(r.metrics["device"]), []).append((r.metrics["start_s"], r.metrics["end_s"]))
    lock_ids = {int(r.metrics["device"]): r.metrics["lock_id"] for r in results}
    assert len(set(lock_ids.values())) == 2 and 0 not in lock_ids.values()  # each device its own lock
    for intervals in by_device.values():  # two workers per device, never timing at once
        intervals.sort()
        assert all(a_end <= b_start + 1e-3 for (_, a_end), (b_start, _) in itertools.pairwise(intervals))
    # ...while the two devices did time at the same moment.
    overlap = any(
        a_start < b_end and b_start < a_end for a_start, a_end in by_device[0] for b_start, b_end in by_device[1]
    )
    assert overlap


def test_a_worker_that_cannot_start_has_its_candidate_retried_on_another(caplog: pytest.LogCaptureFixture) -> None:
    # Device 1's workers exit before their greeting, like workers whose GPU is gone.
    # Two requests at a time, each holding its worker a while: one of them meets device 1's.
    failing = Evaluator("interpreter", workers=2, devices=[1, 0], worker=(FAKE, "--fails-on", "1"))
    with caplog.at_level(logging.WARNING, logger="kernelsmith.evaluate.pool"), failing as pool:
        results = pool.evaluate(SPEC, _candidates([300] * 4))
    assert all(r.ok for r in results), [r.error for r in results]
    assert {int(r.metrics["device"]) for r in results} == {0}
    assert "trying another" in caplog.text


def test_a_worker_that_cannot_start_anywhere_is_a_failure_record() -> None:
    with Evaluator("interpreter", workers=2, devices=[1, 2], worker=(FAKE, "--fails-on", "1")) as pool:
        ok = pool.evaluate(SPEC, _candidates([0]))
    assert ok[0].ok and ok[0].metrics["device"] == 2
    with Evaluator("interpreter", workers=1, devices=[1], worker=(FAKE, "--fails-on", "1")) as pool:
        lost = pool.evaluate(SPEC, _candidates([0]))
    assert lost[0].status == "crash" and "failed to start" in lost[0].error


def test_devices_map_through_the_visible_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert resolve_devices("gpu", [1, 0, 1]) == ["3", "2"]  # torch's cuda:1 is physical 3; no repeats
    with pytest.raises(ValueError, match="not visible"):
        resolve_devices("gpu", [2])
    assert resolve_devices("interpreter", None) == [None]  # no pinning: nothing changes
    assert parse_devices("0, 1") == [0, 1]
    with pytest.raises(ValueError, match="--devices"):
        parse_devices("gpu0")


def test_the_cli_refuses_bad_devices_in_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from kernelsmith.cli.main import app

    db = tmp_path / "never.db"
    result = CliRunner().invoke(app, ["tune", "rmsnorm", "--devices", "gpu0", "--db", str(db)])
    assert result.exit_code == 2 and "expected device numbers" in result.output
    assert not db.exists()
