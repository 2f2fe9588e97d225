"""What keeps a worker process from hurting the machine it runs on (issue 12, part 6).

A worker runs kernels nobody has reviewed. Kernel files are device code only, so none of this
should ever be needed; it is the second wall behind that one, and it costs next to nothing:

- **Its own session and process group** (``start_new_session`` in the pool), so one signal
  reaches everything started in it.
- **Nothing it starts outlives it.** The worker makes itself a *child subreaper*
  (``prctl(PR_SET_CHILD_SUBREAPER)``): a process that double-forks and ``setsid``-s its way out of
  the group is still reparented to the worker, not to init, so it stays in the worker's process
  tree. After every request the worker ends its whole tree (:func:`end_children`); when the pool
  kills a worker it first stops the whole tree (``SIGSTOP``, repeated until no new process
  appears, so nothing can fork during the kill) and then kills every process in it
  (:func:`kill_tree`). Without ``/proc/<pid>/task/*/children`` on every kernel, the tree is read
  from ``/proc/*/stat``.
- **A memory cap.** In interpreter mode the kernel enforces it: ``RLIMIT_AS`` (address space),
  set by the worker before it loads any candidate. In GPU mode ``RLIMIT_AS`` cannot be used, since
  the CUDA driver reserves address ranges far larger than physical memory (unified addressing)
  and fails to initialize under any cap that means something; ``RLIMIT_DATA`` is not sure either
  (the driver's pinned and mapped allocations are counted differently across driver versions).
  So the pool itself watches the resident memory of the worker's whole tree while it waits for a
  reply and kills the tree above the cap (:func:`tree_rss_bytes`): no cgroup needed, works the
  same on every kernel, and counts children a per-process limit would not. The pool does this in
  both modes; ``RLIMIT_AS`` in interpreter mode is the hard limit that stops a single allocation
  before it happens.
- **No core dumps** (``RLIMIT_CORE`` 0): a crashing candidate does not fill the disk.
- **A private home** (:func:`worker_environment`): the worker's working directory, ``HOME``,
  ``TMPDIR`` and caches are a fresh temporary directory; kernelsmith's settings that point at the
  user's files (``KERNELSMITH_DB``, the LLM and webhook settings) are not passed on. The worker
  never opens the database: only the tuning process writes it.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import resource
import signal
import site
import sys
import time
from collections.abc import Iterable, Mapping

log = logging.getLogger(__name__)

_PR_SET_CHILD_SUBREAPER = 36
# Address space a process reserves without using it (thread stacks, malloc arenas): added to the
# interpreter-mode RLIMIT_AS per core, so that the limit caps memory, not thread counts.
_RESERVED_PER_CORE = 128 << 20
# kernelsmith settings a worker may see: neither points at a user's file.
KEPT_SETTINGS = frozenset({"KERNELSMITH_LOG", "KERNELSMITH_DIRECT_LAUNCH"})


# ---- inside the worker -------------------------------------------------------------------------
def harden(address_space_bytes: int | None) -> None:
    """Called by the worker before it loads any candidate: subreaper, memory cap, no core dumps."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            log.warning("could not become a child subreaper (errno %d)", ctypes.get_errno())
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if address_space_bytes:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = address_space_bytes if hard == resource.RLIM_INFINITY else min(hard, address_space_bytes)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def end_children(timeout_s: float = 5.0) -> list[int]:
    """End every process this one started, directly or not, and reap them; returns their pids.

    With the subreaper flag (:func:`harden`), every orphan of the tree comes back to this process,
    so waiting until no child is left reaps them all.
    """
    ended = _stop_and_kill(os.getpid(), include_root=False)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.005)
    return ended


# ---- in the tuning process -------------------------------------------------------------------
def kill_tree(root: int) -> list[int]:
    """Stop, then kill, ``root`` and every process below it; returns the pids signalled."""
    killed = _stop_and_kill(root, include_root=True)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(root, signal.SIGKILL)  # the worker leads its own process group
    return killed


def tree_rss_bytes(root: int) -> int:
    """Resident memory of ``root`` and its descendants, in bytes (0 for processes gone)."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for pid in (root, *descendants(root)):
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, ValueError, IndexError):
            continue
    return total


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` in the process tree, parents before children."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _parents().items():
        children.setdefault(ppid, []).append(pid)
    found: list[int] = []
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        for child in children.get(pid, ()):
            if child not in found:
                found.append(child)
                frontier.append(child)
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie is not: it has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def process_start(pid: int) -> str:
    """When ``pid`` started (clock ticks since boot, as text; "" when gone): with the pid, it
    names one process, since a pid is reused only by a later process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return ""


def kill_if_same(started: Mapping[int, str]) -> None:
    """SIGKILL each pid of ``started`` that is still the process that started then."""
    _signal_all([pid for pid, when in started.items() if when and process_start(pid) == when], signal.SIGKILL)


def default_memory_cap(workers: int) -> int:
    """Bytes each of ``workers`` workers may hold: half the machine's memory shared among them
    (at least 2 GiB each), so that all of them together cannot exhaust it."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = 16 << 30
    return max(2 << 30, total // (2 * max(1, workers)))


def address_space_limit(memory_cap: int) -> int:
    """The RLIMIT_AS for an interpreter-mode worker holding at most ``memory_cap`` bytes."""
    return memory_cap + _RESERVED_PER_CORE * (os.cpu_count() or 1)


def worker_environment(
    base: Mapping[str, str], *, mode: str, home: str, triton_cache: str, package_root: str
) -> dict[str, str]:
    """The environment of a worker: ``base`` without kernelsmith's user-file settings, with a
    private ``home`` for every place a library writes to (home, temporary files, caches)."""
    env = {k: v for k, v in base.items() if not k.startswith("KERNELSMITH_") or k in KEPT_SETTINGS}
    paths = [package_root]
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        paths.append(site.getusersitepackages())  # the new HOME would hide a `pip install --user`
    paths.append(env.get("PYTHONPATH", ""))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # never write into the package's folders
    for name in ("HOME", "TMPDIR", "TMP", "TEMP", "TRITON_HOME"):
        env[name] = home
    env["XDG_CACHE_HOME"] = os.path.join(home, ".cache")
    env["CUDA_CACHE_PATH"] = os.path.join(home, ".nv")
    env["TRITON_CACHE_DIR"] = triton_cache
    if mode == "interpreter":
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    return env


# ---- the process tree ----------------------------------------------------------------------------
def _parents() -> dict[int, int]:
    """pid -> parent pid of every live process (zombies included: they hold no resources, and
    their parent reaps them)."""
    table: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rpartition(")")[2].split()  # the command name may hold spaces
        except OSError:
            continue
        if len(fields) > 1:
            table[int(name)] = int(fields[1])
    return table


def _signal_all(pids: Iterable[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def _stop_and_kill(root: int, *, include_root: bool) -> list[int]:
    """SIGSTOP the tree until no new process appears (a stopped process cannot fork), then SIGKILL."""
    stopped: list[int] = [root] if include_root else []
    if include_root:
        _signal_all([root], signal.SIGSTOP)
    for _ in range(50):
        new = [pid for pid in descendants(root) if pid not in stopped]
        if not new:
            break
        _signal_all(new, signal.SIGSTOP)
        stopped.extend(new)
    _signal_all(stopped, signal.SIGKILL)
    return stopped
