"""Constants a decorated function reads from outside its arguments, changed after the first call.

A global ``EPS``, ``self.eps``, a closure variable or a default reaches the captured graph as a
bare number; before issue 12 the table entry kept serving the kernel built with the captured
value (a relative error of about 70x here). Each test first proves the kernel is really served
(so the test could fail), then changes the value and compares with the undecorated function.
Runs in the Triton interpreter (conftest); winners are stored directly, as a GPU run would have.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

import kernelsmith
from kernelsmith.frontends.capture import capture, constant_reads, format_path
from kernelsmith.frontends.recognize import recognize
from kernelsmith.ops import get_op
from test_decorator import store_decision

EPS = 1e-6
ROWS, COLS = 6, 96


@pytest.fixture
def db(tmp_path) -> str:
    return str(tmp_path / "constants.db")


@pytest.fixture
def data() -> tuple[torch.Tensor, torch.Tensor]:
    # Rows of RMS about 1e-3, so that eps = 1e-2 instead of 1e-6 changes every value.
    return torch.randn(ROWS, COLS) * 1e-3, torch.randn(COLS)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def global_eps_rmsnorm(x, weight):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * weight


def _store(db: str, x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    store_decision(db, get_op("rmsnorm").spec_for(x, weight, eps=eps))


def _served_then_right(fn, original, change, *args, state=None) -> None:
    """The kernel serves the second call; after ``change()`` the result is the original's."""
    state = state or fn.kernelsmith
    fn(*args)
    fn(*args)
    assert state.stats["kernel_calls"] == 1, state.reasons
    change()
    y = fn(*args)
    expected = original(*args)
    assert torch.allclose(y, expected, rtol=1e-4, atol=1e-5), (y - expected).abs().max()


def test_a_changed_module_global(db, data, monkeypatch):
    x, w = data
    _store(db, x, w, 1e-6)
    fn = kernelsmith.optimize(global_eps_rmsnorm, mode="db", db=db)
    _served_then_right(fn, global_eps_rmsnorm, lambda: monkeypatch.setattr(sys.modules[__name__], "EPS", 1e-2), x, w)


def test_a_changed_global_is_served_by_the_kernel_of_its_new_value(db, data, monkeypatch):
    x, w = data
    _store(db, x, w, 1e-6)
    _store(db, x, w, 1e-2)
    fn = kernelsmith.optimize(global_eps_rmsnorm, mode="db", db=db)
    _served_then_right(fn, global_eps_rmsnorm, lambda: monkeypatch.setattr(sys.modules[__name__], "EPS", 1e-2), x, w)
    y = fn(x, w)  # recognized again with eps = 1e-2, whose winner is stored: the kernel again
    assert fn.kernelsmith.stats["kernel_calls"] == 2
    assert torch.allclose(y, _rms(x, w, 1e-2), rtol=1e-4, atol=1e-5)


def test_a_changed_closure_variable(db, data):
    x, w = data
    _store(db, x, w, 1e-6)
    eps = 1e-6

    def closure_rmsnorm(a, weight):
        return _rms(a, weight, eps)  # eps is a cell of this closure

    def change() -> None:
        nonlocal eps
        eps = 1e-2

    fn = kernelsmith.optimize(closure_rmsnorm, mode="db", db=db)
    _served_then_right(fn, closure_rmsnorm, change, x, w)


class _Norm(torch.nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n))
        self.eps = 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def test_a_changed_self_eps_of_a_decorated_module_method(db, data):
    x, _ = data

    class Norm(_Norm):
        forward = kernelsmith.optimize(_Norm.forward, mode="db", db=db)  # self is the first argument

    norm = Norm(COLS)
    _store(db, x, norm.weight.detach(), 1e-6)
    with torch.no_grad():
        change = lambda: setattr(norm, "eps", 1e-2)
        _served_then_right(norm, lambda a: _Norm.forward(norm, a), change, x, state=Norm.forward.kernelsmith)


def test_a_changed_self_eps_of_a_decorated_module(db, data):
    x, _ = data
    norm = _Norm(COLS)
    _store(db, x, norm.weight.detach(), 1e-6)
    fn = kernelsmith.optimize(norm, mode="db", db=db)
    with torch.no_grad():
        _served_then_right(fn, norm, lambda: setattr(norm, "eps", 1e-2), x)


def test_a_changed_eps_of_a_torch_module_called_from_a_closure(db, data):
    x, _ = data
    norm = torch.nn.RMSNorm(COLS, eps=1e-6)
    _store(db, x, norm.weight.detach(), 1e-6)
    fn = kernelsmith.optimize(lambda a: norm(a), mode="db", db=db)  # eps is read by RMSNorm.forward
    with torch.no_grad():
        _served_then_right(fn, norm, lambda: setattr(norm, "eps", 1e-2), x)


def _default_eps_rmsnorm(x, weight, eps=1e-6):
    return _rms(x, weight, eps)


def test_a_changed_default_argument(db, data):
    x, w = data
    _store(db, x, w, 1e-6)
    original = types.FunctionType(_default_eps_rmsnorm.__code__, globals(), "f", (1e-6,))  # a copy to change
    fn = kernelsmith.optimize(original, mode="db", db=db)
    _served_then_right(fn, original, lambda: setattr(original, "__defaults__", (1e-2,)), x, w)


def test_a_changed_attribute_of_a_default_config_object(db, data):
    x, w = data
    _store(db, x, w, 1e-6)
    config = types.SimpleNamespace(eps=1e-6)

    def configured(a, weight, cfg=config):
        return _rms(a, weight, cfg.eps)

    fn = kernelsmith.optimize(configured, mode="db", db=db)
    _served_then_right(fn, configured, lambda: setattr(config, "eps", 1e-2), x, w)


def test_the_reads_are_listed_with_where_they_come_from():
    norm = _Norm(COLS)
    eps = 1e-5

    def f(a):
        return norm(a) + eps

    paths = {format_path(r.path): r.value for r in constant_reads(f, (torch.randn(2, COLS),), {})}
    assert paths == {"fn.<closure 0>": 1e-5, "fn.<closure 1>.eps": 1e-6}
    assert constant_reads(global_eps_rmsnorm, (), {})[0].path == (("fn", None), ("global", "EPS"))
    # torch's own code and module globals are not followed: F.rms_norm reads no outside value.
    assert constant_reads(lambda a: torch.nn.functional.rms_norm(a, (96,)), (), {}) == []


def test_a_function_that_rebinds_what_it_reads_is_refused_with_a_reason():
    state = types.SimpleNamespace(eps=1e-6)

    def drifting(a, weight):
        state.eps *= 2  # every call computes with another eps
        return _rms(a, weight, state.eps)

    recognition = recognize(drifting, (torch.randn(4, COLS), torch.randn(COLS)))
    assert recognition.match is None
    assert "changes fn.<closure 0>.eps while it runs" in recognition.reason


def test_a_list_the_function_appends_to_is_bookkeeping_not_a_constant():
    log: list[int] = []

    def logged(a):
        log.append(1)
        return torch.softmax(a, -1)

    graph = capture(logged, (torch.randn(2, 8),), {})
    assert graph.problems == [] and graph.signature is not None and graph.signature.reads == ()


def test_checking_the_reads_is_cheap():
    """Every served call re-reads them: well under the few microseconds a launch costs."""
    import timeit

    norm = _Norm(COLS)
    args = (norm, torch.randn(2, COLS))
    graph = capture(_Norm.forward, args, {})
    assert graph.signature is not None and len(graph.signature.reads) == 1
    seconds = min(timeit.repeat(lambda: graph.signature.reads_mismatch(args, {}), number=2000, repeat=5)) / 2000
    assert seconds < 20e-6  # about 0.4 us here; generous for a loaded CI machine
