"""``kernelsmith::triton_kernel`` on the CPU: when the backend picks it, and what it does when it can't.

The op pays only with compiled Triton kernels (Inductor traces ``wrap_triton`` launches of
``JITFunction``s), so on the CPU (the Triton interpreter, ``InterpretedFunction``) the backend
must keep ``kernelsmith::kernel`` and say why, once. :func:`triton_ops.choose` is tested on real
``JITFunction`` and ``InterpretedFunction`` objects (built here from a Python function, never
launched); the GPU side (Inductor's code holding the kernel, AOTInductor packages) is
tests/gpu/test_triton_ops_gpu.py.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from kernelsmith import dispatch
from kernelsmith.db import DecisionRecord, open_database
from kernelsmith.frontends import backend as ks_backend
from kernelsmith.frontends import triton_ops
from kernelsmith.ops import _launch, get_op
from kernelsmith.testing.decisions import store_kernel_decisions

EPS = 1e-6


def _device_code(x_ptr, n):  # only ever wrapped, never compiled or launched
    pass


COMPILED = JITFunction(_device_code)
INTERPRETED = InterpretedFunction(_device_code)
EVERYTHING = {"supported": None, "static": True, "winner": True, "training": False, "kernels": [COMPILED]}


def test_choose_takes_the_triton_op_when_every_condition_holds():
    assert triton_ops.choose(**EVERYTHING) == triton_ops.Choice(True)


@pytest.mark.parametrize(
    ("fact", "value", "reason"),
    [
        ("supported", "torch 2.3 has no torch.library.triton_op / wrap_triton", "no torch.library.triton_op"),
        ("static", False, "symbolic sizes"),
        ("winner", False, "no kernel winner"),
        ("training", True, "training graph"),
        ("kernels", [], "launches no kernel"),
        ("kernels", [INTERPRETED], "InterpretedFunction"),
        ("kernels", [COMPILED, INTERPRETED], "InterpretedFunction"),
        ("kernels", [object()], "not compiled Triton kernels (object"),
    ],
)
def test_choose_keeps_kernelsmith_kernel_when_one_condition_fails(fact, value, reason):
    choice = triton_ops.choose(**{**EVERYTHING, fact: value})
    assert not choice.triton_op
    assert reason in choice.reason


def test_a_torch_without_triton_op_is_unsupported(monkeypatch):
    assert triton_ops.unsupported_reason() is None  # torch 2.11+ has it
    monkeypatch.delattr(torch.library, "triton_op")
    assert "no torch.library.triton_op" in triton_ops.unsupported_reason()


# ---- a real site: RMSNorm with a stored winner ---------------------------------------------------------
class RMSNorm(nn.Module):
    """Llama's RMSNorm, as the backend recognizes it."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + EPS))


def _winner(shape=(4, 64)) -> tuple[list[torch.Tensor], str, DecisionRecord]:
    """Meta inputs of an RMSNorm workload, its constants and a stored kernel winner for its bucket."""
    family = get_op("rmsnorm")
    inputs = [torch.empty(shape, device="meta"), torch.empty(shape[-1:], device="meta")]
    spec = family.spec_for(*inputs, eps=EPS)
    store_kernel_decisions(None, [spec])
    with open_database() as db:
        record = dispatch.lookup_decision(db, "interpreter", family, spec)
    assert record is not None and record.winner == "kernel"
    return inputs, dispatch.constants_json({"eps": EPS}), record


def test_launched_kernels_lists_the_variants_kernel_without_launching_it():
    inputs, constants, record = _winner()
    decision = dispatch.encode_decisions([record], "interpreter")
    kernels = triton_ops.launched_kernels("rmsnorm", inputs, constants, decision, "interpreter")
    module = __import__(get_op("rmsnorm").__module__, fromlist=["_"])
    assert kernels == [getattr(module, f"_rmsnorm_{record.variant}_kernel")]
    assert isinstance(kernels[0], InterpretedFunction)  # so the choice below is kernelsmith::kernel
    # the switch was for that build only: an eager launcher is Triton's own again
    assert _launch.direct_launch(kernels[0], (1,)) is not triton_ops._never_launched


def test_site_decision_under_the_interpreter_is_kernelsmith_kernel_and_says_why_once(caplog):
    inputs, constants, record = _winner()
    triton_ops._logged.clear()
    triton_ops._decided.clear()
    with caplog.at_level(logging.INFO, logger=triton_ops.__name__):
        for _ in range(2):
            decision = triton_ops.site_decision("rmsnorm", inputs, constants, record, "interpreter",
                                                torch.device("cpu"), static=True, training=False)
            assert decision == ""
    messages = [r.getMessage() for r in caplog.records if "is called through kernelsmith::kernel" in r.getMessage()]
    assert len(messages) == 1 and "InterpretedFunction" in messages[0]


def test_site_decision_without_a_winner_or_with_symbolic_sizes_is_kernelsmith_kernel():
    inputs, constants, record = _winner()
    for static, given in ((True, None), (False, record)):
        assert triton_ops.site_decision("rmsnorm", inputs, constants, given, "interpreter", torch.device("cpu"),
                                        static=static, training=False) == ""


def test_the_backend_calls_kernelsmith_kernel_under_the_interpreter(monkeypatch):
    import torch._inductor.compile_fx as inductor

    seen: list[torch.fx.GraphModule] = []

    def compile_fx(gm, example_inputs, **kwargs):  # Inductor on the CPU takes seconds: run the graph
        seen.append(gm)
        return gm.forward

    monkeypatch.setattr(inductor, "compile_fx", compile_fx)
    _winner((4, 64))
    torch.manual_seed(0)
    module, x = RMSNorm(64), torch.randn(4, 64)
    torch._dynamo.reset()
    backend = ks_backend.KernelsmithBackend()
    with torch.no_grad():
        out = torch.compile(module, backend=backend)(x)
        expected = module(x)
    (graph,) = seen
    targets = [n.target for n in graph.graph.nodes if n.op == "call_function"]
    assert torch.ops.kernelsmith.kernel.default in targets
    assert triton_ops.OP not in targets
    (site,) = backend.sites
    assert site.status == "replaced" and site.triton_decision == ""
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_the_op_called_eagerly_runs_the_carried_kernel_or_else_the_reference():
    """Not the backend's choice on the CPU, but a program may call the op anywhere: eagerly it
    launches the carried kernel (the interpreter's, here) where the decision serves the call's
    workload, and computes the family's reference where it does not."""
    _, constants, record = _winner()
    decision = dispatch.encode_decisions([record], "interpreter")
    family = get_op("rmsnorm")
    torch.manual_seed(1)
    triton_ops._RUNNERS.clear()
    for rows, width, served in ((4, 64, True), (4, 4096, False)):  # the decision's workload; another one
        x, weight = torch.randn(rows, width), torch.randn(width)
        (out,) = triton_ops.OP("rmsnorm", [x, weight], constants, decision)
        (expected,) = family.reference(family.spec_for(x, weight, eps=EPS), [x, weight])
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        runners = [r for key, r in triton_ops._RUNNERS.items() if key[3][0] == (rows, width)]
        assert len(runners) == 1 and (runners[0] is not None) == served
        if served:
            assert runners[0].variant == record.variant


def test_the_body_is_traced_inside_the_fake_mode_of_its_examples(monkeypatch):
    """As AOTAutograd traces: with the examples' fake mode on the dispatch stack while the body
    runs. torch 2.11's Triton kernel-call operator has no implementation for FakeTensor
    arguments outside a fake mode, so a trace outside it recorded no launch on the H200 and
    every site kept ``kernelsmith::kernel`` (torch 2.13 accepts both)."""
    seen: list[object] = []

    def body(op, tensors, constants, decision):
        seen.append(torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE))
        return [tensors[0] * 2]

    monkeypatch.setattr(triton_ops, "_body", body)
    inputs, constants, _ = _winner()
    graph = triton_ops.trace_body("rmsnorm", inputs, constants, "", torch.device("cpu"))
    assert isinstance(graph, torch.fx.GraphModule), graph
    assert len(seen) == 1 and seen[0] is not None
    assert any(n.target is torch.ops.aten.mul.Tensor for n in graph.graph.nodes)


# ---- compiled kernels, traced on the CPU (a process without the interpreter) -----------------------------
COMPILED_KERNELS = textwrap.dedent("""
    import os, sys
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.pop("KERNELSMITH_INTERPRET", None)
    import torch
    from kernelsmith import dispatch
    from kernelsmith.db import DecisionRecord
    from kernelsmith.frontends import triton_ops
    from kernelsmith.ops import get_op

    family = get_op("rmsnorm")
    inputs = [torch.empty(64, 1024, device="meta"), torch.empty(1024, device="meta")]
    spec = family.spec_for(*inputs, eps=1e-6)
    bucket = family.bucket(spec)
    variant = family.variants[0]
    config = variant.space(bucket).configs()[0]
    record = DecisionRecord("fp", bucket.workload_hash, "rmsnorm", bucket.to_dict(), "kernel", variant.name,
                            variant.source_hash, config.to_dict(), {})
    constants = dispatch.constants_json({"eps": 1e-6})
    cuda = torch.device("cuda")  # fake CUDA tensors: nothing is allocated or launched
    decision = triton_ops.site_decision("rmsnorm", inputs, constants, record, "gpu", cuda, static=True,
                                        training=False)
    assert decision == dispatch.encode_decisions([record], "gpu"), decision
    for training, static in ((True, True), (False, False)):
        assert triton_ops.site_decision("rmsnorm", inputs, constants, record, "gpu", cuda, static=static,
                                        training=training) == ""
    graph = triton_ops.trace_body("rmsnorm", inputs, constants, decision, cuda)
    (launch,) = [n for n in graph.graph.nodes if n.target is triton_ops._kernel_call()]
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
    kernel = kernel_side_table.get_kernel(launch.kwargs["kernel_idx"])
    # torch moves num_warps / num_stages into a one-config autotuner around the kernel
    (launch_config,) = kernel.configs
    assert launch_config.num_warps == int(config["num_warps"]), launch_config
    module = sys.modules[family.__module__]
    assert kernel.fn is getattr(module, f"_rmsnorm_{variant.name}_kernel"), kernel.fn
    assert launch.kwargs["grid"] == [(64, 1, 1)], launch.kwargs["grid"]
    assert launch.kwargs["kwargs"]["BLOCK_N"] == int(config.to_dict().get("BLOCK_N", 1024))

    # AOTAutograd (what Inductor runs first) decomposes the op into Triton's functional kernel call
    from functorch.compile import aot_function, make_boxed_func
    from torch._higher_order_ops.triton_kernel_wrap import triton_kernel_wrapper_functional
    from torch._subclasses.fake_tensor import FakeTensorMode

    graphs = []

    def forward_compiler(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    with FakeTensorMode():
        x, w = torch.empty(64, 1024, device="cuda"), torch.empty(1024, device="cuda")
    compiled = aot_function(lambda a, b: triton_ops.OP("rmsnorm", [a, b], constants, decision)[0],
                            fw_compiler=forward_compiler)
    try:
        compiled(x, w)  # fake CUDA inputs: the compiled graph cannot run here, only be made
    except RuntimeError:
        pass
    (forward,) = graphs
    targets = [n.target for n in forward.graph.nodes]
    assert triton_kernel_wrapper_functional in targets and triton_ops.OP not in targets, forward.code
    print("traced", variant.name)
""")


def test_with_compiled_kernels_the_choice_is_the_triton_op_and_its_body_traces_to_the_kernel(tmp_path):
    """In a process where ``@triton.jit`` makes real ``JITFunction``s (no interpreter), a static
    inference site with a winner gets the op, and its body traces (fake CUDA tensors, no GPU
    needed) to exactly one launch of the variant's kernel at its grid and config."""
    done = subprocess.run([sys.executable, "-c", COMPILED_KERNELS], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "KERNELSMITH_DB": str(tmp_path / "empty.db")})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("traced"), done.stdout
