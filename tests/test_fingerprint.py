"""Fingerprints: what they contain, that they are stable, and that modes never share a hash."""

from __future__ import annotations

import pytest
import torch
import triton

import kernelsmith
from kernelsmith.db import Fingerprint, current_fingerprint
from kernelsmith.db.fingerprint import format_cuda_version, resolve_mode


def test_interpreter_fields() -> None:
    fp = current_fingerprint("interpreter")
    assert fp.mode == "interpreter"
    assert fp.gpu_name == "triton-interpreter"
    assert fp.sm_count == 0
    assert fp.compute_capability == "cpu"
    assert fp.driver == "none"
    assert fp.cuda == "none"
    assert fp.torch == torch.__version__
    assert fp.triton == triton.__version__
    assert fp.kernelsmith == kernelsmith.__version__
    assert "interpreter" in fp.describe()


def test_hash_is_stable() -> None:
    a = current_fingerprint("interpreter")
    b = Fingerprint.from_dict(a.to_dict())
    assert a == b
    assert a.hash == b.hash
    assert len(a.hash) == 16 and int(a.hash, 16) >= 0
    # the hash depends on the content alone, not on object identity or field order
    assert Fingerprint(**dict(reversed(list(a.to_dict().items())))).hash == a.hash


def test_any_field_changes_the_hash() -> None:
    a = current_fingerprint("interpreter")
    for name, value in [("torch", "0.0"), ("triton", "0.0"), ("kernelsmith", "0.0"),
                        ("driver", "x"), ("sm_count", 1)]:
        changed = Fingerprint(**{**a.to_dict(), name: value})
        assert changed.hash != a.hash, name


def test_modes_differ() -> None:
    interp = current_fingerprint("interpreter")
    gpu_like = Fingerprint(**{**interp.to_dict(), "mode": "gpu"})
    assert gpu_like.hash != interp.hash
    if torch.cuda.is_available():
        assert current_fingerprint("gpu").hash != interp.hash


def test_auto_mode_follows_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert resolve_mode() == "interpreter"
    assert current_fingerprint() == current_fingerprint("interpreter")
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setenv("KERNELSMITH_INTERPRET", "1")
    assert resolve_mode() == "interpreter"
    monkeypatch.delenv("KERNELSMITH_INTERPRET")
    assert resolve_mode() == ("gpu" if torch.cuda.is_available() else "interpreter")


def test_cached() -> None:
    assert current_fingerprint("interpreter") is current_fingerprint("interpreter")


def test_unknown_mode() -> None:
    with pytest.raises(ValueError, match="mode"):
        current_fingerprint("tpu")


def test_gpu_mode_without_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available")
    with pytest.raises(RuntimeError, match="CUDA"):
        current_fingerprint("gpu")


def test_format_cuda_version() -> None:
    assert format_cuda_version(13000) == "13.0"
    assert format_cuda_version(12080) == "12.8"
    assert format_cuda_version(11040) == "11.4"


@pytest.mark.gpu
def test_gpu_fields() -> None:
    fp = current_fingerprint("gpu")
    assert fp.mode == "gpu"
    assert fp.sm_count == torch.cuda.get_device_properties(0).multi_processor_count
    major, minor = torch.cuda.get_device_capability(0)
    assert fp.compute_capability == f"{major}.{minor}"
    assert fp.cuda == torch.version.cuda
    assert fp.gpu_name == torch.cuda.get_device_name(0)
    assert fp.driver != "none"
    assert current_fingerprint("gpu") is fp


# ---- which fields invalidate a result (docs/cache.md) ---------------------------------------------
def _changed(fp: Fingerprint, **fields: object) -> Fingerprint:
    return Fingerprint(**{**fp.to_dict(), **fields})


def test_the_fields_are_classified_once_and_completely() -> None:
    from kernelsmith.db.records import MODEL_FIELDS, REVALIDATED_FIELDS, STRICT_FIELDS

    assert set(MODEL_FIELDS) <= set(STRICT_FIELDS)
    assert set(STRICT_FIELDS) | set(REVALIDATED_FIELDS) == set(Fingerprint.__dataclass_fields__)
    assert not set(STRICT_FIELDS) & set(REVALIDATED_FIELDS)


@pytest.mark.parametrize("field, value", [("driver", "535.104.05 / CUDA 12.2"), ("kernelsmith", "0.0.9")])
def test_a_driver_build_or_a_kernelsmith_release_is_near(field: str, value: str) -> None:
    here = current_fingerprint("interpreter")
    other = _changed(here, **{field: value})
    assert other.hash != here.hash  # still stored apart: the record says where it was measured
    assert other.near(here) and here.near(other) and other.compatibility == here.compatibility
    assert here.changes(other) == {field: (getattr(here, field), value)}
    assert not here.near(here)  # the same fingerprint is not "near": its records are served as they are


@pytest.mark.parametrize("field, value", [("torch", "2.0.0"), ("triton", "2.0.0"), ("cuda", "11.8"),
                                          ("gpu_name", "NVIDIA A100"), ("sm_count", 7), ("mode", "gpu"),
                                          ("compute_capability", "8.0")])
def test_the_toolchain_and_the_gpu_invalidate(field: str, value: object) -> None:
    here = current_fingerprint("interpreter")
    other = _changed(here, **{field: value})
    assert not other.near(here) and other.compatibility != here.compatibility
    same_model = field in ("torch", "triton", "cuda")
    assert (other.model == here.model) is same_model  # a toolchain upgrade keeps the GPU model


def test_near_decisions_finds_only_near_fingerprints(tmp_path) -> None:
    from kernelsmith.db import DecisionRecord, open_database

    here = current_fingerprint("interpreter")
    old_driver, old_torch = _changed(here, driver="old"), _changed(here, torch="2.0.0")
    with open_database(str(tmp_path / "n.db")) as db:
        for fp in (here, old_driver, old_torch):
            db.put_fingerprint(fp)
            db.put_decision(DecisionRecord(fp.hash, "w", "softmax", {}, "kernel", "v"))
        db.put_decision(DecisionRecord(old_driver.hash, "other", "softmax", {}, "kernel", "v"))
        assert [d.fingerprint for d in db.near_decisions(here, "w")] == [old_driver.hash]
        assert db.near_decisions(here, "missing") == []
