"""Compiled and exported programs that carry their kernels; decorate-then-compile; the op's
registration and its opcheck; configs pinned in code (issue 14, items 2 and 3).

In the Triton interpreter (conftest); winners are stored directly, as a GPU run would have.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from dataclasses import replace

import pytest
import torch
import torch._dynamo.testing

import kernelsmith
from gpu.test_stress_data_gpu import SHAPES
from kernelsmith import dispatch
from kernelsmith.ops import get_op, op_names
from test_decorator import _store_forward_and_backward, hf_rmsnorm, last_dim_softmax, store_decision
from test_pt2_dynamic import WIDTH, Norm, served_rows


@pytest.fixture
def db(tmp_path, monkeypatch) -> str:
    path = str(tmp_path / "programs.db")
    monkeypatch.setenv("KERNELSMITH_DB", path)
    torch._dynamo.reset()
    dispatch._RUNNERS.clear()
    return path


def kernel_calls(gm: torch.fx.GraphModule) -> list[str]:
    return [n.args[0] for n in gm.graph.nodes if n.target is torch.ops.kernelsmith.kernel.default]


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "KERNELSMITH_INTERPRET": "1", **env}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=environment, timeout=300)


def test_import_kernelsmith_registers_the_op_without_importing_torch():
    done = run_python("""
        import sys
        import kernelsmith
        assert "torch" not in sys.modules, "import kernelsmith imported torch"
        import torch
        print(torch.ops.kernelsmith.kernel.default)
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "kernelsmith.kernel.default"


def test_an_exported_program_runs_its_kernel_where_the_database_is_empty(db, tmp_path):
    store_decision(db, get_op("rmsnorm").spec_for(torch.randn(16, WIDTH), torch.ones(WIDTH), eps=1e-6))
    model = Norm()
    batch = torch.export.Dim("batch", min=2, max=64)
    with torch.no_grad():
        program = torch.export.export(model, (torch.randn(12, WIDTH),), dynamic_shapes={"x": {0: batch}})
    path = str(tmp_path / "norm.pt2")
    torch.export.save(program, path)
    torch.save(model.weight.detach(), str(tmp_path / "weight.pt"))
    empty = str(tmp_path / "empty.db")
    done = run_python(f"""
        import torch, kernelsmith
        from kernelsmith import dispatch
        from kernelsmith.frontends.torch_op import output_metas
        program = torch.export.load({path!r})
        weight = torch.load({str(tmp_path / "weight.pt")!r})
        for rows in (11, 40):
            x = torch.randn(rows, {WIDTH})
            with torch.no_grad():
                y = program.module()(x)
            xf = x.float()
            expected = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)) * weight
            torch.testing.assert_close(y, expected, atol=1e-5, rtol=1e-4)
        for key, runner in sorted(dispatch._RUNNERS.items(), key=lambda item: item[0][3][0][0]):
            print(key[3][0][0], runner.runner.variant if runner is not None else "reference")
    """, KERNELSMITH_DB=empty)
    assert done.returncode == 0, done.stderr
    # 11 rows: the 16-row bucket the program carries; 40 rows: a bucket nobody tuned
    assert done.stdout.split() == ["11", "whole_row", "40", "reference"]


def _exported_static_norm(db: str) -> tuple[Norm, torch.export.ExportedProgram]:
    """A module calling a decorated RMSNorm, exported at a static 12 rows (the 16-row bucket has
    a stored winner), with no gradient."""
    store_decision(db, get_op("rmsnorm").spec_for(torch.randn(16, WIDTH), torch.ones(WIDTH), eps=1e-6))
    model = Norm()
    with torch.no_grad():
        return model, torch.export.export(model, (torch.randn(12, WIDTH),))


def test_a_static_export_under_the_interpreter_keeps_kernelsmith_kernel_and_says_why(db, caplog):
    """A static export would hold ``kernelsmith::triton_kernel`` (the carried kernel itself,
    which AOTInductor packages; tests/gpu/test_triton_ops_gpu.py), but the interpreter's kernels are not
    compiled Triton kernels: the program holds ``kernelsmith::kernel`` with its carried decisions."""
    from kernelsmith.frontends import triton_ops

    triton_ops._logged.clear()
    triton_ops._decided.clear()
    with caplog.at_level(logging.INFO, logger=triton_ops.__name__):
        _, program = _exported_static_norm(db)
    targets = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert torch.ops.kernelsmith.kernel.default in targets and triton_ops.register() not in targets
    assert any("InterpretedFunction" in r.getMessage() for r in caplog.records if r.name == triton_ops.__name__)


def test_a_static_export_holds_the_carried_kernel_and_runs_it_where_the_database_is_empty(db, tmp_path,
                                                                                        monkeypatch):
    """The choice made as on a GPU (the interpreter's kernels cannot be traced into Inductor's
    code, so :func:`triton_ops.site_decision` is told to take the op): the program holds
    ``kernelsmith::triton_kernel`` with the winner of its shape's bucket, and a process with an
    empty database that loads it runs that kernel (its eager call launches the interpreter's)."""
    from kernelsmith.frontends import triton_ops

    chosen: list[tuple[str, str]] = []

    def site_decision(op, inputs, constants, record, mode, device, *, static, training):
        assert static and not training
        chosen.append((op, record.variant))
        return dispatch.encode_decisions([record], mode)

    monkeypatch.setattr(triton_ops, "site_decision", site_decision)
    model, program = _exported_static_norm(db)
    assert chosen == [("rmsnorm", "whole_row")]
    (call,) = [n for n in program.graph.nodes if n.target is triton_ops.register()]
    others = {str(n.target) for n in program.graph.nodes if n.op == "call_function" and n is not call}
    assert others <= {"<built-in function getitem>"}, others  # no kernelsmith::kernel, nothing of the choice
    (entry,) = dispatch.parse_decisions(call.args[3]).values()
    assert entry.variant == "whole_row"
    path = str(tmp_path / "norm.pt2")
    torch.export.save(program, path)
    torch.save(model.weight.detach(), str(tmp_path / "weight.pt"))
    done = run_python(f"""
        import torch
        from kernelsmith.frontends import triton_ops
        triton_ops.register()  # before loading a program that holds it
        program = torch.export.load({path!r})
        weight = torch.load({str(tmp_path / "weight.pt")!r})
        x = torch.randn(12, {WIDTH})
        with torch.no_grad():
            y = program.module()(x)
        expected = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)) * weight
        torch.testing.assert_close(y, expected, atol=1e-5, rtol=1e-4)
        print(*[runner.variant if runner is not None else "reference" for runner in triton_ops._RUNNERS.values()])
    """, KERNELSMITH_DB=str(tmp_path / "empty.db"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["whole_row"]


def test_a_cold_compile_with_a_stored_winner_emits_the_op(db):
    x = torch.randn(6, WIDTH)
    store_decision(db, get_op("softmax").spec_for(x))
    fn = kernelsmith.optimize(last_dim_softmax, mode="db", db=db)
    counter = torch._dynamo.testing.CompileCounterWithBackend("eager")
    y = torch.compile(fn, backend=counter, fullgraph=True)(x)  # no eager call first
    torch.testing.assert_close(y, torch.softmax(x, -1), atol=1e-6, rtol=1e-5)
    assert kernel_calls(counter.graphs[0]) == ["softmax"]  # was: the original function, traced
    assert fn.kernelsmith.stats["calls"] == 0
    assert served_rows("softmax") == {6: True}


def test_without_a_stored_winner_the_compile_traces_the_original_function(db):
    fn = kernelsmith.optimize(last_dim_softmax, mode="db", db=db)
    counter = torch._dynamo.testing.CompileCounterWithBackend("eager")
    torch.compile(fn, backend=counter, fullgraph=True)(torch.randn(6, WIDTH))
    assert kernel_calls(counter.graphs[0]) == []  # Inductor gets the user's code to fuse


@pytest.mark.parametrize("fullgraph", [False, True])
def test_a_warmed_up_tuned_training_step_compiles(db, fullgraph):
    x = torch.randn(6, WIDTH)
    w = torch.randn(WIDTH) * 0.5 + 1
    _store_forward_and_backward(db, "rmsnorm", (x, w), eps=1e-6)
    fn = kernelsmith.optimize(hf_rmsnorm, mode="db", db=db)
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    fn(xs, ws)
    fn(xs, ws).sum().backward()  # warmed up: the eager entry is a KernelFunction
    assert fn.kernelsmith.stats["kernel_calls"] == 1, fn.kernelsmith.reasons

    def step(a, b):
        return fn(a, b).float().pow(2).sum()

    compiled = torch.compile(step, backend="aot_eager", fullgraph=fullgraph)  # was: NameError: 'torch'
    xs.grad = ws.grad = None
    compiled(xs, ws).backward()
    gx, gw = xs.grad, ws.grad
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    hf_rmsnorm(xr, wr).float().pow(2).sum().backward()
    torch.testing.assert_close(gx, xr.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(gw, wr.grad, atol=1e-4, rtol=1e-4)
    assert served_rows("rmsnorm") == {6: True}
    assert served_rows("rmsnorm_backward") == {6: True}  # the tuned backward, carried by the graph


def _pinned_softmax_config(x: torch.Tensor) -> dict[str, object]:
    family = get_op("softmax")
    variant = family.variants[0]
    return {"variant": variant.name, **variant.space(family.bucket(family.spec_for(x))).configs()[0].to_dict()}


def test_a_pinned_config_is_validated_then_served_without_a_database(db):
    x = torch.randn(6, WIDTH)
    fn = kernelsmith.optimize(last_dim_softmax, mode="db", db=db, config=_pinned_softmax_config(x))
    fn(x)
    y = fn(x)
    torch.testing.assert_close(y, torch.softmax(x, -1), atol=1e-6, rtol=1e-5)
    assert fn.kernelsmith.stats["kernel_calls"] == 1, fn.kernelsmith.reasons
    assert fn.kernelsmith.stats["tunes"] == 0
    counter = torch._dynamo.testing.CompileCounterWithBackend("eager")
    torch.compile(fn, backend=counter, dynamic=True)(torch.randn(9, WIDTH))
    assert kernel_calls(counter.graphs[0]) == ["softmax"]  # the pin travels with the graph
    assert served_rows("softmax")[9]


def test_a_pinned_config_outside_the_space_is_refused_with_a_warning(db, caplog):
    x = torch.randn(6, WIDTH)
    bad = {**_pinned_softmax_config(x), "num_warps": 3}
    fn = kernelsmith.optimize(last_dim_softmax, mode="db", db=db, config=bad)
    with caplog.at_level(logging.WARNING, logger="kernelsmith"):
        fn(x)
        y = fn(x)
    torch.testing.assert_close(y, torch.softmax(x, -1))
    assert fn.kernelsmith.stats["kernel_calls"] == 0
    assert any("pinned config" in r.getMessage() and "num_warps" in r.getMessage() for r in caplog.records)


def test_a_pinned_config_that_fails_validation_is_never_served(db, monkeypatch):
    from kernelsmith.evaluate import validate

    def reject(*args, **kwargs):
        raise validate.Rejected("validate", "output 0 wrong on a tail shape")

    monkeypatch.setattr(validate, "validate", reject)
    x = torch.randn(6, WIDTH)
    fn = kernelsmith.optimize(last_dim_softmax, mode="db", db=db, config=_pinned_softmax_config(x))
    fn(x)
    fn(x)
    assert fn.kernelsmith.stats["kernel_calls"] == 0
    assert any("failed validation" in why for why in fn.kernelsmith.reasons.values())


# Families in their own --shape terms (the stress test's table, plus decode attention: B x H x L x D).
OPCHECK_SHAPES = {**SHAPES, "decode_attention": (1, 4, 19, 16)}


def _opcheck_args(name: str) -> tuple[str, list[torch.Tensor], str]:
    family = get_op(name)
    spec = family.spec(OPCHECK_SHAPES.get(name, (13, 40)), "float32")
    inputs = list(family.make_inputs(spec, seed=0, device="cpu"))
    if family.backward is not None:  # differentiable through its backward family
        inputs = [t.requires_grad_() if t.dtype.is_floating_point else t for t in inputs]
    return name, inputs, dispatch.constants_json(dict(spec.constants))


@pytest.mark.parametrize("name", op_names())
def test_opcheck_passes_on_every_family(db, name):
    torch.library.opcheck(torch.ops.kernelsmith.kernel.default, _opcheck_args(name))  # every default util


def test_a_first_call_that_tunes_says_so_and_shows_progress_in_a_terminal(db, monkeypatch, caplog):
    import io
    import types

    from kernelsmith import tuner

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    monkeypatch.setattr(sys, "stderr", screen)

    def tune_spec(spec, *, progress=None, **options):
        for done in (1, 2):
            progress(done, 2, None)
        return types.SimpleNamespace(winner="baseline", evaluations=2)

    monkeypatch.setattr(tuner, "tune_spec", tune_spec)
    fn = kernelsmith.optimize(last_dim_softmax, mode="tune", db=db, budget=2)
    with caplog.at_level(logging.INFO, logger="kernelsmith"):
        fn(torch.randn(5, WIDTH))
    assert any("tuning softmax" in r.getMessage() and "waits" in r.getMessage() for r in caplog.records)
    assert screen.getvalue().endswith("2/2 candidates\n") and "1/2 candidates" in screen.getvalue()


def test_carried_decisions_are_read_field_by_field():
    family = get_op("softmax")
    spec = family.spec_for(torch.randn(8, WIDTH))
    variant = family.variants[0]
    record = dispatch.DecisionRecord("fp", spec.workload_hash, "softmax", spec.to_dict(), "kernel", variant.name,
                                     variant.source_hash, {"num_warps": 4})
    text = dispatch.encode_decisions([record], "gpu")
    (carried,) = dispatch.parse_decisions(text).values()
    assert (carried.variant, carried.config, carried.source_hash) == (variant.name, {"num_warps": 4},
                                                                      variant.source_hash)
    assert dispatch.encode_decisions([replace(record, winner="baseline")], "gpu") == ""
    forged = text.replace('"num_warps":4', '"num_warps":{"__reduce__":"os.system"}')
    assert dispatch.parse_decisions(forged) == {}  # a config value that is not a plain number or name
    assert dispatch.parse_decisions("not json") == {}
    assert dispatch.parse_decisions('{"kernelsmith_decisions": 99, "entries": []}') == {}
