"""The package as a PyTorch user meets it: names that do not clash, real signatures, one base
exception, type hints shipped, install hints that name the right package, the logger under
KERNELSMITH_LOG from Python, an honest TuneResult, and a backend that says when it did nothing."""

from __future__ import annotations

import inspect
import logging
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

import kernelsmith

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "kernelsmith"


# ---- names and signatures -------------------------------------------------------------------------


def test_op_families_is_a_function_and_ops_the_subpackage_whatever_was_imported():
    import kernelsmith.ops.rmsnorm

    assert inspect.ismodule(kernelsmith.ops) and kernelsmith.ops.__name__ == "kernelsmith.ops"
    assert kernelsmith.op_families() == kernelsmith.ops.op_names()
    assert {"rmsnorm", "softmax"} <= set(kernelsmith.op_families())


@pytest.mark.parametrize("name", ["optimize", "optimize_model", "backend"])
def test_public_functions_have_real_signatures(name):
    signature = inspect.signature(getattr(kernelsmith, name))
    assert not [p for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD], signature
    assert len(signature.parameters) >= 3  # the engine's own options, by name


def test_tune_is_the_engine_function_and_only_takes_op_constants_as_keywords():
    from kernelsmith import tuner

    assert kernelsmith.tune is tuner.tune
    var_keyword = [p.name for p in inspect.signature(kernelsmith.tune).parameters.values() if p.kind is p.VAR_KEYWORD]
    assert var_keyword == ["constants"]  # eps=..., dim=...: the op's own constants
    assert {"budget", "strategy", "db", "devices"} <= set(inspect.signature(kernelsmith.tune).parameters)


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        kernelsmith.nope  # noqa: B018


# ---- exceptions ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "builtin"),
    [
        ("UnsupportedWorkload", ValueError),
        ("UnknownOpError", ValueError),
        ("DatabaseError", RuntimeError),
        ("BrokenDatabaseError", RuntimeError),
        ("NotTunedError", LookupError),
        ("SettingError", ValueError),
        ("ExecutorUnavailable", RuntimeError),
        ("KernelFileError", ValueError),
        ("WorkspaceError", Exception),
        ("LLMError", RuntimeError),
    ],
)
def test_exceptions_share_one_base_and_keep_their_builtin_one(name, builtin):
    exception = getattr(kernelsmith, name)
    assert name in kernelsmith.__all__
    assert issubclass(exception, kernelsmith.KernelsmithError) and issubclass(exception, builtin)


def test_a_real_error_is_caught_by_the_base():
    with pytest.raises(kernelsmith.KernelsmithError, match="unknown op"):
        kernelsmith.tune("not_an_op", torch.zeros(2, 2))


# ---- TuneResult -----------------------------------------------------------------------------------


def _decision(winner: str):
    from kernelsmith.db import DecisionRecord

    return DecisionRecord(
        "fp", "wl", "rmsnorm", {"inputs": []}, winner, "rows", "src", {"BLOCK": 1024},
        metrics={"speedup": 0.97 if winner == "baseline" else 1.4, "median_us": 10.0, "baseline_median_us": 9.7},
    )  # fmt: skip


def test_best_config_is_empty_when_the_baseline_wins_and_the_candidate_stays_on_record():
    from kernelsmith.db import current_fingerprint
    from kernelsmith.tuner import _result_from_decision

    fp = current_fingerprint("interpreter")
    lost = _result_from_decision(_decision("baseline"), fp, from_database=True, evaluations=0)
    assert isinstance(lost, kernelsmith.TuneResult)
    assert lost.winner == "baseline" and lost.best_config == {} and lost.variant == ""
    assert lost.candidate_variant == "rows" and lost.candidate_config == {"BLOCK": 1024}
    assert lost.baseline == "eager"
    won = _result_from_decision(_decision("kernel"), fp, from_database=True, evaluations=0)
    assert won.best_config == {"BLOCK": 1024} and won.variant == "rows"


# ---- typing and packaging -------------------------------------------------------------------------


def test_py_typed_is_shipped():
    assert (PACKAGE / "py.typed").is_file()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["kernelsmith"]


def test_extras_table_matches_pyproject():
    from kernelsmith.extras import EXTRAS

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    as_names = {
        extra: tuple(re.split(r"[<>=!~ ]", requirement)[0] for requirement in requirements)
        for extra, requirements in declared.items()
        if extra != "dev"
    }
    assert as_names == EXTRAS


def test_no_message_tells_the_user_to_install_the_other_kernelsmith_distribution():
    """``pip install 'kernelsmith[...]'`` installs an unrelated distribution from the index."""
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in [*PACKAGE.rglob("*.py"), ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"pip install '?kernelsmith\[", line)
    ]
    assert offenders == []


def test_a_missing_optuna_names_the_package(monkeypatch):
    from kernelsmith.strategies.tpe import import_optuna

    monkeypatch.setitem(sys.modules, "optuna", None)  # import fails as if not installed
    with pytest.raises(ImportError) as caught:
        import_optuna()
    assert "pip install optuna" in str(caught.value) and "pip install -e '.[search]'" in str(caught.value)


# ---- the logger -----------------------------------------------------------------------------------


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "KERNELSMITH_LOG"} | env
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=120, cwd=ROOT, check=False
    )


LOGS = (
    "import logging, kernelsmith\n"
    "logging.getLogger('kernelsmith.frontends.backend').info('site replaced')\n"
    "logging.getLogger('kernelsmith.tuner').debug('a detail')\n"
    "assert logging.getLogger().handlers == [], 'the root logger was touched'\n"
)


def test_kernelsmith_log_works_from_python_without_touching_the_root_logger():
    shown = _python(LOGS, KERNELSMITH_LOG="info")
    assert shown.returncode == 0, shown.stderr
    assert "INFO kernelsmith.frontends.backend: site replaced" in shown.stderr and "a detail" not in shown.stderr
    quiet = _python(LOGS)
    assert quiet.returncode == 0, quiet.stderr
    assert "site replaced" not in quiet.stderr


def test_a_bad_kernelsmith_log_value_does_not_break_import():
    result = _python("import kernelsmith", KERNELSMITH_LOG="loud")
    assert result.returncode == 0 and "KERNELSMITH_LOG='loud'" in result.stderr


def test_configure_installs_one_handler_and_none_restores():
    from kernelsmith import logs

    package = logging.getLogger("kernelsmith")
    restore = logs.saved_state()
    try:
        logs.configure("info")
        logs.configure("debug")
        ours = [h for h in package.handlers if h.name == logs.HANDLER_NAME]
        assert len(ours) == 1 and package.level == logging.DEBUG and not package.propagate
        logs.configure(None)
        assert not [h for h in package.handlers if h.name == logs.HANDLER_NAME] and package.propagate
    finally:
        restore()


# ---- the compile backend says when it replaced nothing --------------------------------------------


def test_backend_warns_once_when_nothing_is_tuned(monkeypatch, caplog):
    from kernelsmith.frontends import backend as ks_backend

    monkeypatch.setattr(ks_backend, "_warned_nothing_replaced", False)
    monkeypatch.setattr(ks_backend.KernelsmithBackend, "_inductor", lambda self, gm, inputs: gm.forward)

    def rmsnorm(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w

    x, w = torch.randn(8, 64), torch.randn(64)
    torch._dynamo.reset()
    with caplog.at_level(logging.WARNING, logger="kernelsmith"):
        compiled = torch.compile(rmsnorm, backend=ks_backend.KernelsmithBackend(), dynamic=False)
        torch.testing.assert_close(compiled(x, w), rmsnorm(x, w))
        compiled(torch.randn(4, 32), torch.randn(32))  # a second graph: no second warning
    warnings = [r.getMessage() for r in caplog.records if "replaced nothing" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "not tuned" in warnings[0] and "kernelsmith optimize" in warnings[0] and "'tune': True" in warnings[0]
    torch._dynamo.reset()
