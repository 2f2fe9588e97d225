"""Imported records are claims (DESIGN.md rule 13; issue 12, part 4).

- an imported decision is not served until this machine re-validated it in a worker
  (``kernelsmith db import`` does at once, ``--no-validate`` waits for ``db validate``);
- an imported kernel source is never parsed, loaded or run, in this process or a worker, until
  the user trusts it (``kernelsmith db trust``), and even then it must pass the kernel-file gate
  (a Python module with an honest hash is refused) and the harness before it is served;
- imported failure records ("cheat" for every built-in config) do not stop local tuning.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

import kernelsmith
from kernelsmith import dispatch
from kernelsmith.agent.templates import template_source
from kernelsmith.cli.main import app
from kernelsmith.db import DecisionRecord, TrialRecord, current_fingerprint, open_database, variant_source_hash
from kernelsmith.db.jsonl import export_jsonl, import_jsonl
from kernelsmith.ops import get_op
from kernelsmith.spec import OpSpec
from kernelsmith.testing.db_suite import GPU_FP

FP = current_fingerprint("interpreter")
runner = CliRunner()


def cli(*args: str) -> Any:
    return runner.invoke(app, list(args))


def hf_rmsnorm(x, weight, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def rmsnorm_bucket(rows: int = 8, width: int = 64) -> OpSpec:
    family = get_op("rmsnorm")
    return family.bucket(family.spec_for(torch.randn(rows, width), torch.randn(width), eps=1e-6))


def claim(bucket: OpSpec, *, variant: str | None = None, config: dict[str, Any] | None = None,
          source_hash: str | None = None, fingerprint: str = FP.hash) -> DecisionRecord:
    """A kernel decision as another machine would export it (a built-in variant by default)."""
    family = get_op(bucket.op)
    builtin = family.variants[0]
    return DecisionRecord(
        fingerprint, bucket.workload_hash, bucket.op, bucket.to_dict(), "kernel", variant or builtin.name,
        builtin.source_hash if source_hash is None else source_hash,
        builtin.space(bucket).configs()[0].to_dict() if config is None else config,
        {"speedup": 3.0, "note": "a claim"})


def export_file(path: Path, decisions: list[DecisionRecord] = (), sources: list[tuple[str, str]] = (),
                trials: list[TrialRecord] = ()) -> Path:
    """An export holding these records, written from a scratch database elsewhere."""
    with open_database(":memory:") as other:
        other.put_fingerprint(FP)
        other.put_fingerprint(GPU_FP)
        for op, text in sources:
            other.put_variant_source(op, text)
        for d in decisions:
            other.put_decision(d)
        other.add_trials(trials)
        with open(path, "w") as stream:
            export_jsonl(other, stream)
    return path


def import_claims(db: str, path: Path) -> dict[str, int]:
    """Import ``path`` through the library call, which stores claims and validates nothing."""
    with open_database(db) as database, open(path) as stream:
        return import_jsonl(database, stream)


def served(db: str, rows: int = 8, width: int = 64) -> tuple[Any, dict[str, int]]:
    """Call a decorated RMSNorm (database-only mode) a few times; returns its state and stats."""
    fn = kernelsmith.optimize(hf_rmsnorm, mode="db", db=db)
    x, w = torch.randn(rows, width), torch.randn(width)
    for _ in range(3):
        assert torch.allclose(fn(x, w), hf_rmsnorm(x, w), rtol=1e-4, atol=1e-5)
    return fn.kernelsmith, fn.kernelsmith.stats


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "claims.db")


def test_an_unvalidated_claim_is_not_served_by_any_front_door(db: str, tmp_path: Path, monkeypatch) -> None:
    bucket = rmsnorm_bucket()
    result = cli("db", "import", str(export_file(tmp_path / "x.jsonl", [claim(bucket)])), "--db", db, "--no-validate")
    assert result.exit_code == 0, result.output
    assert "not served until `kernelsmith db validate`" in result.output
    (listed,) = json.loads(cli("db", "list", "--db", db, "--json").stdout)
    assert listed["origin"] == "imported" and listed["validated"] is False
    state, stats = served(db)
    assert stats["kernel_calls"] == 0
    assert any("kernelsmith db validate" in reason for reason in state.reasons.values()), state.reasons
    monkeypatch.setenv("KERNELSMITH_DB", db)
    dispatch._RUNNERS.clear()
    x, w = torch.randn(8, 64), torch.randn(64)
    assert dispatch.runner_for("rmsnorm", [x, w], dispatch.constants_json({"eps": 1e-6})) is None
    dispatch._RUNNERS.clear()


def test_import_validates_this_machines_claims_in_a_worker(db: str, tmp_path: Path) -> None:
    good, bad = rmsnorm_bucket(8, 64), rmsnorm_bucket(8, 96)
    claims = [
        claim(good),
        claim(bad, config={"num_warps": 3}),  # outside the variant's space: the harness refuses it
        claim(good, fingerprint=GPU_FP.hash),  # another machine's: kept, unchecked
    ]
    result = cli("db", "import", str(export_file(tmp_path / "x.jsonl", claims)), "--db", db, "--workers", "1")
    assert result.exit_code == 0, result.output
    with open_database(db) as database:
        validated = database.get_decision(FP.hash, good.workload_hash)
        failed = database.get_decision(FP.hash, bad.workload_hash)
        elsewhere = database.get_decision(GPU_FP.hash, good.workload_hash)
    assert validated is not None and validated.servable and validated.claim_state == "validated"
    assert failed is not None and not failed.servable and "outside the variant's space" in failed.validation_error
    assert elsewhere is not None and elsewhere.claim_state == "unvalidated"
    assert "validated" in result.output and "failed" in result.output and "another machine" in result.output
    _, stats = served(db, 8, 64)
    assert stats["kernel_calls"] == 2  # the validated claim serves (after the first call's check)
    _, stats = served(db, 8, 96)
    assert stats["kernel_calls"] == 0  # the failed one never does


def test_db_validate_validates_claims_imported_without(db: str, tmp_path: Path) -> None:
    bucket = rmsnorm_bucket()
    import_claims(db, export_file(tmp_path / "x.jsonl", [claim(bucket)]))
    assert served(db)[1]["kernel_calls"] == 0
    result = cli("db", "validate", "--db", db, "--workers", "1")
    assert result.exit_code == 0 and "validated" in result.output, result.output
    assert served(db)[1]["kernel_calls"] == 2
    assert "no claims to validate" in cli("db", "validate", "--db", db).output


# ---- kernel sources ------------------------------------------------------------------------------


def malicious_module(marker: Path) -> str:
    """A Python kernel module whose hash is honest and whose import writes ``marker``: proof that
    it ran, in this process or any worker."""
    return (
        "import pathlib\n"
        f"pathlib.Path({str(marker)!r}).write_text('ran')\n"
        "\n"
        "def build(spec, config):\n"
        "    def launch(inputs, outputs):\n"
        "        outputs[0].copy_(inputs[0])\n"
        "    return launch\n"
    )


@pytest.fixture
def spied(monkeypatch) -> list[str]:
    """Records every attempt to parse, load or gate stored kernel text."""
    import kernelsmith.evaluate.kernel_file as kernel_file

    calls: list[str] = []
    for name in ("parse_kernel_file", "load_namespace", "check_kernel_file"):
        original = getattr(kernel_file, name)

        def spy(*args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
            calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(kernel_file, name, spy)
    original_load = dispatch.load_stored_source

    def load(*args: Any, **kwargs: Any) -> Any:
        calls.append("load_stored_source")
        return original_load(*args, **kwargs)

    monkeypatch.setattr(dispatch, "load_stored_source", load)
    return calls


def test_a_malicious_imported_kernel_module_is_never_loaded(db: str, tmp_path: Path, spied, monkeypatch) -> None:
    marker = tmp_path / "it-ran"
    text = malicious_module(marker)
    source_hash = variant_source_hash(text)
    bucket = rmsnorm_bucket()
    exported = export_file(tmp_path / "x.jsonl", [claim(bucket, variant="agent", source_hash=source_hash,
                                                        config={})], [("rmsnorm", text)])
    result = cli("db", "import", str(exported), "--db", db)  # validates what it may: not this source
    assert result.exit_code == 0, result.output
    assert "not trusted here" in result.output and f"db trust {source_hash}" in result.output
    state, stats = served(db)
    assert stats["kernel_calls"] == 0
    assert any("not trusted by this user" in reason for reason in state.reasons.values()), state.reasons
    monkeypatch.setenv("KERNELSMITH_DB", db)
    dispatch._RUNNERS.clear()
    out = torch.ops.kernelsmith.kernel("rmsnorm", [torch.randn(8, 64), torch.ones(64)], '{"eps": 1e-06}')[0]
    assert out.shape == (8, 64)
    dispatch._RUNNERS.clear()
    assert spied == [] and not marker.exists()  # never parsed, loaded or run, anywhere

    # Trusting it explicitly still runs it through the gate, which refuses a Python module.
    trusted = cli("db", "trust", source_hash[:8], "--db", db, "--yes")
    assert trusted.exit_code == 1, trusted.output
    assert "import pathlib" in trusted.output  # what was to be trusted was shown first
    assert f"refused {source_hash}: not a kernel file" in trusted.output
    with open_database(db) as database:
        assert not database.variant_source(source_hash).trusted  # type: ignore[union-attr]
    assert served(db)[1]["kernel_calls"] == 0
    assert "parse_kernel_file" not in spied and "load_namespace" not in spied and "load_stored_source" not in spied
    assert not marker.exists()


def test_import_trust_gates_the_files_sources_too(db: str, tmp_path: Path) -> None:
    marker = tmp_path / "it-ran"
    text = malicious_module(marker)
    result = cli("db", "import", str(export_file(tmp_path / "x.jsonl", sources=[("rmsnorm", text)])),
                 "--db", db, "--trust")
    assert result.exit_code == 0, result.output
    assert "trusting rmsnorm kernel source" in result.output and "refused" in result.output
    with open_database(db) as database:
        (record,) = database.variant_sources()
    assert record.origin == "imported" and not record.trusted and not marker.exists()


def test_trust_asks_before_trusting(db: str, tmp_path: Path) -> None:
    text = template_source("rmsnorm")
    assert text is not None
    import_claims(db, export_file(tmp_path / "x.jsonl", sources=[("rmsnorm", text)]))
    result = runner.invoke(app, ["db", "trust", variant_source_hash(text), "--db", db], input="n\n")
    assert result.exit_code == 1 and "nothing trusted" in result.output
    assert "RMSNorm, one program per row" in result.output  # the text was shown before the question
    assert cli("db", "trust", "0000", "--db", db, "--yes").exit_code == 2  # no such source: one-line error
    with open_database(db) as database:
        assert not database.variant_source(variant_source_hash(text)).trusted  # type: ignore[union-attr]


def test_a_trusted_kernel_file_is_validated_here_before_it_is_served(db: str, tmp_path: Path) -> None:
    text = template_source("rmsnorm")
    assert text is not None
    source_hash = variant_source_hash(text)
    bucket = rmsnorm_bucket()
    decision = claim(bucket, variant="agent", source_hash=source_hash, config={"num_warps": 2, "EVICT_X": ""})
    exported = export_file(tmp_path / "x.jsonl", [decision], [("rmsnorm", text)])
    assert cli("db", "import", str(exported), "--db", db).exit_code == 0
    assert served(db)[1]["kernel_calls"] == 0  # untrusted: not served
    result = cli("db", "trust", source_hash, "--db", db, "--yes", "--workers", "1")
    assert result.exit_code == 0, result.output
    assert f"trusted {source_hash}" in result.output and "validated" in result.output
    with open_database(db) as database:
        stored = database.get_decision(FP.hash, bucket.workload_hash)
        assert stored is not None and stored.servable and database.variant_source(source_hash).trusted  # type: ignore[union-attr]
    state, stats = served(db)
    assert stats["kernel_calls"] == 2, state.reasons


# ---- imported failures never switch tuning off ---------------------------------------------------


def test_imported_cheat_records_for_every_config_do_not_stop_local_tuning(db: str, tmp_path: Path) -> None:
    from kernelsmith.tuner import tune_spec

    family = get_op("softmax")
    spec = family.spec((6, 48), "fp32")
    cheats = [
        TrialRecord(FP.hash, spec.workload_hash, "softmax", v.name, v.source_hash, config.to_dict(), "cheat",
                    "claimed by an imported file")
        for v in family.variants for config in v.space(spec).configs()
    ]
    baseline_claim = DecisionRecord(FP.hash, spec.workload_hash, "softmax", spec.to_dict(), "baseline")
    counts = import_claims(db, export_file(tmp_path / "x.jsonl", [baseline_claim], trials=cheats))
    assert counts["trial"] == len(cheats) > 1
    result = tune_spec(spec, budget=1, db=db, workers=1, mode="interpreter", strategy="random")
    assert not result.from_database  # the imported "baseline wins" claim does not stand in either
    assert result.evaluations == 1 and "cheat" not in result.failures
    with open_database(db) as database:
        local = [t for t in database.trials(workload=spec.workload_hash) if t.origin == "local"]
        assert len(local) == 1 and all(t.status != "cheat" for t in local)
        assert database.get_decision(FP.hash, spec.workload_hash).origin == "local"  # type: ignore[union-attr]


@pytest.mark.slow
def test_retime_replaces_a_validated_claim_with_a_local_decision(db: str, tmp_path: Path) -> None:
    from kernelsmith.db.claims import validate_claims

    bucket = rmsnorm_bucket()
    import_claims(db, export_file(tmp_path / "x.jsonl", [claim(bucket)]))
    with open_database(db) as database:
        (outcome,) = validate_claims(database, database.decisions(), retime=True, budget=1, workers=1)
        stored = database.get_decision(FP.hash, bucket.workload_hash)
    assert outcome.status == "retimed", outcome
    assert stored is not None and stored.origin == "local" and stored.servable and stored.evaluations >= 1


@pytest.mark.gpu
def test_import_validates_a_gpu_claim_on_the_gpu(db: str, tmp_path: Path) -> None:
    """On a GPU machine a claim of this GPU's fingerprint is validated by a GPU worker, and the
    decorator serves it on CUDA tensors; an interpreter claim on the same machine is validated
    by an interpreter worker (each claim in the mode of its fingerprint)."""
    gpu = current_fingerprint("gpu")
    family = get_op("softmax")
    x = torch.randn(64, 1024, device="cuda")
    bucket = family.bucket(family.spec_for(x))
    exported = export_file(tmp_path / "x.jsonl", [claim(bucket, fingerprint=gpu.hash), claim(rmsnorm_bucket())])
    result = cli("db", "import", str(exported), "--db", db, "--workers", "1")
    assert result.exit_code == 0, result.output
    with open_database(db) as database:
        assert database.get_decision(gpu.hash, bucket.workload_hash).claim_state == "validated"  # type: ignore[union-attr]
        assert database.get_decision(FP.hash, rmsnorm_bucket().workload_hash).claim_state == "validated"  # type: ignore[union-attr]
    def softmax(t: torch.Tensor) -> torch.Tensor:
        return torch.softmax(t, dim=-1)

    fn = kernelsmith.optimize(softmax, mode="db", db=db)
    for _ in range(3):
        assert torch.allclose(fn(x), torch.softmax(x, dim=-1), atol=1e-5)
    assert fn.kernelsmith.stats["kernel_calls"] == 2, fn.kernelsmith.reasons
