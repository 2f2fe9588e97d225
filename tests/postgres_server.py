"""A throwaway PostgreSQL server for the tests: a real one, never a mock.

:func:`postgres_server` (session-scoped) creates a cluster in a temporary directory with the
server programs of the installed PostgreSQL (``/usr/lib/postgresql/*/bin``), starts it on a free
port listening on 127.0.0.1 only, and stops and removes it after the session. ``initdb`` refuses
to run as root, and CI runs as root, so the cluster belongs to the ``postgres`` account and
every server program runs through ``runuser -u postgres``. :func:`new_database` creates a fresh
empty database on it for each test that needs one.

The tests skip, saying why, only when the server programs are not installed (``.ci/run``
installs them) or psycopg is missing.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest


def _bin_dir() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return os.path.dirname(found[-1]) if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Server:
    port: int

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"


def _as_postgres(*argv: str) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else list(argv)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Server]:
    pytest.importorskip("psycopg", reason="psycopg is not installed: pip install -e '.[postgres]'")
    bin_dir = _bin_dir()
    if bin_dir is None:
        pytest.skip("the PostgreSQL server programs are not installed (no /usr/lib/postgresql/*/bin/initdb)")
    if os.geteuid() == 0:
        try:
            account = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no postgres account to run the server as")
    base = tempfile.mkdtemp(prefix="kernelsmith-pg-")
    data = os.path.join(base, "data")
    if os.geteuid() == 0:
        os.chown(base, account.pw_uid, account.pw_gid)
    port = _free_port()
    run = {"check": True, "capture_output": True, "text": True, "timeout": 120}
    started = False
    try:
        subprocess.run(_as_postgres(f"{bin_dir}/initdb", "-D", data, "-A", "trust", "-U", "postgres"), **run)
        options = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off"
        subprocess.run(_as_postgres(f"{bin_dir}/pg_ctl", "-D", data, "-o", options, "-l",
                                    os.path.join(base, "log"), "-w", "start"), **run)
        started = True
        yield Server(port)
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"could not start a PostgreSQL server: {exc.stderr or exc.stdout}")
    finally:
        if started:
            subprocess.run(_as_postgres(f"{bin_dir}/pg_ctl", "-D", data, "-m", "immediate", "-w", "stop"),
                           capture_output=True, timeout=60)
        shutil.rmtree(base, ignore_errors=True)


def new_database(server: Server) -> str:
    """The URL of a new, empty database on ``server``."""
    import psycopg

    name = f"ks_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return server.url(name)
