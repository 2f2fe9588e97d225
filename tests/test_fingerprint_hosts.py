"""Fingerprints across hosts (issue 16, part 4): two machines with the same GPU model, SM count,
driver, CUDA, torch, triton and kernelsmith share results; any difference keeps them apart; and
nothing host-specific (the host name) is part of the hash."""

from __future__ import annotations

import dataclasses
import socket

import pytest

from kernelsmith.db import Fingerprint
from kernelsmith.db import fingerprint as fingerprint_module
from kernelsmith.testing.db_suite import GPU_FP

SHARED = {"mode", "gpu_name", "sm_count", "compute_capability", "driver", "cuda", "torch", "triton", "kernelsmith"}


def test_the_hash_covers_exactly_the_machine_and_software_fields() -> None:
    assert {f.name for f in dataclasses.fields(Fingerprint)} == SHARED  # no host name, no path, no device index
    same_model_elsewhere = Fingerprint(**GPU_FP.to_dict())
    assert same_model_elsewhere.hash == GPU_FP.hash


@pytest.mark.parametrize("field", sorted(SHARED - {"mode"}))
def test_any_difference_keeps_machines_apart(field: str) -> None:
    value = getattr(GPU_FP, field)
    other = dataclasses.replace(GPU_FP, **{field: value + 1 if isinstance(value, int) else f"{value}-other"})
    assert other.hash != GPU_FP.hash


def test_the_host_name_does_not_change_the_fingerprint(monkeypatch: pytest.MonkeyPatch) -> None:
    before = fingerprint_module._interpreter_fingerprint.__wrapped__()
    monkeypatch.setattr(socket, "gethostname", lambda: "another-host")
    monkeypatch.setenv("HOSTNAME", "another-host")
    assert fingerprint_module._interpreter_fingerprint.__wrapped__() == before
