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
