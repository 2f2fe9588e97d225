"""Who trusts a stored kernel source: a per-user key, and a token the database keeps per source.

Serving a decision that names a kernel written outside the package means loading that kernel's
text in the user's process, so the database must say whether *this user* agreed to that. A plain
"trusted" flag in the database cannot say it: a database is a file, and a file can be shared (a
team's cache on a network disk, a copy from a colleague) or imported from anywhere, and whoever
wrote it could have set the flag. So the flag is a token: an HMAC of the source's hash under a
secret key that only this user holds (``$KERNELSMITH_TRUST_KEY``, default
``$XDG_CONFIG_HOME/kernelsmith/trust.key``, created on first use, readable by the user only).

- the tuner and the agent harness store the sources that passed the harness here with a token;
- ``kernelsmith db import`` stores sources with none; ``kernelsmith db trust`` adds one after
  showing the source and checking it against the kernel-file gate;
- a database someone else wrote carries tokens under their key, which do not verify here, so
  its sources are untrusted for this user until trusted explicitly.

The key guards against a database written by someone else, not against someone who can read
this user's files (they could equally edit the installed package).

>>> token = source_token("0123456789abcdef")
>>> token_trusts(token, "0123456789abcdef"), token_trusts(token, "fedcba9876543210"), token_trusts("", "x")
(True, False, False)
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import threading
from pathlib import Path

from kernelsmith import settings

logger = logging.getLogger(__name__)

ENV_VAR = "KERNELSMITH_TRUST_KEY"
_KEY_BYTES = 32

_KEYS: dict[str, bytes] = {}
_KEYS_LOCK = threading.Lock()


def trust_key_path() -> Path:
    """``$KERNELSMITH_TRUST_KEY`` if set, else ``$XDG_CONFIG_HOME/kernelsmith/trust.key``
    (``~/.config/kernelsmith/trust.key``): a per-user file kept apart from any database."""
    env = settings.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME", "").strip()
    base = Path(config).expanduser() if config else Path.home() / ".config"
    return base / "kernelsmith" / "trust.key"


def _read_or_create(path: Path) -> bytes:
    """The key in ``path``, created (mode 0600, exclusively: two processes agree) if missing."""
    try:
        return bytes.fromhex(path.read_text().strip())
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process created it meanwhile
        return bytes.fromhex(path.read_text().strip())
    key = secrets.token_bytes(_KEY_BYTES)
    with os.fdopen(fd, "w") as handle:
        handle.write(key.hex() + "\n")
    logger.info("created the kernel trust key %s", path)
    return key


def trust_key() -> bytes:
    """This user's key (cached per path). When the file cannot be read or written the key lives
    in this process only, with a warning: trust given now does not outlast the process, and
    nothing stored earlier is trusted, which is the safe side."""
    path = trust_key_path()
    with _KEYS_LOCK:
        key = _KEYS.get(str(path))
        if key is None:
            try:
                key = _read_or_create(path)
                if len(key) < 16:
                    raise ValueError("too short")
            except (OSError, ValueError) as exc:
                logger.warning(
                    "cannot use the kernel trust key %s (%s): kernel sources stored before are not trusted, "
                    "and trust given now lasts for this process only; set %s to a writable path",
                    path, exc, ENV_VAR,
                )
                key = secrets.token_bytes(_KEY_BYTES)
            _KEYS[str(path)] = key
    return key


def source_token(source_hash: str) -> str:
    """The token that marks the source ``source_hash`` trusted by this user."""
    return hmac.new(trust_key(), f"variant-source:{source_hash}".encode(), hashlib.sha256).hexdigest()


def token_trusts(token: str, source_hash: str) -> bool:
    """Whether ``token`` (as stored) marks ``source_hash`` trusted by this user."""
    return bool(token) and hmac.compare_digest(token, source_token(source_hash))
