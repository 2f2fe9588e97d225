"""Plain messages between the tuner and its worker processes, and how they travel: as JSON data.

Everything here is a frozen dataclass of plain values, and a failure travels back as data
(``status`` and ``error``), never as an exception.

Why JSON and a schema, not pickle: unpickling runs code named by the bytes (``__reduce__``), so a
worker whose process was taken over could execute anything in the tuning process by writing a
crafted pickle on its socket, and plain garbage made the caller raise ``UnpicklingError``. A
reply is now decoded by :func:`decode_reply` against the explicit schema of the dataclasses below
(every field's type; metrics only finite numbers, lists of numbers and short strings; no unknown
fields), size-bounded by the caller before a byte of it is parsed, and checked against the request
it answers (one result per candidate, for that candidate). Anything else raises
:class:`ProtocolError`, which the pool turns into a ``crash`` failure record. Requests travel the
same way, for uniformity.

A message is one frame of the ``multiprocessing.connection`` format (a 4-byte big-endian length,
then the bytes) holding a JSON object ``{"kind": ..., ...}``: ``ready`` (the worker's greeting),
``close``, ``eval`` and ``ceiling`` (requests), ``reply``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kernelsmith.space import Config

# Size bounds, checked on the length header before a message is read. A reply carries the
# candidates' source back (kernel files are a few kilobytes) and a few hundred timing samples each.
MAX_REQUEST_BYTES = 32 << 20
MAX_REPLY_BYTES = 16 << 20

# Every status a result may carry (see DESIGN.md, "Evaluator"); "skipped": not evaluated because an
# earlier candidate of the same request broke the worker.
STATUSES = frozenset({"ok", "build", "validate", "runtime", "timeout", "crash", "cheat", "skipped"})

_SHORT_TEXT = 200  # a metric's string value (the timer's name)
# The only metrics that are text (lists: the "*samples_us"): the timer's name, why the
# torch.compile baseline could not be timed (the worker's ``_compiled_reference``), and how the
# calls were timed and why (``timing_mode``: "stream", "graph-replay" or "host-clock"; see
# :func:`kernelsmith.evaluate.timing.choose_timing_mode`).
TEXT_METRICS = frozenset({"timer", "compile_baseline_error", "timing_mode", "timing_mode_reason"})
_LONG_TEXT = 20_000  # an error message
_MAX_METRICS = 256
_MAX_SAMPLES = 1_000_000


class ProtocolError(ValueError):
    """A message that does not follow the schema; the caller turns it into a "crash" failure."""


@dataclass(frozen=True)
class Candidate:
    """A kernel variant and one of its configs.

    ``source`` is empty for the op family's built-in variants; otherwise it is a kernel proposed
    from outside the package (a coding agent, an LLM, an import, a planted bad kernel in the
    tests), in the kernel-file form of docs/kernel-files.md. Such source is gated and runs only
    inside a worker process.
    """

    variant: str
    config: Config
    source: str = ""

    @property
    def key(self) -> str:
        tag = f"@{hashlib.sha256(self.source.encode()).hexdigest()[:8]}" if self.source else ""
        return f"{self.variant}{tag}[{self.config.key}]"

    def to_json(self) -> dict[str, Any]:
        return {"variant": self.variant, "config": self.config.to_dict(), "source": self.source}

    @classmethod
    def from_json(cls, data: object, where: str = "candidate") -> Candidate:
        d = _fields(data, where, required={"variant", "config"}, optional={"source"})
        config = _dict(d["config"], f"{where}.config", limit=_MAX_METRICS)
        for name, value in config.items():
            if not (value is None or isinstance(value, (bool, int, str)) or _is_finite(value)):
                raise ProtocolError(f"{where}.config[{name!r}] is a {type(value).__name__}, not a plain value")
        return cls(
            _text(d["variant"], f"{where}.variant", _SHORT_TEXT),
            Config(config),
            _text(d.get("source", ""), f"{where}.source", MAX_REQUEST_BYTES),
        )


# TimingSettings.graph_replay: when to time replayed CUDA graphs instead of host launches.
GRAPH_REPLAY_CHOICES = ("auto", "always", "never")


@dataclass(frozen=True)
class TimingSettings:
    """How hard to time: warm-up by time, interleaved rounds, rotating input sets; and whether
    to time the op's reference compiled by torch.compile beside the eager one (``compile_baseline``:
    the final decision does, where :func:`kernelsmith.settings.compile_baseline_wanted` says so).
    It travels here, with the timing, so every executor passes it on unchanged.

    ``graph_replay`` says how each call is timed on a GPU: ``"auto"`` (the rule of
    :func:`kernelsmith.evaluate.timing.choose_timing_mode`: replayed CUDA graphs for decode
    families and for workloads whose baseline is measured to be launch-bound), ``"always"`` or
    ``"never"`` (stream timing, each call launched from the host)."""

    warmup_ms: float = 25.0
    rounds: int = 40
    input_sets: int = 4
    flush_l2: bool = True
    compile_baseline: bool = False
    graph_replay: str = "auto"

    @classmethod
    def interpreter(cls) -> TimingSettings:
        # The interpreter is orders of magnitude slower than a GPU, and its timings are never
        # reported as performance: a few rounds are enough to exercise the pipeline.
        return cls(warmup_ms=0.0, rounds=3, input_sets=2, flush_l2=False)

    def to_json(self) -> dict[str, Any]:
        return {"warmup_ms": self.warmup_ms, "rounds": self.rounds, "input_sets": self.input_sets,
                "flush_l2": self.flush_l2, "compile_baseline": self.compile_baseline,
                "graph_replay": self.graph_replay}  # fmt: skip

    @classmethod
    def from_json(cls, data: object, where: str = "timing") -> TimingSettings:
        d = _fields(data, where, required={"warmup_ms", "rounds", "input_sets", "flush_l2"},
                    optional={"compile_baseline", "graph_replay"})  # fmt: skip
        graph_replay = _text(d.get("graph_replay", "auto"), f"{where}.graph_replay", 10)
        if graph_replay not in GRAPH_REPLAY_CHOICES:
            raise ProtocolError(f"{where}.graph_replay: {graph_replay!r} is not one of {GRAPH_REPLAY_CHOICES}")
        return cls(
            _number(d["warmup_ms"], f"{where}.warmup_ms"),
            _int(d["rounds"], f"{where}.rounds", 1, 100_000),
            _int(d["input_sets"], f"{where}.input_sets", 1, 64),
            _bool(d["flush_l2"], f"{where}.flush_l2"),
            _bool(d.get("compile_baseline", False), f"{where}.compile_baseline"),
            graph_replay,
        )


@dataclass(frozen=True)
class EvalRequest:
    """Evaluate candidates on one workload: build, validate, then time them interleaved with
    the baseline (the op's eager PyTorch reference) in the same process, and with the reference
    compiled by torch.compile where ``timing.compile_baseline`` is set.

    With no candidates and ``measure`` set, the worker times the baseline alone: the clean
    measurement a confirmation compares with (:mod:`kernelsmith.evaluate.confirm`).
    """

    spec: dict[str, Any]
    candidates: tuple[Candidate, ...]
    mode: str = "gpu"  # "gpu" or "interpreter"
    timing: TimingSettings = field(default_factory=TimingSettings)
    measure: bool = True  # False: validate only
    lock_path: str = ""  # a file lock that serializes timing across workers sharing one GPU

    def to_json(self) -> dict[str, Any]:
        return {"spec": self.spec, "candidates": [c.to_json() for c in self.candidates], "mode": self.mode,
                "timing": self.timing.to_json(), "measure": self.measure, "lock_path": self.lock_path}  # fmt: skip

    @classmethod
    def from_json(cls, data: object, where: str = "request") -> EvalRequest:
        d = _fields(data, where, required={"spec", "candidates", "mode", "timing", "measure", "lock_path"})
        mode = _text(d["mode"], f"{where}.mode", 20)
        if mode not in ("gpu", "interpreter"):
            raise ProtocolError(f"{where}.mode is {mode!r}, not 'gpu' or 'interpreter'")
        return cls(
            _dict(d["spec"], f"{where}.spec"),  # OpSpec.from_dict checks its content
            tuple(
                Candidate.from_json(c, f"{where}.candidates[{i}]")
                for i, c in enumerate(_list(d["candidates"], f"{where}.candidates"))
            ),
            mode,
            TimingSettings.from_json(d["timing"], f"{where}.timing"),
            _bool(d["measure"], f"{where}.measure"),
            _text(d["lock_path"], f"{where}.lock_path", 4096),
        )


@dataclass(frozen=True)
class EvalResult:
    """The outcome for one candidate: status "ok" with metrics, or a failure kind and error."""

    candidate: Candidate
    status: str
    error: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    source_hash: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def median_us(self) -> float:
        return float(self.metrics.get("median_us", float("inf")))

    def to_json(self) -> dict[str, Any]:
        return {"candidate": self.candidate.to_json(), "status": self.status, "error": self.error,
                "metrics": self.metrics, "source_hash": self.source_hash, "seconds": self.seconds}  # fmt: skip

    @classmethod
    def from_json(cls, data: object, where: str = "result") -> EvalResult:
        d = _fields(data, where, required={"candidate", "status"},
                    optional={"error", "metrics", "source_hash", "seconds"})  # fmt: skip
        return cls(
            Candidate.from_json(d["candidate"], f"{where}.candidate"),
            _status(d["status"], f"{where}.status"),
            _text(d.get("error", ""), f"{where}.error", _LONG_TEXT),
            metrics_from_json(d.get("metrics", {}), f"{where}.metrics"),
            _text(d.get("source_hash", ""), f"{where}.source_hash", 64),
            _number(d.get("seconds", 0.0), f"{where}.seconds"),
        )


@dataclass(frozen=True)
class CeilingRequest:
    """Measure the device's copy bandwidth (bytes read + bytes written per second)."""

    nbytes: int = 1 << 30
    repeats: int = 20

    def to_json(self) -> dict[str, Any]:
        return {"nbytes": self.nbytes, "repeats": self.repeats}

    @classmethod
    def from_json(cls, data: object, where: str = "request") -> CeilingRequest:
        d = _fields(data, where, required={"nbytes", "repeats"})
        return cls(_int(d["nbytes"], f"{where}.nbytes", 1, 1 << 40), _int(d["repeats"], f"{where}.repeats", 1, 10_000))


@dataclass(frozen=True)
class CeilingResult:
    status: str
    copy_gbps: float = 0.0
    error: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "copy_gbps": self.copy_gbps, "error": self.error, "detail": self.detail}

    @classmethod
    def from_json(cls, data: object, where: str = "result") -> CeilingResult:
        d = _fields(data, where, required={"status"}, optional={"copy_gbps", "error", "detail"})
        return cls(
            _status(d["status"], f"{where}.status"),
            _number(d.get("copy_gbps", 0.0), f"{where}.copy_gbps"),
            _text(d.get("error", ""), f"{where}.error", _LONG_TEXT),
            metrics_from_json(d.get("detail", {}), f"{where}.detail"),
        )


@dataclass(frozen=True)
class WorkerReply:
    """A worker's answer: one result per request item; ``recycle`` asks for a fresh worker.

    ``baseline`` holds the baseline's own timing (the summary of :func:`timing.summarize` and
    ``samples_us``) whenever the request timed anything, so that a request with no candidates
    measures the baseline alone.
    """

    results: tuple[Any, ...]
    recycle: bool = False
    baseline: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"results": [r.to_json() for r in self.results], "recycle": self.recycle, "baseline": self.baseline}

    @classmethod
    def from_json(cls, data: object, result_type: type[EvalResult] | type[CeilingResult]) -> WorkerReply:
        d = _fields(data, "reply", required={"results", "recycle"}, optional={"baseline"})
        results = _list(d["results"], "reply.results")
        return cls(
            tuple(result_type.from_json(r, f"reply.results[{i}]") for i, r in enumerate(results)),
            _bool(d["recycle"], "reply.recycle"),
            metrics_from_json(d.get("baseline", {}), "reply.baseline"),
        )


Request = EvalRequest | CeilingRequest


# ---- the wire: encoding and decoding -----------------------------------------------------------
def encode_ready() -> bytes:
    return _dump({"kind": "ready"})


def encode_close() -> bytes:
    return _dump({"kind": "close"})


def encode_request(request: Request) -> bytes:
    kind = "ceiling" if isinstance(request, CeilingRequest) else "eval"
    return _dump({"kind": kind, "request": request.to_json()})


def encode_reply(reply: WorkerReply) -> bytes:
    return _dump({"kind": "reply", "reply": reply.to_json()})


def decode_request(data: bytes) -> Request | None:
    """The request in a message from the tuning process; None for ``close``."""
    message = _load(data)
    kind = message.get("kind")
    if kind == "close":
        _fields(message, "message", required={"kind"})
        return None
    if kind not in ("eval", "ceiling"):
        raise ProtocolError(f"expected a request, got a message of kind {kind!r}")
    body = _fields(message, "message", required={"kind", "request"})["request"]
    return EvalRequest.from_json(body) if kind == "eval" else CeilingRequest.from_json(body)


def is_ready(data: bytes) -> bool:
    """Whether a message is the worker's greeting (and nothing else)."""
    try:
        return _load(data) == {"kind": "ready"}
    except ProtocolError:
        return False


def decode_reply(data: bytes, request: Request) -> WorkerReply:
    """The worker's reply to ``request``, checked against the schema *and* against the request.

    A reply must answer exactly what was asked: one result per candidate, in order, each for that
    candidate (the same variant, config and source), or one ceiling result for a ceiling request.
    """
    message = _load(data)
    if message.get("kind") != "reply":
        raise ProtocolError(f"expected a reply, got a message of kind {message.get('kind')!r}")
    body = _fields(message, "message", required={"kind", "reply"})["reply"]
    if isinstance(request, CeilingRequest):
        reply = WorkerReply.from_json(body, CeilingResult)
        if len(reply.results) != 1:
            raise ProtocolError(f"a ceiling reply needs one result, not {len(reply.results)}")
        return reply
    reply = WorkerReply.from_json(body, EvalResult)
    if len(reply.results) != len(request.candidates):
        raise ProtocolError(f"{len(reply.results)} results for {len(request.candidates)} candidates")
    for i, (result, asked) in enumerate(zip(reply.results, request.candidates, strict=True)):
        if result.candidate != asked:
            raise ProtocolError(f"result {i} answers for {result.candidate.key}, not for {asked.key}")
    return reply


def metrics_from_json(data: object, where: str = "metrics") -> dict[str, Any]:
    """A metrics mapping: finite numbers, except ``samples_us``-style lists of finite numbers and
    the short strings of ``TEXT_METRICS``."""
    metrics = _dict(data, where, limit=_MAX_METRICS)
    for name, value in metrics.items():
        if len(name) > _SHORT_TEXT:
            raise ProtocolError(f"{where} has a name of {len(name)} characters")
        if name in TEXT_METRICS:
            _text(value, f"{where}[{name!r}]", _SHORT_TEXT)
        elif name.endswith("samples_us"):
            value = _list(value, f"{where}[{name!r}]")
            if len(value) > _MAX_SAMPLES:
                raise ProtocolError(f"{where}[{name!r}] has {len(value)} values")
            for item in value:
                _number(item, f"{where}[{name!r}] item")
        else:
            _number(value, f"{where}[{name!r}]")
    return metrics


def _dump(message: Mapping[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def _load(data: bytes) -> dict[str, Any]:
    """A JSON object from bytes, or ProtocolError (never any other exception)."""
    try:
        message = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        preview = bytes(data[:40])
        raise ProtocolError(f"not a JSON message ({type(exc).__name__}; starts {preview!r})") from None
    if not isinstance(message, dict):
        raise ProtocolError(f"a message is a JSON object, not a {type(message).__name__}")
    return message


# ---- schema helpers: each returns the checked value or raises ProtocolError naming the field ------
_T = TypeVar("_T")


def _fields(data: object, where: str, required: set[str], optional: set[str] | None = None) -> dict[str, Any]:
    d = _dict(data, where)
    missing = required - d.keys()
    unknown = d.keys() - required - (optional or set())
    if missing:
        raise ProtocolError(f"{where} lacks {', '.join(sorted(missing))}")
    if unknown:
        raise ProtocolError(f"{where} has unknown fields {', '.join(sorted(map(repr, unknown))[:5])}")
    return d


def _dict(value: object, where: str, limit: int | None = None) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ProtocolError(f"{where} is a {type(value).__name__}, not an object")
    if limit is not None and len(value) > limit:
        raise ProtocolError(f"{where} has {len(value)} entries (at most {limit})")
    return value


def _list(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise ProtocolError(f"{where} is a {type(value).__name__}, not a list")
    return value


def _typed(value: object, kind: type[_T], where: str) -> _T:
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ProtocolError(f"{where} is a {type(value).__name__}, not a {kind.__name__}")
    return value


def _text(value: object, where: str, limit: int) -> str:
    text = _typed(value, str, where)
    if len(text) > limit:
        raise ProtocolError(f"{where} has {len(text)} characters (at most {limit})")
    return text


def _bool(value: object, where: str) -> bool:
    return _typed(value, bool, where)


def _int(value: object, where: str, low: int, high: int) -> int:
    number = _typed(value, int, where)
    if not low <= number <= high:
        raise ProtocolError(f"{where} is {number}, outside {low}..{high}")
    return number


def _is_finite(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)  # an int of any size is finite


def _number(value: object, where: str) -> float:
    if not _is_finite(value):
        raise ProtocolError(f"{where} is {type(value).__name__} {str(value)[:20]!r}, not a finite number")
    return value  # type: ignore[return-value]


def _status(value: object, where: str) -> str:
    status = _text(value, where, 20)
    if status not in STATUSES:
        raise ProtocolError(f"{where} is {status!r}, not one of {', '.join(sorted(STATUSES))}")
    return status
