"""Every ``KERNELSMITH_*`` environment variable the package reads, in one place.

Each variable is a :class:`Setting` with its type, default and documentation, and the package
reads them only through :func:`get` (never ``os.environ`` directly), so that

- one rule parses every true/false switch: ``1``, ``true``, ``yes``, ``on`` are true, ``0``,
  ``false``, ``no``, ``off`` are false (any case, surrounding spaces ignored), an empty value is
  the default, and anything else raises :class:`SettingError` naming the variable (a typo such
  as ``KERNELSMITH_CHECK=flase`` must not silently mean "on");
- ``kernelsmith env`` (:mod:`kernelsmith.cli.env`) can show every setting, its value and whether
  it came from the environment or the default;
- the README's table of environment variables is checked against :data:`SETTINGS` by a test
  (``tests/test_settings.py``), so the two cannot drift: :func:`markdown_table` writes it.

Values are read from the environment on every call (no caching): tests and users change them at
run time, and every caller reads them off the hot path (on a first call, when a policy is built).
This module imports only the standard library, so ``import kernelsmith`` stays cheap.

>>> get("KERNELSMITH_CHECK_FIRST", {"KERNELSMITH_CHECK_FIRST": " 5 "})
5
>>> get("KERNELSMITH_FORCE_RETUNE", {"KERNELSMITH_FORCE_RETUNE": "Yes"})
True
>>> get("KERNELSMITH_CHECK", {"KERNELSMITH_CHECK": "flase"})
Traceback (most recent call last):
...
kernelsmith.settings.SettingError: KERNELSMITH_CHECK='flase' is not true or false (1/true/yes/on, 0/false/no/off)
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kernelsmith.exceptions import KernelsmithError

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
TYPES = ("bool", "int", "float", "str", "choice")
PREFIX = "KERNELSMITH_"


class SettingError(KernelsmithError, ValueError):
    """An environment variable holds a value its setting cannot mean; the message names both."""


@dataclass(frozen=True)
class Setting:
    """One environment variable: ``type`` is one of :data:`TYPES`; ``choices`` lists the values a
    ``"choice"`` accepts (compared in lower case); ``doc`` is one line for the README and
    ``kernelsmith env``. A ``str`` setting's default ``""`` means "not set" (the doc says what
    happens then). A ``secret`` one may hold a URL with a token or password in it, so
    ``kernelsmith env`` shows only its scheme and host (:func:`redact`)."""

    name: str
    type: str
    default: Any
    doc: str
    choices: tuple[str, ...] = ()
    secret: bool = False

    def parse(self, text: str) -> Any:
        """The value ``text`` (as read from the environment) means; empty text is the default."""
        text = text.strip()
        if not text:
            return self.default
        if self.type == "bool":
            word = text.lower()
            if word in TRUE_WORDS:
                return True
            if word in FALSE_WORDS:
                return False
            raise SettingError(
                f"{self.name}={text!r} is not true or false ({'/'.join(TRUE_WORDS)}, {'/'.join(FALSE_WORDS)})"
            )
        if self.type in ("int", "float"):
            kind, what = (int, "an integer") if self.type == "int" else (float, "a number")
            try:
                return kind(text)
            except ValueError:
                raise SettingError(f"{self.name}={text!r} is not {what}") from None
        if self.type == "choice":
            word = text.lower()
            if word not in self.choices:
                raise SettingError(f"{self.name}={text!r} is not one of {', '.join(self.choices)}")
            return word
        return text

    @property
    def default_text(self) -> str:
        """The default as a user would write it in the environment (``""``: unset)."""
        if self.type == "bool":
            return "1" if self.default else "0"
        return str(self.default)


def _settings(*items: Setting) -> dict[str, Setting]:
    return {s.name: s for s in items}


# The README's environment table lists these in this order (tests/test_settings.py checks it).
SETTINGS: dict[str, Setting] = _settings(
    Setting("KERNELSMITH_DB", "str", "",
            "The database: a path, `sqlite:///path` or `postgresql://` URL. Unset: "
            "`$XDG_CACHE_HOME/kernelsmith/kernelsmith.db` (`~/.cache/kernelsmith/kernelsmith.db`).", secret=True),
    Setting("KERNELSMITH_MODE", "choice", "tune",
            "What a decorated function does with a workload not in the database: `tune` it on the first call, "
            "`db` (serve what is stored, else run the original) or tune in the `background`.",
            ("tune", "db", "background")),
    Setting("KERNELSMITH_FORCE_RETUNE", "bool", False,
            "Tune again even where a decision is stored, measuring every candidate afresh "
            "(the stored winner seeds the search). `kernelsmith tune --force`, `force_retune=`."),
    Setting("KERNELSMITH_DATABASE_ONLY", "bool", False,
            "Never tune: every front door serves what the database holds (a record of a near fingerprint "
            "after re-validating it here) or runs the original code. `database_only=`."),
    Setting("KERNELSMITH_REQUIRE_TUNED", "bool", False,
            "Never tune, and raise `NotTunedError` naming the workload where the database holds no decision "
            "for it (for CI and deployment). `require_tuned=`."),
    Setting("KERNELSMITH_COMPILE_BASELINE", "choice", "auto",
            "Also time the op's PyTorch reference compiled by `torch.compile` when deciding, and keep a kernel "
            "only if it beats that too: `auto` (on a GPU only), `on` (the interpreter too: slow, for tests), `off`.",
            ("auto", "on", "off")),
    Setting("KERNELSMITH_COMPILE_AHEAD", "bool", True,
            "On a GPU, compile the search's built-in candidates waiting for a worker in compile-only processes "
            "(into Triton's cache, launching nothing), ahead of the worker; `0`: the workers compile everything."),
    Setting("KERNELSMITH_INTERPRET", "bool", False,
            "Run kernels on CPU tensors in the Triton interpreter (sets `TRITON_INTERPRET=1`): "
            "correctness only, timings are not performance."),
    Setting("KERNELSMITH_LOG", "choice", "warning",
            "The level of the package's logger `kernelsmith`: `debug`, `info` (sites replaced or not and why, "
            "fallbacks, tuning), `warning`, `error`.",
            ("debug", "info", "warning", "error", "critical")),
    Setting("KERNELSMITH_CHECK", "bool", True,
            "Serve checks: compare a served kernel's first calls and a secret sample of later ones with "
            "the original code (DESIGN.md rule 12)."),
    Setting("KERNELSMITH_CHECK_RATE", "float", 1e-3,
            "The fraction of later calls a serve check samples, in [0, 1]."),
    Setting("KERNELSMITH_CHECK_FIRST", "int", 3,
            "How many first calls of each served kernel are checked."),
    Setting("KERNELSMITH_DIRECT_LAUNCH", "bool", True,
            "Launch compiled kernels directly, skipping Triton's per-call argument binding; `0` always "
            "goes through Triton."),
    Setting("KERNELSMITH_TRUST_KEY", "str", "",
            "The per-user key file that marks kernel sources trusted. Unset: "
            "`$XDG_CONFIG_HOME/kernelsmith/trust.key` (`~/.config/kernelsmith/trust.key`)."),
    Setting("KERNELSMITH_LLM_PROVIDER", "str", "",
            "The LLM client of `--strategy llm`: `anthropic`, `openai` (any OpenAI-compatible endpoint) "
            "or `ollama`. Unset: no LLM."),
    Setting("KERNELSMITH_LLM_MODEL", "str", "",
            "The LLM's model name (no default model)."),
    Setting("KERNELSMITH_WEBHOOK_URL", "str", "",
            "An `http(s)` URL (such as a Discord webhook) that is sent a message when tuning ends or fails. "
            "Unset: no notifications.", secret=True),
    Setting("KERNELSMITH_WEBHOOK_EVENTS", "str", "",
            "A comma-separated subset of `done,error` to notify about. Unset: all."),
    Setting("KERNELSMITH_LCE_SCRATCH_MIB", "float", 0.0,
            "The most scratch memory (MiB) the fused linear + cross-entropy gradient's tuned config may allocate "
            "per call (chunk logits, float32 dW/db accumulators); larger configs are not searched. `0`: 3/16 of "
            "the T x V x 2-byte logits, at least 64 MiB. The smallest config's need is always allowed."),
)


def setting(name: str) -> Setting:
    """The :class:`Setting` named ``name``; KeyError for a variable the package does not read."""
    try:
        return SETTINGS[name]
    except KeyError:
        raise KeyError(f"{name} is not a kernelsmith setting (see `kernelsmith env`)") from None


def get(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The value of setting ``name`` in ``environ`` (default: this process's environment)."""
    env = os.environ if environ is None else environ
    return setting(name).parse(env.get(name, ""))


def source(name: str, environ: Mapping[str, str] | None = None) -> str:
    """``"environment"`` when ``name`` is set (to a non-empty value), else ``"default"``."""
    env = os.environ if environ is None else environ
    setting(name)
    return "environment" if env.get(name, "").strip() else "default"


def interpreter_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether kernels run in the Triton interpreter: ``KERNELSMITH_INTERPRET`` or Triton's own
    ``TRITON_INTERPRET`` (read with the same true/false rule), the one place both are read."""
    env = os.environ if environ is None else environ
    if get("KERNELSMITH_INTERPRET", env):
        return True
    triton = env.get("TRITON_INTERPRET", "").strip().lower()
    return triton in TRUE_WORDS


def compile_baseline_wanted(mode: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether a decision in ``mode`` ("gpu" or "interpreter") times the torch.compile baseline
    (``KERNELSMITH_COMPILE_BASELINE``). ``auto`` means on a GPU only: in the interpreter, compiling
    the reference makes every decision slow and host-clock timings say nothing about speed."""
    choice = get("KERNELSMITH_COMPILE_BASELINE", environ)
    return choice == "on" or (choice == "auto" and mode == "gpu")


@dataclass(frozen=True)
class Shown:
    """A setting as ``kernelsmith env`` shows it: the value (or the error reading it) and where
    it came from."""

    name: str
    type: str
    value: Any
    source: str
    default: Any
    doc: str
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, "value": self.value, "source": self.source,
                "default": self.default, "doc": self.doc, "error": self.error}


def show(environ: Mapping[str, str] | None = None) -> list[Shown]:
    """Every setting with its current value and source, in :data:`SETTINGS` order. A value that
    does not parse is shown with its error instead of raising, so ``kernelsmith env`` can point
    at every bad variable at once."""
    env = os.environ if environ is None else environ
    rows = []
    for s in SETTINGS.values():
        try:
            value, error = get(s.name, env), ""
        except SettingError as exc:
            value, error = env.get(s.name, ""), str(exc)
        if s.secret:
            value = redact(str(value))
        rows.append(Shown(s.name, s.type, value, source(s.name, env), s.default, s.doc, error))
    return rows


def redact(text: str) -> str:
    """A URL as ``scheme://host:port/…`` (no user, password, path or query, where tokens live);
    anything else (a file path) as it is.

    >>> redact("postgresql://me:secret@db.example:5432/kernelsmith"), redact("/tmp/k.db")
    ('postgresql://db.example:5432/…', '/tmp/k.db')
    """
    if "://" not in text:
        return text
    try:
        parts = urllib.parse.urlsplit(text)
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<unparseable URL>"
    return f"{parts.scheme}://{parts.hostname or ''}{port}/…"


def unknown(environ: Mapping[str, str] | None = None) -> list[str]:
    """``KERNELSMITH_*`` variables set in the environment that no setting reads (typos, most
    likely: ``KERNELSMITH_DATABASE`` for ``KERNELSMITH_DB``)."""
    env = os.environ if environ is None else environ
    return sorted(k for k in env if k.startswith(PREFIX) and k not in SETTINGS)


def markdown_table() -> str:
    """The README's table of environment variables (tests/test_settings.py compares the two)."""
    lines = ["| variable | type | default | what it does |", "|---|---|---|---|"]
    for s in SETTINGS.values():
        kind = "/".join(s.choices) if s.type == "choice" else ("true/false" if s.type == "bool" else s.type)
        default = f"`{s.default_text}`" if s.default_text else "unset"
        lines.append(f"| `{s.name}` | {kind} | {default} | {s.doc} |")
    return "\n".join(lines)
