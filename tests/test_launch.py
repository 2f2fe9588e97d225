"""DirectLaunch: a launch skips Triton's binding only when nothing the compiled kernel was
specialized on has changed; everything else goes through Triton.

Driven with a stand-in for a Triton kernel that records what each path received, so the logic is
tested without a GPU (tests/gpu/test_launch_gpu.py runs a real kernel).
"""

from __future__ import annotations

import inspect

import pytest
import torch

from kernelsmith.ops import _launch
from kernelsmith.ops._launch import DirectLaunch, direct_launch

REAL_HOOKS_SET = _launch._hooks_set  # before the fixture below stands in for it


def kernel_source(x_ptr, y_ptr, n, alpha, BLOCK: int = 128, MODE: str = "fast"):
    """The signature the stand-in kernel pretends to have (BLOCK and MODE play constexprs)."""


class FakeCompiled:
    def __init__(self, log: list) -> None:
        self.function = "function-handle"
        self.packed_metadata = "packed"
        self.log = log

    def run(self, *launch_args):
        self.log.append(("direct", launch_args))


class FakeKernel:
    """What DirectLaunch uses of a JITFunction: ``kernel[grid](*args, **meta)`` and ``signature``."""

    signature = inspect.signature(kernel_source)

    def __init__(self, compiled: bool = True) -> None:
        self.log: list = []
        self.compiled = FakeCompiled(self.log) if compiled else None

    def __getitem__(self, grid):
        def launch(*args, **meta):
            self.log.append(("triton", grid, args, meta))
            return self.compiled

        return launch


@pytest.fixture(autouse=True)
def _one_device(monkeypatch):
    monkeypatch.setattr(_launch, "_current_device", lambda: 0)
    monkeypatch.setattr(_launch, "_current_stream", lambda device: 1234)
    monkeypatch.setattr(_launch, "_hooks_set", lambda: False)


def aligned(n=64, dtype=torch.float32):
    return torch.zeros(n, dtype=dtype)


def paths(kernel):
    return [entry[0] for entry in kernel.log]


def test_first_call_goes_through_triton_then_launches_directly_with_every_parameter():
    kernel = FakeKernel()
    launch = DirectLaunch(kernel, (7,))
    x, y = aligned(), aligned()
    launch(x, y, 64, 0.5, BLOCK=256, num_warps=4)
    launch(x, y, 64, 0.5, BLOCK=256, num_warps=4)
    assert paths(kernel) == ["triton", "direct"]
    launch_args = kernel.log[1][1]
    grid, (stream, function, packed, metadata, enter, leave) = launch_args[:3], launch_args[3:9]
    assert (grid, stream, function, packed) == ((7, 1, 1), 1234, "function-handle", "packed")
    assert (metadata, enter, leave) == (None, None, None)
    # every parameter in signature order: positional arguments, then constexprs (defaults applied)
    assert launch_args[9:11] == (x, y) and launch_args[11:] == (64, 0.5, 256, "fast")
    assert launch.launches == {"direct": 1, "triton": 1}


def test_other_tensors_of_the_same_kind_launch_directly():
    kernel = FakeKernel()
    launch = DirectLaunch(kernel, (1, 2))
    launch(aligned(), aligned(), 64, 0.5)
    a, b = aligned(), aligned()
    launch(a, b, 64, 0.5)
    assert paths(kernel) == ["triton", "direct"]
    assert kernel.log[1][1][0:3] == (1, 2, 1) and kernel.log[1][1][9:11] == (a, b)


@pytest.mark.parametrize(
    "change",
    [
        "misaligned tensor",
        "other dtype",
        "other integer",
        "integer given as float",
        "other keyword",
        "extra keyword",
        "fewer arguments",
        "tensor replaced by a scalar",
    ],
)
def test_anything_the_specialization_depends_on_sends_the_call_through_triton(change):
    kernel = FakeKernel()
    launch = DirectLaunch(kernel, (4,))
    x, y = aligned(), aligned()
    launch(x, y, 64, 0.5, BLOCK=256)
    call = {
        "misaligned tensor": lambda: launch(x[1:], y, 64, 0.5, BLOCK=256),  # 4 bytes off: not 16-aligned
        "other dtype": lambda: launch(aligned(dtype=torch.float16), y, 64, 0.5, BLOCK=256),
        "other integer": lambda: launch(x, y, 65, 0.5, BLOCK=256),
        "integer given as float": lambda: launch(x, y, 64.0, 0.5, BLOCK=256),
        "other keyword": lambda: launch(x, y, 64, 0.5, BLOCK=128),
        "extra keyword": lambda: launch(x, y, 64, 0.5, BLOCK=256, num_warps=8),
        "fewer arguments": lambda: launch(x, y, 64, BLOCK=256),
        "tensor replaced by a scalar": lambda: launch(x, 0, 64, 0.5, BLOCK=256),
    }[change]
    call()
    assert paths(kernel) == ["triton", "triton"]
    launch(x, y, 64, 0.5, BLOCK=256)  # the recorded call still launches directly afterwards
    assert paths(kernel)[-1] == "direct"


def test_other_device_or_a_launch_hook_goes_through_triton(monkeypatch):
    kernel = FakeKernel()
    launch = DirectLaunch(kernel, (4,))
    x, y = aligned(), aligned()
    launch(x, y, 64, 0.5)
    monkeypatch.setattr(_launch, "_current_device", lambda: 1)
    launch(x, y, 64, 0.5)
    monkeypatch.setattr(_launch, "_current_device", lambda: 0)
    monkeypatch.setattr(_launch, "_hooks_set", lambda: True)
    launch(x, y, 64, 0.5)
    assert paths(kernel) == ["triton", "triton", "triton"]


def test_an_argument_it_cannot_check_means_triton_on_every_call():
    kernel = FakeKernel()
    launch = DirectLaunch(kernel, (4,))
    descriptor = object()  # a host tensor descriptor, say: no value to compare
    for _ in range(3):
        launch(descriptor, aligned(), 64, 0.5)
    assert paths(kernel) == ["triton"] * 3


def test_no_compiled_kernel_means_triton_on_every_call():
    kernel = FakeKernel(compiled=False)  # what the interpreter returns
    launch = DirectLaunch(kernel, (4,))
    for _ in range(3):
        launch(aligned(), aligned(), 64, 0.5)
    assert paths(kernel) == ["triton"] * 3


def test_direct_launch_is_plain_triton_for_the_interpreter_and_when_switched_off(monkeypatch):
    kernel = FakeKernel()  # not a JITFunction (as under TRITON_INTERPRET=1)
    launch = direct_launch(kernel, (4,))
    assert not isinstance(launch, DirectLaunch)
    launch(aligned(), aligned(), 64, 0.5)
    assert paths(kernel) == ["triton"]
    monkeypatch.setenv("KERNELSMITH_DIRECT_LAUNCH", "0")
    assert not _launch.direct_launch_enabled()


def test_an_empty_hook_chain_is_no_hook_and_an_added_hook_is_one():
    """Triton 3.6+ keeps launch hooks in HookChain objects that are never None: only a chain
    with a hook in it may send launches through Triton (a bug the first GPU run found)."""
    from triton import knobs

    assert REAL_HOOKS_SET() is False

    def hook(metadata):
        pass

    chain = knobs.runtime.launch_enter_hook
    if not hasattr(chain, "add"):
        pytest.skip("a Triton without hook chains")
    chain.add(hook)
    try:
        assert REAL_HOOKS_SET() is True
    finally:
        chain.remove(hook)
    assert REAL_HOOKS_SET() is False
