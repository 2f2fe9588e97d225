"""Optional webhook notifications when a tuning run finishes or fails.

A long search runs unattended; a message in a chat channel says when it is over. Set

* ``KERNELSMITH_WEBHOOK_URL``: where to POST (``http`` or ``https``), such as a Discord channel
  webhook; nothing is sent when it is unset or empty;
* ``KERNELSMITH_WEBHOOK_EVENTS`` (optional): a comma-separated subset of ``done,error``
  (default: both).

The body is Discord-compatible JSON, ``{"content": "..."}`` (at most 1,900 characters). The
message holds the op, the workload, the winner, the speedup and the search cost; never inputs,
paths or credentials.

The URL is a secret (a Discord webhook URL carries its token in the path): it is never printed
or logged; log lines name only its scheme and host (``https://discord.com/…``). Sending uses the
standard library only, with a short timeout, and can never break a tuning run: a failure is
logged (a warning the first time, then at debug level) and the functions return False.

>>> import os
>>> os.environ["KERNELSMITH_WEBHOOK_URL"] = "https://discord.com/api/webhooks/..."  # doctest: +SKIP
>>> kernelsmith.tune("softmax", x, budget=50)  # a message arrives when it is done  # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from kernelsmith import settings

log = logging.getLogger(__name__)

URL_ENV = "KERNELSMITH_WEBHOOK_URL"
EVENTS_ENV = "KERNELSMITH_WEBHOOK_EVENTS"
EVENTS: tuple[str, ...] = ("done", "error")
TIMEOUT_S = 5.0
MAX_CONTENT = 1900  # Discord rejects content over 2000 characters

_warned = False  # a failing webhook warns once per process, then logs at debug level


def redact(url: str) -> str:
    """The URL without its secret parts: scheme and host only (``https://host/…``)."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<unparseable URL>"
    return f"{parts.scheme or '?'}://{host}{port}/…"


def enabled_events() -> frozenset[str]:
    """The events to send, from ``KERNELSMITH_WEBHOOK_EVENTS`` (default: all)."""
    text = settings.get(EVENTS_ENV)
    if not text:
        return frozenset(EVENTS)
    asked = {e.strip().lower() for e in text.split(",") if e.strip()}
    unknown = asked - set(EVENTS)
    if unknown:
        log.warning("%s: ignoring unknown events %s (known: %s)", EVENTS_ENV, sorted(unknown), ", ".join(EVENTS))
    return frozenset(asked & set(EVENTS))


def _failed(message: str, *args: Any) -> bool:
    global _warned
    level = logging.DEBUG if _warned else logging.WARNING
    _warned = True
    log.log(level, "webhook notification not sent: " + message, *args)
    return False


def send(event: str, content: str, *, timeout_s: float = TIMEOUT_S) -> bool:
    """POST ``{"content": content}`` for ``event`` if a webhook is configured for it.

    Returns True when the receiver answered 2xx; False when nothing was configured, the event
    is switched off, or sending failed (logged, never raised).
    """
    url = settings.get(URL_ENV)
    if not url or event not in enabled_events():
        return False
    where = redact(url)
    try:
        scheme = urllib.parse.urlsplit(url).scheme.lower()
    except ValueError:
        scheme = ""
    if scheme not in ("http", "https"):  # urllib would also open file: and ftp: URLs
        return _failed("%s must be an http or https URL (got %s)", URL_ENV, where)
    body = json.dumps({"content": content[:MAX_CONTENT]}).encode()
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "kernelsmith-webhook"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            status = response.status
    except urllib.error.HTTPError as exc:  # the message holds the status, never the URL
        return _failed("%s answered HTTP %s", where, exc.code)
    except Exception as exc:  # a notification must never break the tuning
        # Exception texts can quote the URL (urllib's own errors do): log the type only.
        return _failed("%s: %s", where, type(exc).__name__)
    if not 200 <= status < 300:
        return _failed("%s answered HTTP %s", where, status)
    log.debug("webhook notification %r sent to %s", event, where)
    return True


def _workload(spec: dict[str, Any]) -> str:
    inputs = spec.get("inputs", [])
    return " ".join("x".join(map(str, t.get("shape", []))) + ":" + str(t.get("dtype", "?")) for t in inputs)


def tuning_done(result: Any) -> bool:
    """Send the ``done`` event for a :class:`~kernelsmith.tuner.TuneResult`; never raises."""
    try:
        if result.winner == "kernel":
            from kernelsmith.versus import speedup_text  # the speedup with its baseline named

            speedup = speedup_text("kernel", {"speedup": result.speedup_vs_baseline}, digits=3, ci=False)
            outcome = f"kernel {result.variant} wins: {speedup}"
        else:
            outcome = "the baseline stays (no candidate beat it with confidence)"
        cost = result.cost.describe() if getattr(result, "cost", None) else f"{result.evaluations} evaluations"
        content = (
            f"kernelsmith: tuned {result.op} {_workload(result.spec)} ({result.workload}) "
            f"in {result.mode} mode: {outcome}. Cost: {cost}."
        )
        if result.mode == "interpreter":
            content += " Interpreter timings are not GPU performance."
    except Exception as exc:
        return _failed("could not describe the result (%s)", type(exc).__name__)
    return send("done", content)


def tuning_failed(what: str, error: BaseException) -> bool:
    """Send the ``error`` event: ``what`` was being tuned, ``error`` stopped it; never raises."""
    text = f"{type(error).__name__}: {error}"[:500]
    return send("error", f"kernelsmith: tuning {what} failed: {text}")
