"""The splits of ``dispatch.py`` and ``evaluate/worker.py`` (issue 15) keep what others rely on.

``kernelsmith.dispatch`` is the front page of four modules: tests and frontends replace
``build_runner``'s helpers and the op's table on it, so those replacements must reach the code
that calls them. ``kernelsmith.evaluate.worker`` is the entry of three modules of harness code:
each must be sealed against tampering (rule 10), as the single module was.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from kernelsmith import dispatch
from kernelsmith.db import DecisionRecord
from kernelsmith.evaluate import validate as validate_module
from kernelsmith.ops import get_op
from kernelsmith.space import Config

FAMILY = get_op("rmsnorm")
SPEC = FAMILY.spec((8, 64), "float32")


def _launcher(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
    raise AssertionError("built, never launched")


def test_helpers_replaced_on_dispatch_reach_build_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel file's decision: the trust refusals and the loading that ``build_runner`` calls
    are looked up on ``kernelsmith.dispatch``, where tests replace them."""
    calls: list[str] = []

    def build(spec: Any, config: Config) -> Any:
        calls.append("build")
        return _launcher

    monkeypatch.setattr(dispatch, "refuse_untrusted_source", lambda op, h, db=None: calls.append(f"trust {h}"))
    monkeypatch.setattr(dispatch, "refuse_unservable", lambda op, decision: calls.append("servable"))
    monkeypatch.setattr(dispatch, "load_stored_source", lambda op, h, db=None: calls.append(f"load {h}") or build)
    decision = DecisionRecord("fp", SPEC.workload_hash, "rmsnorm", SPEC.to_dict(), "kernel", "agent", "abc123",
                              {"num_warps": 4})  # fmt: skip
    runner = dispatch.build_runner(FAMILY, SPEC, decision)
    assert calls == ["trust abc123", "servable", "load abc123", "build"]
    assert runner.launcher is _launcher and runner.variant == "agent" and runner.source_hash == "abc123"


def test_the_table_replaced_on_dispatch_is_the_one_served(monkeypatch: pytest.MonkeyPatch) -> None:
    """``install_runner`` writes and ``runner_for`` reads ``dispatch._RUNNERS`` by its current binding."""
    table: dict[tuple[Any, ...], Any] = {}
    monkeypatch.setattr(dispatch, "_RUNNERS", table)
    inputs = list(FAMILY.make_inputs(SPEC, 0, FAMILY.distributions[0], torch.device("cpu")))
    constants = dispatch.constants_json(SPEC.constants)
    runner = dispatch.KernelRunner.build(FAMILY, SPEC, _launcher, "test", Config())
    dispatch.install_runner("rmsnorm", inputs, constants, runner)
    (served,) = table.values()
    assert isinstance(served, dispatch.CheckedRunner) and served.runner is runner
    assert dispatch.runner_for("rmsnorm", inputs, constants) is served


def test_the_worker_module_keeps_the_names_others_import() -> None:
    """``python -m kernelsmith.evaluate.worker`` runs ``main``; tests and the testing harness
    import the rest from the worker module, and ``in_validation`` compares code objects."""
    from kernelsmith.evaluate import _worker_candidates, _worker_timing, worker

    assert callable(worker.main) and callable(worker.serve) and callable(worker.Worker.handle)
    assert worker._compile is _worker_candidates._compile and worker._Loaded is _worker_candidates._Loaded
    assert worker._time is _worker_timing._time
    assert worker.compile_needs_lock is _worker_candidates.compile_needs_lock
    assert worker.COMPILE_UNLOCKED_SHARE == 0.02
    assert worker.COMPILE_UNAVAILABLE == "torch.compile baseline unavailable"


@pytest.mark.parametrize(("module_name", "name"), [
    ("kernelsmith.evaluate.worker", "validate"),
    ("kernelsmith.evaluate._worker_candidates", "run_checked"),
    ("kernelsmith.evaluate._worker_timing", "errors"),
])  # fmt: skip
def test_rebinding_a_global_of_each_worker_module_is_tampering(
    module_name: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rule 10 covers every module of the worker: a global the worker's code looks up (the
    timing code's ``errors``, say), rebound after the seal, is reported as tampering."""
    module = importlib.import_module(module_name)
    monkeypatch.setattr(validate_module, "_SEALED", {})
    validate_module.seal_harness()
    monkeypatch.setattr(module, name, object())
    assert f"{module_name}.{name}" in validate_module.tampered_bindings()
