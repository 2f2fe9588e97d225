"""The lock that serializes device work across the evaluation workers sharing one GPU.

A ``fcntl.flock`` on a file every worker of that device opens: the kernel releases it when its
holder dies, so a crashed worker never leaves the device locked. No torch and no Triton here: the
pool's stand-in worker (:mod:`kernelsmith.testing.fake_device_worker`) takes the very same lock.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator


@contextlib.contextmanager
def device_lock(path: str) -> Iterator[None]:
    """Hold the device lock at ``path`` for the block (no lock when ``path`` is empty)."""
    if not path:
        yield
        return
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
