"""Leaving work behind (issue 12): the module starts a detached child process that outlives the
evaluation.

The child (its own session, so a kill of the worker alone misses it) keeps running after the
worker exits, with the user's permissions: it could rewrite files, hold the GPU, or wait for the
tuning process to load a kernel and interfere. A kernel file has no host code and cannot start
anything: the gate rejects this module before anything runs, and everything a worker starts is
ended with it (its own process group and session).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

import torch

from kernelsmith.space import Config
from kernelsmith.spec import OpSpec


def build(spec: OpSpec, config: Config):
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], start_new_session=True)

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        pass

    return launch
