"""The Ray executor on a local Ray cluster started by the test (2 CPUs, no dashboard).

Tuning in interpreter mode with ``executor="ray"`` must decide what the local pool decides with
the same seed, and an actor killed in the middle of the run (``ray.kill``) must cost a retry on
another actor, never the run. Interpreter timings are noise, but the interpreter's decision is
not: eager PyTorch always beats an interpreted kernel, so both runs keep the baseline; what is
compared besides is deterministic (the grid's candidates evaluated and each one's status).
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from kernelsmith import tuner  # noqa: E402
from kernelsmith.evaluate.executor import ExecutorUnavailable, check_executor  # noqa: E402
from kernelsmith.evaluate.ray_executor import MISSING_RAY, RayExecutor, import_ray  # noqa: E402
from kernelsmith.ops import get_op  # noqa: E402

SPEC = get_op("rmsnorm").spec((4, 64), "float32")
BUDGET = 3


@pytest.fixture(scope="module")
def cluster() -> Any:
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    yield ray
    ray.shutdown()


def _tune(db: str, **where: Any) -> tuner.TuneResult:
    return tuner.tune_spec(SPEC, budget=BUDGET, strategy="grid", db=db, seed=0, workers=2, **where)


def _evaluated(db: str) -> set[tuple[str, str, str]]:
    """(variant, config, status) of every trial stored: what was evaluated, and how it went."""
    from kernelsmith.db import open_database

    database = open_database(db)
    try:
        return {
            (t.variant, repr(sorted(t.config.items())), t.status) for t in database.trials(workload=SPEC.workload_hash)
        }
    finally:
        database.close()


@pytest.fixture(scope="module")
def runs(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One local run, and one Ray run during which one busy actor is killed."""
    folder = tmp_path_factory.mktemp("ray")
    local = _tune(str(folder / "local.db"))

    executors: list[RayExecutor] = []
    real_make = tuner.make_executor

    def spying_make(*args: Any, **kwargs: Any) -> Any:
        executor = real_make(*args, **kwargs)
        executors.append(executor)  # type: ignore[arg-type]
        return executor

    killed = threading.Event()

    def progress(done: int, total: int, best: Any) -> None:
        # The first result is in; the other actor is still evaluating its candidate: kill it.
        if not killed.is_set():
            killed.set()
            ray.kill(executors[0].actors[-1], no_restart=True)

    tuner.make_executor = spying_make  # type: ignore[assignment]
    try:
        remote = tuner.tune_spec(
            SPEC, budget=BUDGET, strategy="grid", db=str(folder / "ray.db"), seed=0, workers=2,
            executor="ray", progress=progress,
        )  # fmt: skip
    finally:
        tuner.make_executor = real_make  # type: ignore[assignment]
    return {"local": local, "ray": remote, "executor": executors[0], "killed": killed.is_set(), "folder": folder}


def test_the_ray_executor_decides_what_the_local_pool_decides(runs: dict[str, Any]) -> None:
    local, remote = runs["local"], runs["ray"]
    assert remote.winner == local.winner == "baseline"  # the interpreter's decision: see the docstring
    assert remote.evaluations == local.evaluations == BUDGET
    assert remote.failures == local.failures == {}
    # The same candidates evaluated, each with the same validation status.
    folder = runs["folder"]
    assert _evaluated(str(folder / "ray.db")) == _evaluated(str(folder / "local.db"))
    assert len(_evaluated(str(folder / "ray.db"))) >= BUDGET


def test_a_killed_actor_costs_a_retry_not_the_run(runs: dict[str, Any]) -> None:
    executor: RayExecutor = runs["executor"]
    assert runs["killed"] and executor.lost_actors == 1
    assert runs["ray"].evaluations == BUDGET and runs["ray"].failures == {}  # retried elsewhere, and ok


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_address_is_one_line_before_any_work() -> None:
    with pytest.raises(ExecutorUnavailable, match=r"cannot reach the Ray cluster at ray://127\.0\.0\.1") as caught:
        check_executor("ray", f"ray://127.0.0.1:{_free_port()}")
    assert "\n" not in str(caught.value)
    with pytest.raises(ValueError, match="executor must be one of"):
        check_executor("dask")


def test_without_ray_the_message_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` sees when it is not installed
    with pytest.raises(ImportError) as caught:
        import_ray()
    assert str(caught.value) == MISSING_RAY and "pip install -e '.[ray]'" in MISSING_RAY


def test_the_cli_reports_an_unreachable_cluster_in_one_line_and_writes_nothing(tmp_path: Any) -> None:
    from typer.testing import CliRunner

    from kernelsmith.cli.main import app

    db = tmp_path / "never.db"
    address = f"ray://127.0.0.1:{_free_port()}"
    result = CliRunner().invoke(
        app, ["tune", "rmsnorm", "--executor", "ray", "--ray-address", address, "--db", str(db)]
    )
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot reach the Ray cluster" in lines[0]
    assert not db.exists()  # refused before the database was opened
