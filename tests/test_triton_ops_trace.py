"""What the probe of ``kernelsmith::triton_kernel`` makes of a launcher, on the CPU (issue 14).

:func:`triton_ops.site_decision` gives a site the Triton op only when one trace of the op's body on
fake inputs (:func:`triton_ops.trace_body`) records its Triton launches and nothing Inductor cannot
take. Two launchers tell whether that probe judges the launcher itself:

* decode_matmul's split-K reduction by the last program to arrive (``REDUCE="last_program"``)
  zeroes its arrival counters with the family's own kernel, per call, launched through
  kernelsmith's launcher (commit 49feb5b; before it, a raw ``kernel[grid]`` launch on the first
  call only, kept between calls, which no trace can record). It traces now: the site gets the op.
* The same launcher wrapped so that it reads a value of its input on the host
  (:func:`reading_the_host`, patched in at :func:`triton_ops._build`, what both the probe's kernel
  listing and the traced body build through) cannot be traced: the site keeps
  ``kernelsmith::kernel`` and the log says "cannot be traced". The same wrapper without the read
  traces, so it is the read that the probe refuses, not the wrapping.

In this suite's own process every Triton kernel is the interpreter's ``InterpretedFunction``:
:func:`triton_ops.choose` refuses those before any probe (tests/test_triton_ops.py), so the probe is
never reached and a host read and the interpreter could not be told apart. The checks therefore run
in a subprocess without the interpreter, where ``@triton.jit`` makes real ``JITFunction`` s and fake
CUDA tensors stand in for the GPU (nothing is allocated or launched), as
tests/test_triton_ops.py's compiled-kernel test does. The GPU side (the op compiled by Inductor and
run, the host read on a machine with CUDA) is tests/gpu/test_triton_ops_gpu.py, which uses the
helpers below.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest
import torch

OP = "decode_matmul"
SHAPE = (2, 768, 512)  # M x N x K: x (2, 512) against an nn.Linear weight (768, 512)
DTYPE = "bf16"


def last_program_site() -> tuple[list[torch.Tensor], str, Any]:
    """A decode_matmul site (meta inputs, constants) and a kernel decision for its bucket whose
    config reduces split-K partials in the last program to arrive, with four splits (so a block's
    counter counts to three before its last program reduces)."""
    from kernelsmith import dispatch
    from kernelsmith.db import DecisionRecord
    from kernelsmith.ops import get_op

    family = get_op(OP)
    spec = family.spec(SHAPE, DTYPE)
    bucket = family.bucket(spec)
    variant, config = next((v, c) for v in family.variants for c in v.space(bucket).configs()
                           if c.to_dict().get("REDUCE") == "last_program" and c.to_dict().get("SPLIT_K") == 4)
    record = DecisionRecord("fp", bucket.workload_hash, spec.op, bucket.to_dict(), "kernel", variant.name,
                            variant.source_hash, config.to_dict(), {})
    inputs = [torch.empty(t.shape, dtype=t.torch_dtype, device="meta") for t in spec.inputs]
    return inputs, dispatch.constants_json(dict(spec.constants)), record


def reading_the_host(build: Callable[..., Any], *, read: bool = True) -> Callable[..., Any]:
    """``triton_ops._build`` whose runners' launchers first read their input's first element on
    the host (``.item()``: a device-to-host copy, data a trace does not have) when ``read``, and
    otherwise only wrap the family's launcher (the control: the same wrapping, no read)."""

    def wrapped_build(*args: Any, **kwargs: Any) -> Any:
        runner = build(*args, **kwargs)
        if runner is None:  # the decision does not serve these inputs: the reference runs
            return None
        family_launcher = runner.launcher

        def launcher(inputs: Any, outputs: Any) -> None:
            if read:
                inputs[0].flatten()[0].item()
            family_launcher(inputs, outputs)

        return dataclasses.replace(runner, launcher=launcher)

    return wrapped_build


# ---- the probe without the interpreter, in a subprocess -------------------------------------------------
PROBE = textwrap.dedent("""
    import json, logging, os, sys
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.pop("KERNELSMITH_INTERPRET", None)
    import torch
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
    from kernelsmith.frontends import triton_ops
    from test_triton_ops_trace import last_program_site, reading_the_host

    messages = []

    class Collect(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    logging.getLogger(triton_ops.__name__).addHandler(Collect())
    logging.getLogger(triton_ops.__name__).setLevel(logging.INFO)
    inputs, constants, record = last_program_site()
    cuda = torch.device("cuda")  # fake CUDA tensors: nothing is allocated or launched
    real_build = triton_ops._build
    found = {}
    for name, build in (("family", real_build), ("wrapped", reading_the_host(real_build, read=False)),
                        ("host_read", reading_the_host(real_build))):
        triton_ops._build = build
        triton_ops._decided.clear()
        triton_ops._logged.clear()
        del messages[:]
        decision = triton_ops.site_decision("decode_matmul", inputs, constants, record, "gpu", cuda, static=True,
                                            training=False)
        launched = []
        if decision:
            graph = triton_ops.trace_body("decode_matmul", inputs, constants, decision, cuda)
            for node in graph.graph.nodes:
                if node.target is triton_ops._kernel_call():
                    kernel = kernel_side_table.get_kernel(node.kwargs["kernel_idx"])
                    launched.append(getattr(kernel, "fn", kernel).__name__)
        found[name] = {"decision": decision, "messages": list(messages), "launched": launched}
    print(json.dumps(found))
""")


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The probe's answers for the family's launcher, the wrapped one and the host-reading one."""
    tests = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH", "")) if p)
    db = str(tmp_path_factory.mktemp("probe") / "empty.db")
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "KERNELSMITH_DB": db, "PYTHONPATH": path})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_the_last_program_launcher_traces_and_gets_the_triton_op(probed):
    """The stale premise of issue 14: decode_matmul's last_program launcher holds no host state since
    49feb5b, so its site gets the op, and its trace records the counters' zeroing kernel then the
    split-K kernel (both through ``wrap_triton``)."""
    family = probed["family"]
    assert family["decision"], family["messages"]
    (entry,) = json.loads(family["decision"])["entries"]
    assert entry["config"]["REDUCE"] == "last_program" and entry["config"]["SPLIT_K"] == 4
    assert family["launched"] == ["_zero_kernel", "_decode_split_k_kernel"]
    assert not any("cannot be traced" in m for m in family["messages"])


def test_a_launcher_that_reads_the_host_keeps_kernelsmith_kernel_and_says_why(probed):
    """The error the read raises under the trace depends on the torch build (a CPU-only torch says it
    has no CUDA support, one with CUDA that the value depends on data), so the reason is checked
    for what the probe says, "cannot be traced", and the control shows that the read is its cause."""
    wrapped, host_read = probed["wrapped"], probed["host_read"]
    # the control: wrapping the family's launcher changes nothing the probe sees
    assert wrapped["decision"] == probed["family"]["decision"] != ""
    assert wrapped["launched"] == probed["family"]["launched"]
    # the read: the site keeps kernelsmith::kernel, and the reason is the trace, logged once
    assert host_read["decision"] == ""
    reasons = [m for m in host_read["messages"] if "is called through kernelsmith::kernel" in m]
    assert len(reasons) == 1 and "its launcher cannot be traced" in reasons[0], host_read["messages"]
