"""Code execution in the tuning process (issue 12): the launcher sends a crafted pickle on the
worker's socket.

When worker replies were pickles, whatever arrived on the socket was unpickled in the tuning
process: garbage raised ``UnpicklingError`` there, and an object whose ``__reduce__`` names a
callable runs that callable in the caller (here, a shell command). This module needs host code
and the worker's descriptor; a kernel file has neither, so the gate rejects it before anything
runs. Replies are now schema-checked JSON, which never constructs objects.
"""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Sequence

import torch

from kernelsmith.space import Config
from kernelsmith.spec import OpSpec


class _Payload:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, ("touch /tmp/kernelsmith-owned",))


def build(spec: OpSpec, config: Config):
    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        data = pickle.dumps(_Payload())
        fd = int(sys.argv[1])
        os.write(fd, len(data).to_bytes(4, "big") + data)  # multiprocessing's framing

    return launch
