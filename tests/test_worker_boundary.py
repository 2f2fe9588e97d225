"""The worker boundary (issue 12, parts 2 and 6): replies are schema-checked data, decisive runs
happen in fresh workers, and a worker cannot hurt the machine.

The misbehaving workers are :mod:`kernelsmith.testing.hostile_worker`: each breaks the protocol
in one way the issue found (garbage, a crafted pickle, a forged verdict, a daemon left running),
so the caller's side is tested against exactly those bytes. CPU only; the GPU side is in
tests/gpu/test_worker_boundary_gpu.py.
"""

from __future__ import annotations

import json
import os
import pickle
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelsmith.db import current_fingerprint, open_database
from kernelsmith.evaluate import sandbox
from kernelsmith.evaluate.confirm import BASELINE_SLOWDOWN, MIN_SLOWDOWN_US, baseline_slowdown, judge
from kernelsmith.evaluate.pool import Evaluator, WorkerLost, WorkerProcess
from kernelsmith.evaluate.protocol import (
    Candidate,
    CeilingRequest,
    EvalRequest,
    EvalResult,
    ProtocolError,
    TimingSettings,
    WorkerReply,
    decode_reply,
    decode_request,
    encode_reply,
    encode_request,
)
from kernelsmith.ops import get_op
from kernelsmith.space import Config
from kernelsmith.testing import hostile_worker
from kernelsmith.testing.bad_kernels import source
from kernelsmith.tuner import _Search

HOSTILE = "kernelsmith.testing.hostile_worker"
RMSNORM = get_op("rmsnorm").spec((16, 64), "float32")
BUILTIN = Candidate(get_op("rmsnorm").variants[0].name, Config(num_warps=4))
REQUEST = EvalRequest(RMSNORM.to_dict(), (BUILTIN,), "interpreter", TimingSettings.interpreter())
GIB = 1 << 30


def _hostile(tmp_path: Path, *args: str, mode: str = "interpreter", memory_cap: int = 4 * GIB) -> WorkerProcess:
    return WorkerProcess(mode, str(tmp_path), memory_cap, command=(HOSTILE, *args))


# ---- the schema ---------------------------------------------------------------------------------
def _ok_reply(**metrics: object) -> WorkerReply:
    return WorkerReply((EvalResult(BUILTIN, "ok", metrics={"median_us": 2.0, **metrics}, seconds=1.5),))


def test_requests_and_replies_round_trip_as_json() -> None:
    assert decode_request(encode_request(REQUEST)) == REQUEST
    assert decode_request(encode_request(CeilingRequest(1 << 20, 3))) == CeilingRequest(1 << 20, 3)
    reply = WorkerReply(_ok_reply(samples_us=[1.0, 2.5], timer="cuda-events").results, baseline={"median_us": 3.0})
    assert decode_reply(encode_reply(reply), REQUEST) == reply
    assert json.loads(encode_reply(reply))["kind"] == "reply"  # plain JSON on the wire


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda r: r["results"][0].update(status="great"), "status is 'great'"),
        (lambda r: r["results"][0]["metrics"].update(median_us="fast"), "median_us"),
        (lambda r: r["results"][0]["metrics"].update(code={"a": 1}), "not a finite number"),
        (lambda r: r["results"][0]["metrics"].update(samples_us=[1.0, "x"]), "samples_us"),
        (lambda r: r["results"][0]["metrics"].update(timer="x" * 500), "characters"),
        (lambda r: r["results"][0].update(seconds=True), "not a finite number"),
        (lambda r: r["results"][0].update(extra=1), "unknown fields 'extra'"),
        (lambda r: r.update(recycle="no"), "recycle is a str"),
        (lambda r: r.update(results=[]), "0 results for 1 candidates"),
        (lambda r: r["results"][0]["candidate"].update(source="def build(): ..."), "answers for"),
        (lambda r: r["results"][0]["candidate"]["config"].update(num_warps=[4]), "not a plain value"),
    ],
)
def test_a_reply_off_the_schema_is_refused_naming_what_is_wrong(change, says) -> None:
    body = _ok_reply().to_json()
    change(body)
    data = json.dumps({"kind": "reply", "reply": body}).encode()
    with pytest.raises(ProtocolError, match=says):
        decode_reply(data, REQUEST)


def test_non_finite_numbers_and_non_json_are_refused() -> None:
    body = _ok_reply().to_json()
    body["results"][0]["metrics"]["median_us"] = float("nan")
    with pytest.raises(ProtocolError, match="finite"):
        decode_reply(json.dumps({"kind": "reply", "reply": body}).encode(), REQUEST)
    for data in (b"\xff\xfe", b"[" * 100_000, b'"just a string"', pickle.dumps({"kind": "reply"})):
        with pytest.raises(ProtocolError):
            decode_reply(data, REQUEST)


# ---- the caller's side, against a hostile worker ----------------------------------------------------
def test_the_crafted_pickle_would_create_its_file(tmp_path: Path) -> None:
    """The control for the pickle test below: unpickled, these bytes do create the file."""
    marker = tmp_path / "unpickled"
    pickle.loads(hostile_worker.crafted_pickle(str(marker)))  # that is the point: it runs code
    assert marker.exists()


@pytest.mark.parametrize(
    ("mode", "kind", "says"),
    [
        ("garbage", "crash", "not a JSON message"),
        ("unframed", "crash", "message of 1751477356 bytes"),
        ("pickle", "crash", "not a JSON message"),
        ("truncated", "crash", "not a JSON message"),
        ("oversize", "crash", f"message of {16 * 2**20 + 1} bytes"),
        ("wrong_types", "crash", "median_us"),
        ("unknown_field", "crash", "unknown fields 'exec'"),
        ("other_candidate", "crash", "answers for forged"),
        ("stalls", "timeout", "no answer within the time limit"),
    ],
)
def test_a_malformed_reply_is_a_failure_record(mode: str, kind: str, says: str, tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    args = (mode, str(marker)) if mode == "pickle" else (mode,)
    with Evaluator("interpreter", workers=1, timeout_s=3, worker=(HOSTILE, *args)) as evaluator:
        [result] = evaluator.evaluate(RMSNORM, [BUILTIN])
    assert result.status == kind, result.error
    assert says in result.error
    assert result.candidate == BUILTIN
    assert not marker.exists()  # the pickle was never loaded


def test_a_worker_that_sent_garbage_is_killed(tmp_path: Path) -> None:
    worker = _hostile(tmp_path, "garbage")
    worker.start()
    pid = worker.proc.pid if worker.proc else 0
    with pytest.raises(WorkerLost, match="malformed"):
        worker.call(REQUEST, 10)
    assert not sandbox.alive(pid)
    assert worker.home == ""  # its private home is gone too


# ---- the decisive run -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def forging_evaluator() -> Iterator[Evaluator]:
    """A pool whose workers say every candidate is correct and 100x faster than the baseline."""
    with Evaluator("interpreter", workers=1, timeout_s=300, worker=(HOSTILE, "forge_ok")) as evaluator:
        yield evaluator


def test_a_forged_verdict_does_not_survive_the_confirmation(forging_evaluator: Evaluator) -> None:
    wrong = Candidate("planted", Config(num_warps=4), source("writes_zeros"))
    [forged] = forging_evaluator.evaluate(RMSNORM, [wrong])
    assert forged.ok and forged.metrics["baseline_median_us"] == 100.0  # the pool was fooled
    confirmation = forging_evaluator.confirm(RMSNORM, [wrong])
    [checked] = confirmation.results
    assert checked.status == "validate", checked.error  # the real worker, in a fresh process
    assert confirmation.disagreement(0).startswith("validate")
    assert confirmation.clean_baseline["median_us"] > 0  # and the clean baseline was timed


def test_the_tuner_does_not_keep_a_forged_winner(forging_evaluator: Evaluator, tmp_path: Path) -> None:
    family = get_op("rmsnorm")
    fp = current_fingerprint("interpreter")
    wrong = Candidate("llm", Config(num_warps=4), source("writes_zeros"))
    with open_database(str(tmp_path / "k.db")) as db:
        db.put_fingerprint(fp)
        search = _Search(family, RMSNORM, fp, db, forging_evaluator, None)
        [forged] = forging_evaluator.evaluate(RMSNORM, [wrong])
        search.results.append(forged)
        decision = search.decide("test", None)
        assert decision.winner == "baseline"
        assert "not confirmed in a fresh worker" in decision.metrics["note"]
        assert search.winner_source == ""
        trials = db.trials(fp.hash)
        assert [t.status for t in trials] == ["validate"]  # the failure is recorded, not the forgery


def _timed(samples: list[float], baseline: list[float]) -> EvalResult:
    metrics = {"samples_us": samples, "baseline_samples_us": baseline, "timer": "stub"}
    return EvalResult(Candidate("planted", Config(num_warps=4), "kernel text"), "ok", metrics=metrics)


def test_a_baseline_slowed_beside_the_candidate_is_a_cheat() -> None:
    alone = [10.0 + 0.1 * (i % 5) for i in range(40)]
    slowed = [x * 1.5 for x in alone]
    assert "slower beside this candidate" in baseline_slowdown(slowed, alone)
    confirmation = judge(get_op("rmsnorm"), RMSNORM, [_timed([6.0] * 40, slowed)], {"samples_us": alone}, "", None)
    assert confirmation.results[0].status == "cheat"
    assert "the baseline ran slower beside this candidate" in confirmation.results[0].error
    assert confirmation.disagreement(0).startswith("cheat")


def test_noise_in_either_baseline_is_not_a_cheat() -> None:
    alone = [10.0 + 0.1 * (i % 5) for i in range(40)]
    assert baseline_slowdown([x * 1.1 for x in alone], alone) == ""  # drift well inside the margin
    spikes = [x * (3.0 if i % 10 == 0 else 1.0) for i, x in enumerate(alone)]
    assert baseline_slowdown(spikes, alone) == ""  # a few stray slow rounds
    noisy_alone = [x * (2.0 if i % 4 == 0 else 1.0) for i, x in enumerate(alone)]
    assert baseline_slowdown([x * (BASELINE_SLOWDOWN + 0.1) for x in alone], noisy_alone) == ""


def test_launch_overhead_sized_differences_and_the_interpreter_are_not_judged() -> None:
    """Under MIN_SLOWDOWN_US the difference is the size of host-side noise between processes,
    and in the interpreter the baseline beside a kernel is always slower (cold caches)."""
    tiny = [2.0 + 0.01 * (i % 3) for i in range(40)]
    assert baseline_slowdown([x + MIN_SLOWDOWN_US - 0.5 for x in tiny], tiny) == ""
    assert baseline_slowdown([x + MIN_SLOWDOWN_US + 0.5 for x in tiny], tiny) != ""
    alone = [50.0] * 40
    results = [_timed([6.0] * 40, [250.0] * 40)]
    interpreted = judge(get_op("rmsnorm"), RMSNORM, results, {"samples_us": alone}, "", None, check_slowdown=False)
    assert interpreted.results[0].ok and interpreted.disagreement(0) == ""


def test_a_small_slowdown_does_not_buy_a_win_against_the_clean_baseline() -> None:
    """Slowing the baseline by 20% (under the cheat line) makes a kernel 10% slower than the
    baseline look faster beside it; the clean baseline still says no."""
    alone = [10.0 + 0.01 * (i % 7) for i in range(40)]
    beside = [x * 1.2 for x in alone]
    confirmation = judge(get_op("rmsnorm"), RMSNORM, [_timed([11.0] * 40, beside)], {"samples_us": alone}, "", None)
    assert confirmation.results[0].ok
    assert "not faster than the baseline timed alone" in confirmation.disagreement(0)


def test_figures_are_recomputed_from_samples_and_the_bytes_model() -> None:
    alone = [10.0] * 40
    result = _timed([5.0] * 40, [10.0] * 40)
    result = EvalResult(result.candidate, "ok", metrics={**result.metrics, "median_us": 0.001, "gbps": 1e9})
    [checked] = judge(get_op("rmsnorm"), RMSNORM, [result], {"samples_us": alone}, "", None).results
    assert checked.metrics["median_us"] == 5.0
    assert checked.metrics["gbps"] == pytest.approx(get_op("rmsnorm").bytes_moved(RMSNORM) / 5e-6 / 1e9)
    copy = checked.metrics["gbps"] / 2  # a device that copies slower than the claim: a cheat
    [capped] = judge(get_op("rmsnorm"), RMSNORM, [result], {"samples_us": alone}, "", copy).results
    assert capped.status == "cheat" and "copy bandwidth" in capped.error


def test_without_a_clean_baseline_nothing_is_confirmed() -> None:
    confirmation = judge(get_op("rmsnorm"), RMSNORM, [_timed([5.0] * 40, [10.0] * 40)], {}, "worker died", None)
    assert confirmation.results[0].status == "skipped"
    assert "could not be timed alone" in confirmation.disagreement(0)


# ---- a worker that cannot hurt the machine -------------------------------------------------------
def _pid_in(path: Path) -> int:
    deadline = time.monotonic() + 10
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, "the daemon never started"
        time.sleep(0.05)
    return int(path.read_text())


def test_a_daemon_left_by_a_request_is_ended_after_it(tmp_path: Path) -> None:
    pidfile = tmp_path / "daemon.pid"
    worker = _hostile(tmp_path, "daemon", str(pidfile))
    try:
        reply = worker.call(REQUEST, 60)
        assert reply.results[0].error == "planted: left a daemon"
        daemon = _pid_in(pidfile)
        assert worker.proc is not None and worker.proc.poll() is None  # the worker lives on
        assert not sandbox.alive(daemon)
    finally:
        worker.kill()


def test_a_daemon_is_ended_with_a_worker_that_is_killed(tmp_path: Path) -> None:
    pidfile = tmp_path / "daemon.pid"
    worker = _hostile(tmp_path, "daemon_hangs", str(pidfile))
    worker.start()
    with pytest.raises(WorkerLost, match="no answer within"):
        worker.call(REQUEST, 4)
    daemon = _pid_in(pidfile)
    deadline = time.monotonic() + 5
    while sandbox.alive(daemon) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not sandbox.alive(daemon)


def test_the_address_space_cap_stops_an_allocation(tmp_path: Path) -> None:
    worker = _hostile(tmp_path, "hog", "3072", memory_cap=GIB)
    try:
        worker.start()
        assert worker.proc is not None
        limits = Path(f"/proc/{worker.proc.pid}/limits").read_text()
        [line] = [x for x in limits.splitlines() if x.startswith("Max address space")]
        assert int(line.split()[3]) == sandbox.address_space_limit(GIB)
        [result] = worker.call(REQUEST, 30).results
        assert result.status == "runtime" and result.error == "MemoryError"
    finally:
        worker.kill()


def test_the_pool_kills_a_worker_above_its_resident_memory_cap(tmp_path: Path) -> None:
    """GPU mode has no address-space cap (CUDA reserves more than any cap): the pool watches."""
    worker = _hostile(tmp_path, "hog", "600", mode="gpu", memory_cap=300 << 20)
    with pytest.raises(WorkerLost, match=r"above the cap of 0\.3 GiB") as lost:
        worker.call(REQUEST, 60)
    assert lost.value.kind == "crash"


@pytest.fixture(scope="module")
def real_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    folder = tmp_path_factory.mktemp("pool")
    worker = WorkerProcess("interpreter", str(folder), 2 * GIB)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("KERNELSMITH_DB", str(folder / "user.db"))
        env.setenv("KERNELSMITH_WEBHOOK_URL", "https://example.invalid/hook")
        env.setenv("KERNELSMITH_LOG", "warning")
        worker.start()
    yield worker
    worker.close()


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_the_worker_lives_in_a_private_home(real_worker: WorkerProcess) -> None:
    assert real_worker.proc is not None
    pid = real_worker.proc.pid
    env = _environ(pid)
    home = real_worker.home
    assert os.readlink(f"/proc/{pid}/cwd") == home
    assert env["HOME"] == env["TMPDIR"] == env["TMP"] == home
    assert env["TRITON_CACHE_DIR"].startswith(home)
    assert home != os.path.expanduser("~") and not os.environ.get("HOME", "/nonexistent").startswith(home)
    assert "KERNELSMITH_DB" not in env
    assert "KERNELSMITH_WEBHOOK_URL" not in env
    assert env["KERNELSMITH_LOG"] == "warning"  # settings that point at no file pass
    assert os.getsid(pid) == pid  # its own session


def test_the_real_worker_is_capped_and_answers_in_json(real_worker: WorkerProcess) -> None:
    assert real_worker.proc is not None
    limits = Path(f"/proc/{real_worker.proc.pid}/limits").read_text()
    assert f"Max address space         {sandbox.address_space_limit(2 * GIB)}" in limits
    assert "Max core file size        0" in limits
    request = EvalRequest(RMSNORM.to_dict(), (), "interpreter", TimingSettings.interpreter())
    reply = real_worker.call(request, 120)  # no candidates: the baseline alone
    assert reply.results == () and reply.baseline["median_us"] > 0 and len(reply.baseline["samples_us"]) >= 4


def test_a_reply_json_cannot_hold_becomes_crash_records() -> None:
    from kernelsmith.evaluate.worker import _encoded

    unencodable = WorkerReply((EvalResult(BUILTIN, "ok", metrics={"median_us": object()}),))
    reply = decode_reply(_encoded(REQUEST, unencodable), REQUEST)
    assert reply.recycle and reply.results[0].status == "crash"
    assert "could not encode its reply" in reply.results[0].error
