"""kernelsmith.settings: one table of every KERNELSMITH_* variable, one true/false rule, the
``kernelsmith env`` view, and a README that lists exactly these variables."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kernelsmith import settings
from kernelsmith.cli.main import app
from kernelsmith.settings import SETTINGS, SettingError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("text", ["1", "true", "TRUE", " yes ", "On"])
def test_true_words(text: str) -> None:
    assert settings.get("KERNELSMITH_FORCE_RETUNE", {"KERNELSMITH_FORCE_RETUNE": text}) is True


@pytest.mark.parametrize("text", ["0", "false", "No", " off"])
def test_false_words(text: str) -> None:
    assert settings.get("KERNELSMITH_CHECK", {"KERNELSMITH_CHECK": text}) is False


@pytest.mark.parametrize("name", [s.name for s in SETTINGS.values() if s.type == "bool"])
def test_every_switch_refuses_a_word_that_is_neither(name: str) -> None:
    with pytest.raises(SettingError, match=name) as caught:
        settings.get(name, {name: "flase"})
    assert "flase" in str(caught.value) and isinstance(caught.value, ValueError)


def test_unset_or_empty_is_the_default() -> None:
    for s in SETTINGS.values():
        assert settings.get(s.name, {}) == s.default
        assert settings.get(s.name, {s.name: "  "}) == s.default
        assert settings.source(s.name, {}) == "default"


def test_numbers_and_choices() -> None:
    assert settings.get("KERNELSMITH_CHECK_RATE", {"KERNELSMITH_CHECK_RATE": "0.01"}) == 0.01
    with pytest.raises(SettingError, match="KERNELSMITH_CHECK_FIRST='three' is not an integer"):
        settings.get("KERNELSMITH_CHECK_FIRST", {"KERNELSMITH_CHECK_FIRST": "three"})
    assert settings.get("KERNELSMITH_MODE", {"KERNELSMITH_MODE": "DB"}) == "db"
    with pytest.raises(SettingError, match="KERNELSMITH_MODE='fast' is not one of tune, db, background"):
        settings.get("KERNELSMITH_MODE", {"KERNELSMITH_MODE": "fast"})
    with pytest.raises(KeyError, match="not a kernelsmith setting"):
        settings.get("KERNELSMITH_NOPE")


def test_the_interpreter_is_asked_for_by_either_variable_with_the_same_rule() -> None:
    assert settings.interpreter_requested({"KERNELSMITH_INTERPRET": "yes"})
    assert settings.interpreter_requested({"TRITON_INTERPRET": "1"})
    assert not settings.interpreter_requested({"KERNELSMITH_INTERPRET": "0", "TRITON_INTERPRET": "0"})
    assert not settings.interpreter_requested({})


def test_every_kernelsmith_variable_the_package_reads_is_a_setting() -> None:
    """Every KERNELSMITH_* name in the package's source is a setting, and no module reads one from
    the environment directly: only settings.py does. (The planted bad kernels are an attacker's
    code, which reads what it likes.)"""
    reads = re.compile(
        r"os\.(environ\.get|getenv)\(\s*['\"]KERNELSMITH_"  # os.environ.get("KERNELSMITH_X"), os.getenv(...)
        r"|os\.environ\[['\"]KERNELSMITH_\w+['\"]\](?!\s*=)"  # os.environ["KERNELSMITH_X"], not assigned to
    )
    names: set[str] = set()
    direct: list[str] = []
    for path in (ROOT / "src" / "kernelsmith").rglob("*.py"):
        if path.name == "settings.py" or "bad_kernels" in path.parts:  # the definitions; an attacker's code
            continue
        text = path.read_text()
        names |= set(re.findall(r"KERNELSMITH_[A-Z_]*[A-Z]", text))
        if reads.search(text):
            direct.append(str(path.relative_to(ROOT)))
    assert names - set(SETTINGS) == set()
    assert direct == []


def test_the_readme_documents_every_variable() -> None:
    """The README's table is :func:`settings.markdown_table` exactly (regenerate it from there)."""
    readme = (ROOT / "README.md").read_text()
    start, end = "<!-- settings table: kernelsmith.settings.markdown_table() -->", "<!-- end settings table -->"
    assert start in readme and end in readme, "the README lost its environment table's markers"
    table = readme.split(start, 1)[1].split(end, 1)[0].strip()
    assert table == settings.markdown_table(), "regenerate the README's table: kernelsmith env --markdown"


def test_env_command_shows_values_and_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNELSMITH_CHECK_RATE", "0.25")
    monkeypatch.setenv("KERNELSMITH_DATABSE", "typo.db")  # set, but no setting reads it
    result = CliRunner().invoke(app, ["env", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    rows = {row["name"]: row for row in data["settings"]}
    assert list(rows) == list(SETTINGS)
    assert rows["KERNELSMITH_CHECK_RATE"]["value"] == 0.25 and rows["KERNELSMITH_CHECK_RATE"]["source"] == "environment"
    assert rows["KERNELSMITH_FORCE_RETUNE"] == {**rows["KERNELSMITH_FORCE_RETUNE"], "value": False, "source": "default"}
    assert rows["KERNELSMITH_DB"]["source"] == "environment"  # tests/conftest.py isolates the database
    assert data["unknown"] == ["KERNELSMITH_DATABSE"]

    table = CliRunner().invoke(app, ["env"])
    assert table.exit_code == 0 and "KERNELSMITH_REQUIRE_TUNED" in table.stdout


def test_env_command_names_a_bad_value_and_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNELSMITH_CHECK", "maybe")
    result = CliRunner().invoke(app, ["env", "--json"])
    assert result.exit_code == 2
    (row,) = [r for r in json.loads(result.stdout)["settings"] if r["name"] == "KERNELSMITH_CHECK"]
    assert row["value"] == "maybe" and "KERNELSMITH_CHECK='maybe'" in row["error"]


def test_env_command_never_shows_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNELSMITH_WEBHOOK_URL", "https://discord.com/api/webhooks/123/s3cret-token")
    monkeypatch.setenv("KERNELSMITH_DB", "postgresql://me:hunter2@db.example:5432/kernelsmith")
    result = CliRunner().invoke(app, ["env", "--json"])
    assert result.exit_code == 0 and "s3cret" not in result.stdout and "hunter2" not in result.stdout
    rows = {row["name"]: row for row in json.loads(result.stdout)["settings"]}
    assert rows["KERNELSMITH_WEBHOOK_URL"]["value"] == "https://discord.com/…"
    assert rows["KERNELSMITH_DB"]["value"] == "postgresql://db.example:5432/…"


def test_env_command_prints_the_readme_table() -> None:
    result = CliRunner().invoke(app, ["env", "--markdown"])
    assert result.exit_code == 0 and result.stdout.strip() == settings.markdown_table()
