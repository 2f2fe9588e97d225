"""Webhook notifications against a local HTTP server: payload, opt-in, failures swallowed, and
the URL (a secret) never in the logs."""

from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from kernelsmith import notify
from kernelsmith.cli.main import app
from kernelsmith.cost import SearchCost
from kernelsmith.ops import get_op
from kernelsmith.tuner import TuneResult, tune_spec

SECRET = "SeCrEt-ToKeN-42"


class Receiver:
    """A webhook receiver on 127.0.0.1 that records what it is sent."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.status = 204
        self.delay_s = 0.0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                time.sleep(receiver.delay_s)
                self.send_response(receiver.status)
                self.end_headers()

            def log_message(self, *args: object) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/api/webhooks/123/{SECRET}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def contents(self) -> list[str]:
        return [json.loads(r["body"])["content"] for r in self.requests]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(monkeypatch):
    monkeypatch.setattr(notify, "_warned", False)
    monkeypatch.delenv(notify.EVENTS_ENV, raising=False)
    r = Receiver()
    monkeypatch.setenv(notify.URL_ENV, r.url)
    yield r
    r.close()


def fake_result(**overrides) -> TuneResult:
    data = dict(
        op="softmax", workload="abcd1234abcd1234", mode="gpu", winner="kernel", variant="online",
        spec={"inputs": [{"shape": [8192, 4096], "dtype": "bfloat16"}]}, speedup_vs_baseline=1.25,
        evaluations=12, cost=SearchCost(mode="gpu", evaluations=12, gpu_s=30.5, wall_s=41.0),
    )
    data.update(overrides)
    return TuneResult(**data)


def assert_no_secret(caplog) -> None:
    for record in caplog.records:
        assert SECRET not in record.getMessage()
    assert SECRET not in caplog.text


def test_done_payload_is_discord_json(receiver, caplog):
    caplog.set_level(logging.DEBUG, logger="kernelsmith")
    assert notify.tuning_done(fake_result()) is True
    (request,) = receiver.requests
    assert request["path"] == f"/api/webhooks/123/{SECRET}"
    assert request["headers"]["Content-Type"] == "application/json"
    payload = json.loads(request["body"])
    assert list(payload) == ["content"]
    content = payload["content"]
    assert "softmax" in content and "8192x4096:bfloat16" in content and "online" in content
    assert "1.250x" in content and "12 evaluations" in content and "30.5 GPU-s" in content
    assert_no_secret(caplog)


def test_interpreter_run_says_so_and_never_claims_gpu_time(receiver):
    cost = SearchCost(mode="interpreter", evaluations=3, interpreter_s=2.0, wall_s=4.0)
    notify.tuning_done(fake_result(mode="interpreter", winner="baseline", cost=cost))
    (content,) = receiver.contents()
    assert "baseline stays" in content and "interpreter-s" in content and "GPU-s" not in content
    assert "not GPU performance" in content


def test_nothing_is_sent_when_unset_or_event_switched_off(receiver, monkeypatch):
    monkeypatch.setenv(notify.EVENTS_ENV, "error")
    assert notify.tuning_done(fake_result()) is False
    assert notify.tuning_failed("softmax(...)", RuntimeError("boom")) is True
    monkeypatch.delenv(notify.URL_ENV)
    assert notify.tuning_failed("softmax(...)", RuntimeError("boom")) is False
    assert len(receiver.requests) == 1 and "boom" in receiver.contents()[0]


def test_long_content_is_cut_to_what_discord_accepts(receiver):
    notify.tuning_failed("softmax", ValueError("x" * 5000))
    notify.send("done", "y" * 5000)
    assert all(len(c) <= notify.MAX_CONTENT for c in receiver.contents())


def test_failures_are_swallowed_logged_once_and_never_show_the_url(receiver, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG, logger="kernelsmith")
    receiver.status = 500
    assert notify.send("done", "hello") is False
    receiver.status, receiver.delay_s = 204, 1.0
    assert notify.send("done", "slow", timeout_s=0.2) is False
    for bad in (
        "http://127.0.0.1:9/api/webhooks/123/" + SECRET,  # nothing listens on port 9
        "file:///etc/" + SECRET,  # urllib would read it
        "ht!tp://[not-a-host/" + SECRET,
    ):
        monkeypatch.setenv(notify.URL_ENV, bad)
        assert notify.send("error", "x") is False
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "HTTP 500" in warnings[0].getMessage()
    assert "127.0.0.1" in warnings[0].getMessage()  # the redacted form names the host
    assert_no_secret(caplog)


def test_redact_keeps_scheme_and_host_only():
    assert notify.redact("https://user:pw@discord.com/api/webhooks/1/" + SECRET + "?wait=true") == (
        "https://discord.com/…"
    )
    assert SECRET not in notify.redact("http://[broken/" + SECRET)


def test_tune_spec_notifies_on_completion(receiver):
    spec = get_op("softmax").spec((3, 24), "float32")
    result = tune_spec(spec, budget=1, strategy="grid", db=":memory:", workers=1)
    (content,) = receiver.contents()
    assert result.workload in content and "interpreter" in content and "1 evaluations" in content


def test_cli_tune_error_is_notified_and_still_raised(receiver, monkeypatch, tmp_path, caplog):
    import kernelsmith.tuner

    def broken(*args, **kwargs):
        raise RuntimeError("worker pool exploded")

    monkeypatch.setattr(kernelsmith.tuner, "tune_spec", broken)
    outcome = CliRunner().invoke(
        app, ["tune", "softmax", "--shape", "6x48", "--dtype", "fp32", "--db", str(tmp_path / "t.db"), "--json"]
    )
    assert outcome.exit_code != 0 and isinstance(outcome.exception, RuntimeError)
    (content,) = receiver.contents()
    assert "failed" in content and "RuntimeError: worker pool exploded" in content and "softmax" in content
    assert SECRET not in outcome.output
    assert_no_secret(caplog)
