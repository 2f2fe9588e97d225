"""``kernelsmith::triton_kernel`` on the GPU: Inductor compiles the tuned kernel, AOTInductor packages it.

The compile backend calls a static inference site with a stored winner through the
``torch.library.triton_op`` (:mod:`kernelsmith.frontends.triton_ops`); Inductor then traces the
op's body down to its ``wrap_triton`` launch, so the variant's kernel appears in Inductor's own
generated code and no ``kernelsmith::kernel`` call remains. A program exported with the op (the
backend's decision carried in it, or a decorated function exported at a static shape, whose
program holds the op with its shape's winner) compiles with ``aoti_compile_and_package`` into a
package that runs in a process which never imports kernelsmith and whose database is empty.

The winner is stored as a GPU tuning run would store it (kernelsmith.testing.decisions: the
first variant with a config at the bucket, that config), so no search runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import zipfile

import pytest
import torch
from torch import nn

import kernelsmith
from kernelsmith import dispatch
from kernelsmith.db import DecisionRecord
from kernelsmith.frontends import backend as ks_backend
from kernelsmith.frontends import triton_ops
from kernelsmith.ops import get_op
from kernelsmith.testing.decisions import store_kernel_decisions
from test_decorator import hf_rmsnorm

pytestmark = pytest.mark.gpu
EPS = 1e-6
ROWS, WIDTH = 64, 1024


class RMSNorm(nn.Module):
    """Llama's RMSNorm, as the backend recognizes it."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(hidden, device="cuda"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + EPS))


@pytest.fixture
def db(tmp_path, monkeypatch) -> str:
    path = str(tmp_path / "triton-ops.db")
    monkeypatch.setenv("KERNELSMITH_DB", path)
    torch._dynamo.reset()
    dispatch._RUNNERS.clear()
    triton_ops._RUNNERS.clear()
    triton_ops._decided.clear()
    return path


def _module_and_input() -> tuple[RMSNorm, torch.Tensor]:
    torch.manual_seed(0)
    return RMSNorm(WIDTH).eval(), torch.randn(ROWS, WIDTH, device="cuda")


def _stored_winner(db: str, module: RMSNorm, x: torch.Tensor) -> str:
    """Store a kernel winner for the module's workload; the name of the kernel it launches."""
    family = get_op("rmsnorm")
    spec = family.spec_for(x, module.weight, eps=EPS)
    store_kernel_decisions(db, [spec], mode="gpu")
    bucket = family.bucket(spec)
    variant = next(v for v in family.variants if v.space(bucket).configs())
    module_of = sys.modules[family.__module__]
    return getattr(module_of, f"_rmsnorm_{variant.name}_kernel").__name__


def test_inductor_compiles_the_tuned_kernel_itself(db):
    from torch._inductor.utils import run_and_get_code

    module, x = _module_and_input()
    kernel_name = _stored_winner(db, module, x)
    # compare=False keeps the replacement without timing it against Inductor alone
    compiled = torch.compile(module, backend=ks_backend.KernelsmithBackend(db=db, compare=False))
    with torch.no_grad():
        out, codes = run_and_get_code(compiled, x)
        expected = module(x)
    code = "\n".join(codes)
    assert kernel_name in code  # the user-defined Triton kernel in Inductor's own output
    assert "kernelsmith.kernel" not in code and "kernelsmith.triton_kernel" not in code  # no op call left
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)


class CarriedNorm(nn.Module):
    """The backend's replacement as a program: RMSNorm through the op, with the decision the
    backend carried for it."""

    def __init__(self, norm: RMSNorm, decision: str) -> None:
        super().__init__()
        self.norm, self.decision = norm, decision
        self.constants = dispatch.constants_json({"eps": EPS})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return triton_ops.OP("rmsnorm", [x, self.norm.weight], self.constants, self.decision)[0]


def test_aot_inductor_packages_the_kernel_and_runs_without_kernelsmith(db, tmp_path):
    module, x = _module_and_input()
    kernel_name = _stored_winner(db, module, x)
    backend = ks_backend.KernelsmithBackend(db=db, compare=False)  # keep the replacement: no timing
    with torch.no_grad():
        torch.compile(module, backend=backend)(x)
    (site,) = backend.sites
    assert site.triton_decision, "the backend kept kernelsmith::kernel (KERNELSMITH_LOG=info says why)"
    program_module = CarriedNorm(module, site.triton_decision).eval()
    with torch.no_grad():
        program = torch.export.export(program_module, (x,))
        expected = module(x)
    assert any(n.target is triton_ops.OP for n in program.graph.nodes)  # export keeps the op whole
    out = _packaged_without_kernelsmith(program, kernel_name, x, tmp_path)
    torch.testing.assert_close(out, expected.cpu(), rtol=1e-4, atol=1e-4)


def _packaged_without_kernelsmith(
    program: torch.export.ExportedProgram, kernel_name: str, x: torch.Tensor, tmp_path
) -> torch.Tensor:
    """``program`` compiled by AOTInductor into a package holding ``kernel_name``, run on ``x`` in
    a process that never imports kernelsmith and whose database is empty: its output."""
    package = torch._inductor.aoti_compile_and_package(program, package_path=str(tmp_path / "norm.pt2"))
    with zipfile.ZipFile(package) as archive:  # the kernel is in the package, not looked up at run time
        assert any(kernel_name.encode() in archive.read(name) for name in archive.namelist()
                   if not name.endswith((".so", ".o")))
    torch.save(x.cpu(), tmp_path / "x.pt")
    code = textwrap.dedent(f"""
        import faulthandler
        import sys
        import torch
        import torch._inductor
        faulthandler.enable()  # a crash in the loader shows where, not an empty stderr
        # CUDA initialized before the package is loaded: on the H200 machine (torch 2.11.0+cu130)
        # loading any AOTInductor package, one of plain Inductor code included, into a process
        # that has not touched CUDA yet segfaults in the loader.
        x = torch.load({str(tmp_path / "x.pt")!r}).cuda()
        runner = torch._inductor.aoti_load_package({package!r})
        with torch.no_grad():
            out = runner(x)
        out = out[0] if isinstance(out, (list, tuple)) else out
        torch.save(out.cpu(), {str(tmp_path / "out.pt")!r})
        assert "kernelsmith" not in sys.modules, "the package needed kernelsmith"
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "KERNELSMITH_DB": str(tmp_path / "empty.db")})
    assert done.returncode == 0, done.stderr
    return torch.load(tmp_path / "out.pt")


class DecoratedNorm(nn.Module):
    """Hugging Face's RMSNorm formulation through ``@kernelsmith.optimize`` (database only)."""

    def __init__(self, norm: RMSNorm) -> None:
        super().__init__()
        self.weight = norm.weight
        self.norm = kernelsmith.optimize(hf_rmsnorm, mode="db")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x, self.weight, EPS)


def test_a_static_export_of_a_decorated_function_holds_the_kernel_and_packages_it(db, tmp_path):
    """``torch.export`` of a decorated function at a static shape with a stored winner holds
    ``kernelsmith::triton_kernel`` (not ``kernelsmith::kernel``, which resolves its decisions in
    Python at run time), so AOTInductor compiles the tuned kernel into the package."""
    module, x = _module_and_input()
    kernel_name = _stored_winner(db, module, x)
    decorated = DecoratedNorm(module).eval()
    with torch.no_grad():
        program = torch.export.export(decorated, (x,))
        expected = module(x)
    targets = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert triton_ops.OP in targets, "KERNELSMITH_LOG=info says why kernelsmith::kernel was kept"
    assert torch.ops.kernelsmith.kernel.default not in targets
    out = _packaged_without_kernelsmith(program, kernel_name, x, tmp_path)
    torch.testing.assert_close(out, expected.cpu(), rtol=1e-4, atol=1e-4)


def test_a_launcher_with_host_state_keeps_kernelsmith_kernel_and_says_why(caplog):
    """decode_matmul's ``REDUCE = last_program`` launcher zeroes its arrival counters once, with a
    raw ``kernel[grid]`` launch, and keeps them between calls: nothing a trace can record, so the
    probe fails and the site keeps ``kernelsmith::kernel``."""
    import logging

    family = get_op("decode_matmul")
    spec = family.spec((2, 768, 512), "bf16")
    bucket = family.bucket(spec)
    variant, config = next((v, c) for v in family.variants for c in v.space(bucket).configs()
                           if c.to_dict().get("REDUCE") == "last_program")
    record = DecisionRecord("fp", bucket.workload_hash, spec.op, bucket.to_dict(), "kernel", variant.name,
                            variant.source_hash, config.to_dict(), {})
    inputs = [torch.empty(t.shape, dtype=t.torch_dtype, device="meta") for t in spec.inputs]
    triton_ops._logged.clear()
    triton_ops._decided.clear()
    with caplog.at_level(logging.INFO, logger=triton_ops.__name__):
        decision = triton_ops.site_decision(spec.op, inputs, dispatch.constants_json(dict(spec.constants)), record,
                                            "gpu", torch.device("cuda"), static=True, training=False)
    assert decision == ""
    assert any("cannot be traced" in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
