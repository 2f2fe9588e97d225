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

Loading an AOTInductor package can fail for reasons that are not kernelsmith's (on the H200 with
torch 2.11.0+cu130, loading any package, plain Inductor code included, segfaulted in torch's
loader): a package of three lines of plain PyTorch is loaded first, the same way, and where that
fails the kernelsmith packaging tests skip with its reason instead of failing as if kernelsmith broke
the package (and the plain test fails).

The op's probe refuses a launcher that does on the host what a trace cannot record (a raw
``kernel[grid]`` launch, a read of a tensor's value). decode_matmul's split-K reduction by the last
program once zeroed arrival counters it kept between calls with a raw launch; since commit 49feb5b
they are per-call scratch zeroed through kernelsmith's launcher, so it is traced and Inductor runs
it. A launcher wrapped to read its input on the host keeps ``kernelsmith::kernel``
(tests/test_triton_ops_trace.py checks both on the CPU, with fake CUDA tensors).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kernelsmith
from kernelsmith import dispatch
from kernelsmith.db import DecisionRecord
from kernelsmith.frontends import backend as ks_backend
from kernelsmith.frontends import triton_ops
from kernelsmith.ops import get_op
from kernelsmith.testing.decisions import store_kernel_decisions
from test_decorator import hf_rmsnorm
from test_triton_ops_trace import SHAPE, last_program_site, reading_the_host

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


# ---- AOTInductor: whether this machine can load a package at all ----------------------------------------
class PlainModule(nn.Module):
    """Plain PyTorch, nothing of kernelsmith: what any AOTInductor package holds."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2 + 1


@dataclass(frozen=True)
class PlainLoad:
    """A plain package loaded and run in a fresh process: its output and the eager one, or why not."""

    failure: str  # "" when the package loaded and ran
    out: torch.Tensor | None
    expected: torch.Tensor


@pytest.fixture(scope="module")
def plain_package_load(tmp_path_factory: pytest.TempPathFactory) -> PlainLoad:
    """:class:`PlainModule` exported, packaged by AOTInductor and run in a fresh process, exactly as
    the kernelsmith packages below are (once per module: the AOTInductor compile takes a while). A
    compile failure is not a load failure: it is raised, so every test using this errors with it."""
    where = tmp_path_factory.mktemp("plain-aoti")
    x = torch.randn(8, 16, device="cuda")
    module = PlainModule().eval()
    with torch.no_grad():
        program = torch.export.export(module, (x,))
        expected = module(x).cpu()
    package = torch._inductor.aoti_compile_and_package(program, package_path=str(where / "plain.pt2"))
    out, failure = _run_in_fresh_process(package, x, where)
    return PlainLoad(failure, out, expected)


def _skip_where_no_package_loads(plain: PlainLoad) -> None:
    """Skip a kernelsmith packaging test where even a plain package cannot be loaded here (the
    environment's failure, which the plain test reports); never where it loads."""
    if plain.failure:
        pytest.skip(f"AOTInductor packages cannot be loaded on this machine: {plain.failure}")


def test_aoti_loads_a_plain_inductor_package_in_a_fresh_process(plain_package_load):
    """The environment's check: a package of plain Inductor code loads and runs in a fresh process.
    When this fails, so would every kernelsmith package, through no fault of kernelsmith's."""
    assert not plain_package_load.failure, plain_package_load.failure
    torch.testing.assert_close(plain_package_load.out, plain_package_load.expected)


# ---- AOTInductor: kernelsmith's kernel in the package ----------------------------------------------------
def test_aot_inductor_packages_the_kernel_and_runs_without_kernelsmith(db, tmp_path, plain_package_load):
    _skip_where_no_package_loads(plain_package_load)
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
    program: torch.export.ExportedProgram, kernel_name: str, x: torch.Tensor, tmp_path: Path
) -> torch.Tensor:
    """``program`` compiled by AOTInductor into a package holding ``kernel_name``, run on ``x`` in
    a process that never imports kernelsmith and whose database is empty: its output."""
    package = torch._inductor.aoti_compile_and_package(program, package_path=str(tmp_path / "norm.pt2"))
    with zipfile.ZipFile(package) as archive:  # the kernel is in the package, not looked up at run time
        assert any(kernel_name.encode() in archive.read(name) for name in archive.namelist()
                   if not name.endswith((".so", ".o")))
    out, failure = _run_in_fresh_process(package, x, tmp_path)
    assert out is not None and not failure, failure
    return out


# The fresh process: it prints each step as it completes (flushed), so a crash's stdout tail says how
# far it got, and faulthandler prints the Python stack of a fatal signal (a segfault in the loader)
# on stderr instead of leaving it empty.
FRESH_PROCESS = """
import faulthandler
import sys
import torch
import torch._inductor
faulthandler.enable()
print("torch", torch.__version__, "cuda", torch.version.cuda, flush=True)
# CUDA initialized before the package is loaded (commit 7a0e8b0, a guess not yet verified: on the
# H200 with torch 2.11.0+cu130, loading any AOTInductor package, one of plain Inductor code
# included, segfaulted in the loader of a process that had not touched CUDA).
x = torch.load({x!r}).cuda()
print("input on", x.device, flush=True)
runner = torch._inductor.aoti_load_package({package!r})
print("package loaded", flush=True)
with torch.no_grad():
    out = runner(x)
out = out[0] if isinstance(out, (list, tuple)) else out
torch.cuda.synchronize()
print("package ran", flush=True)
torch.save(out.cpu(), {out!r})
assert "kernelsmith" not in sys.modules, "the package needed kernelsmith"
"""


def _run_in_fresh_process(package: str, x: torch.Tensor, where: Path) -> tuple[torch.Tensor | None, str]:
    """``package`` loaded and run on ``x`` in a fresh process that never imports kernelsmith and whose
    database is empty: (its output, ""), or (None, why not: how the process ended, with the tails
    of its stdout and stderr)."""
    torch.save(x.cpu(), where / "x.pt")
    code = FRESH_PROCESS.format(x=str(where / "x.pt"), package=package, out=str(where / "out.pt"))
    env = {**os.environ, "KERNELSMITH_DB": str(where / "empty.db")}
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    except subprocess.TimeoutExpired as timeout:  # its captured output is bytes, whatever text= says
        return None, f"loading {package} ran past {timeout.timeout} s" + _tails(timeout.stdout, timeout.stderr)
    if done.returncode != 0:
        return None, f"loading {package} {_how_it_ended(done.returncode)}" + _tails(done.stdout, done.stderr)
    return torch.load(where / "out.pt"), ""


def _how_it_ended(returncode: int) -> str:
    """"exited with 1", or "was killed by SIGSEGV" for a process a signal ended (a negative code)."""
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with {returncode}"


def _tails(stdout: str | bytes | None, stderr: str | bytes | None, chars: int = 3000) -> str:
    def text(stream: str | bytes | None) -> str:
        if isinstance(stream, bytes):
            return stream.decode(errors="replace")
        return stream or ""

    return (f"\n--- stdout (last {chars} chars):\n{text(stdout)[-chars:]}"
            f"\n--- stderr (last {chars} chars):\n{text(stderr)[-chars:]}")


class DecoratedNorm(nn.Module):
    """Hugging Face's RMSNorm formulation through ``@kernelsmith.optimize`` (database only)."""

    def __init__(self, norm: RMSNorm) -> None:
        super().__init__()
        self.weight = norm.weight
        self.norm = kernelsmith.optimize(hf_rmsnorm, mode="db")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x, self.weight, EPS)


def test_a_static_export_of_a_decorated_function_holds_the_kernel_and_packages_it(db, tmp_path, plain_package_load):
    """``torch.export`` of a decorated function at a static shape with a stored winner holds
    ``kernelsmith::triton_kernel`` (not ``kernelsmith::kernel``, which resolves its decisions in
    Python at run time), so AOTInductor compiles the tuned kernel into the package."""
    _skip_where_no_package_loads(plain_package_load)
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


# ---- host state: what the op's probe refuses ---------------------------------------------------------------
def _decide(inputs: list[torch.Tensor], constants: str, record: DecisionRecord) -> str:
    """site_decision afresh (neither its answer nor its logged reasons remembered from before)."""
    triton_ops._decided.clear()
    triton_ops._logged.clear()
    return triton_ops.site_decision("decode_matmul", inputs, constants, record, "gpu", torch.device("cuda"),
                                    static=True, training=False)


def test_decode_matmuls_last_program_launcher_is_traced_and_inductor_runs_it(db, caplog):
    """Its arrival counters are per-call scratch zeroed by the family's own kernel (commit 49feb5b):
    no host state, so the site gets the op, Inductor compiles both kernels into its code, and
    every call is right, the second on the same inputs too: each call's counters are fresh memory,
    and a call that did not zero its own would count from whatever that memory held, so the wrong
    program of a block would reduce (before all partials were written, or never)."""
    from torch._inductor.utils import run_and_get_code

    inputs, constants, record = last_program_site()
    with caplog.at_level(logging.INFO, logger=triton_ops.__name__):
        decision = _decide(inputs, constants, record)
    assert decision, [r.getMessage() for r in caplog.records]
    (entry,) = json.loads(decision)["entries"]
    assert entry["config"]["REDUCE"] == "last_program", entry

    op = triton_ops.OP

    def program(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return op("decode_matmul", [x, weight], constants, decision)[0]

    compiled = torch.compile(program, dynamic=False, fullgraph=True)
    m, n, k = SHAPE
    torch.manual_seed(0)
    weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    x, other_x = (torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    with torch.no_grad():
        first, codes = run_and_get_code(compiled, x, weight)
        again, other = compiled(x, weight), compiled(other_x, weight)
    code = "\n".join(codes)
    # the family's kernels in Inductor's own code (not the reference, which a decision that did
    # not serve these inputs would have run, and which would match F.linear as well)
    assert "_zero_kernel" in code and "_decode_split_k_kernel" in code, code[-3000:]
    for inp, out in ((x, first), (x, again), (other_x, other)):
        torch.testing.assert_close(out.float(), F.linear(inp.float(), weight.float()), rtol=2e-2, atol=2e-2)
    assert torch.equal(first, again)  # the partials are summed in a fixed order: bitwise reproducible


def test_a_launcher_that_reads_the_host_keeps_kernelsmith_kernel_and_says_why(db, monkeypatch, caplog):
    """decode_matmul's launcher wrapped to read its input's first element on the host (``.item()``,
    data a trace has not got) at ``triton_ops._build``, what both the probe's kernel listing and
    the traced body build through: the probe fails, the site keeps ``kernelsmith::kernel`` and the
    log says why. The same wrapper without the read gets the op, so the read is the cause."""
    inputs, constants, record = last_program_site()
    family_build = triton_ops._build
    monkeypatch.setattr(triton_ops, "_build", reading_the_host(family_build, read=False))
    assert _decide(inputs, constants, record) != ""
    monkeypatch.setattr(triton_ops, "_build", reading_the_host(family_build))
    with caplog.at_level(logging.INFO, logger=triton_ops.__name__):
        decision = _decide(inputs, constants, record)
    messages = [r.getMessage() for r in caplog.records]
    assert decision == ""
    assert any("cannot be traced" in m for m in messages), messages
