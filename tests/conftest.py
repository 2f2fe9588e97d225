"""Test set-up: without a GPU every Triton kernel runs in the interpreter on the CPU.

TRITON_INTERPRET must be set before any @triton.jit function is created, so it is set here, at
collection time, before the op modules are imported. GPU tests carry @pytest.mark.gpu and are
skipped when CUDA is unavailable.
"""

from __future__ import annotations

import os

import pytest
import torch

# pytest-xdist starts its workers with COLUMNS=80 (and LINES) in the environment; rich reads them once,
# when the CLI's consoles are created at import, which would pin every table of every test to 80
# columns whatever width a test asks for (CliRunner env={"COLUMNS": ...}). Tests see no such default.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)

HAS_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
if not HAS_GPU:
    os.environ["TRITON_INTERPRET"] = "1"

DEVICE = "cuda" if HAS_GPU else "cpu"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device() -> str:
    return DEVICE


@pytest.fixture(autouse=True)
def _isolated_db(tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """No test ever touches the user's real database or kernel trust key."""
    monkeypatch.setenv("KERNELSMITH_DB", os.path.join(tmp_path, "kernelsmith.db"))
    monkeypatch.setenv("KERNELSMITH_TRUST_KEY", os.path.join(tmp_path, "trust.key"))
