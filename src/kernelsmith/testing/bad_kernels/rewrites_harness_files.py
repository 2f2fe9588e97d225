"""Rewriting the harness on disk (issue 12): the module edits ``kernelsmith/evaluate/errors.py``.

The file the worker (and every later worker, and the user's own process) imports its tolerance
check from is rewritten so that ``check_close`` finds nothing wrong; from the next process on,
every kernel is "correct". A kernel file has no host code and cannot open a file; the gate
rejects this module before anything runs, and the worker runs in a private temporary directory
without access to the package's files.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

import torch

import kernelsmith.evaluate.errors as harness_errors
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec

FORGIVING = "\n\ndef check_close(*args, **kwargs):\n    return None\n"


def build(spec: OpSpec, config: Config):
    path = pathlib.Path(harness_errors.__file__)
    if FORGIVING not in path.read_text():
        path.write_text(path.read_text() + FORGIVING)  # the last definition wins at import

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        pass

    return launch
