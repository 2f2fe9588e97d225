"""Writing the database (issue 12): the module stores its own decision for the workload.

The launcher opens the user's kernelsmith database (``$KERNELSMITH_DB``, else the cache) with
sqlite3 and deletes every decision, so the next call of a decorated function tunes again with
this kernel in the running, or writes one naming a stored source it planted. A kernel file has
no host code and no imports beyond Triton: the gate rejects this module before anything runs,
and only the tuning process writes the database.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Sequence

import torch

from kernelsmith.space import Config
from kernelsmith.spec import OpSpec


def build(spec: OpSpec, config: Config):
    path = os.environ.get("KERNELSMITH_DB", os.path.expanduser("~/.cache/kernelsmith/kernelsmith.db"))

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        with sqlite3.connect(path) as db:
            db.execute("DELETE FROM decisions")

    return launch
