"""Lower the kernels a family's launchers launch with Triton's real compiler, on a machine without a GPU.

The interpreter runs a kernel as Python over numpy arrays, and accepts what the compiler rejects:
numpy broadcasting where Triton wants equal block shapes, and a ``return`` inside an ``if`` on a
constexpr that the compiler does not stop at (it goes on to compile the statements that follow).
Generating Triton IR (TTIR) is the compiler's front end, where those errors are raised; it needs
no GPU and no driver, only the installed Triton's CUDA backend, so it runs here.

Run as a script (not under pytest, whose conftest turns the interpreter on before the kernels are
made) with ``MODULE:FUNCTION``: the function, found in a module next to this file, returns
``(op, variant name, spec, config)`` cases. Every case is built and launched on CPU tensors with
its launches recorded instead of run, and every distinct (kernel, specialization) recorded is
lowered. Exit status 1 and one line per failure on stderr if any does not lower.

With ``--launches MODULE:FUNCTION`` the function returns ``real_compiler_run.LaunchCase`` s
instead: launchers the cases build themselves (a family's own entry point), each of which must
make the case's number of launches, every one lowering with no float64 math (a failure here, not
a listing); the kernels' names are printed on one ``lowered kernels ...`` line.

Launches are recorded through :func:`kernelsmith.ops._launch.launches_through` (the switch the
``kernelsmith::triton_kernel`` frontend builds its launchers under), so a build that hands over to
another module's launchers is followed too; the module-level kernels of the build's own module are
also replaced by recorders, for a kernel called as ``kernel[grid](...)``.

``REAL_COMPILER_FLOATS=fp64`` types every Python float argument as ``fp64`` instead of Triton's
own ``fp32``: the signature Inductor gives a user-defined Triton kernel's float arguments
(``torch/_inductor/codegen/triton_utils.py``, ``signature_of``), where an eps or a scale promotes
the kernel's float32 math to float64 unless the kernel casts it back. The kernels whose lowered
Triton IR computes in float64 (:data:`F64_MATH`) are listed on stdout, one ``f64: ...`` line each:
with fp64 floats, those that lower but would run float64 math on the GPU.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import re
import sys
from collections.abc import Iterator
from typing import Any

import torch

assert os.environ.get("TRITON_INTERPRET") != "1", "the real compiler, not the interpreter"

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from kernelsmith.ops._launch import launches_through  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)  # the H200
OPTIONS = ("num_warps", "num_stages")
POINTER_TYPES = {
    torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64",
    torch.int32: "i32", torch.int64: "i64", torch.int8: "i8", torch.uint8: "u8", torch.bool: "i1",
}  # fmt: skip

Launch = tuple[JITFunction, dict[str, Any], dict[str, Any]]  # kernel, arguments by name, options


def float_type() -> str:
    """The signature type of a Python float argument: Triton's ``fp32``, or Inductor's ``fp64``
    under ``REAL_COMPILER_FLOATS=fp64`` (module docstring)."""
    floats = os.environ.get("REAL_COMPILER_FLOATS", "fp32")
    if floats not in ("fp32", "fp64"):
        raise ValueError(f"REAL_COMPILER_FLOATS={floats!r}: fp32 or fp64")
    return floats


class _Recorder:
    """Stands in for ``direct_launch(kernel, grid)`` and ``kernel[grid]``: records each call."""

    def __init__(self, kernel: JITFunction, launches: list[Launch]) -> None:
        self.kernel, self.launches = kernel, launches

    def __getitem__(self, grid: object) -> _Recorder:
        return self

    def __call__(self, *args: Any, **meta: Any) -> None:
        options = {k: meta.pop(k) for k in OPTIONS if k in meta}
        bound = inspect.signature(self.kernel.fn).bind(*args, **meta)
        bound.apply_defaults()
        self.launches.append((self.kernel, dict(bound.arguments), options))


@contextlib.contextmanager
def recording(module: Any) -> Iterator[list[Launch]]:
    """Record every launch of the launchers built and called in this block: those made through
    ``direct_launch`` in any module (by ``launches_through``), and ``module``'s own kernels,
    replaced by recorders for the duration."""
    launches: list[Launch] = []
    saved = {name: value for name, value in vars(module).items() if isinstance(value, JITFunction)}

    def make(kernel: Any, grid: object) -> _Recorder:
        return kernel if isinstance(kernel, _Recorder) else _Recorder(kernel, launches)

    try:
        for name, value in saved.items():
            setattr(module, name, _Recorder(value, launches))
        with launches_through(make):
            yield launches
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


def _specialization(
    kernel: JITFunction, arguments: dict[str, Any]
) -> tuple[dict[str, str], dict[tuple[int, ...], Any]]:
    """Triton's signature and constexprs for these arguments: tensors are pointers of their dtype,
    integers equal to 1 are specialized to the constant 1 (as Triton does), other scalars are i32,
    i64, i1 or (a float) :func:`float_type`, and the kernel's constexpr parameters are constants."""
    signature: dict[str, str] = {}
    constants: dict[tuple[int, ...], Any] = {}
    for index, (name, value) in enumerate(arguments.items()):
        param = kernel.params[index]
        if param.is_constexpr or (isinstance(value, int) and not isinstance(value, bool) and value == 1
                                  and index not in kernel.do_not_specialize):  # fmt: skip
            signature[name] = "constexpr"
            constants[(index,)] = value
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + POINTER_TYPES[value.dtype]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
        elif isinstance(value, float):
            signature[name] = float_type()
        else:
            raise TypeError(f"{kernel.__name__}: argument {name} of type {type(value).__name__}")
    return signature, constants


def front_end(kernel: JITFunction, arguments: dict[str, Any], options: dict[str, Any]) -> tuple[Any, Any, Any]:
    """One launch through the compiler's front end: the Triton IR module it makes, the backend and
    the parsed options (for a caller that goes on to run the compiler's own passes on the module).
    Raises Triton's CompilationError where the compiler would."""
    from triton._C.libtriton import ir

    backend = make_backend(TARGET)
    signature, constants = _specialization(kernel, arguments)
    parsed = backend.parse_options(dict(options))
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    source = ASTSource(kernel, signature, constexprs=constants)
    module = source.make_ir(TARGET, parsed, backend.get_codegen_implementation(parsed), backend.get_module_map(),
                            context)  # fmt: skip
    return module, backend, parsed


def lower(kernel: JITFunction, arguments: dict[str, Any], options: dict[str, Any]) -> str:
    """The TTIR of one launch, as text (the front end's module, before the compiler's passes)."""
    module, _, _ = front_end(kernel, arguments, options)
    return str(module)


# A float arithmetic, comparison or math-dialect op on float64, or a dot into float64
# (``arith.mulf %a, %b : tensor<64xf64> loc(#loc7)``, ``math.rsqrt %x : f64``); a float64
# argument merely converted or passed on is not float64 math. The TTIR prints one op a line.
F64_MATH = re.compile(
    r"= (arith\.(addf|subf|mulf|divf|remf|negf|cmpf|maximumf|minimumf|maxnumf|minnumf)|math\.\w+|tt\.dot)\b"
    r"[^\n]*(: |-> )(tensor<[^>\n]*xf64>|f64)( loc\([^\n]*\))?$",
    re.MULTILINE,
)


def f64_math(ttir: str) -> int:
    """How many float64 arithmetic ops a kernel's TTIR holds (see F64_MATH)."""
    return len(F64_MATH.findall(ttir))


def _reason(error: BaseException) -> str:
    """The innermost error of a failed lowering, in one line: the compiler wraps it once per call
    level, and its CompilationError carries the kernel's whole source, of which the failing line
    (number and text) is enough."""
    while error.__cause__ is not None:
        error = error.__cause__
    node, message = getattr(error, "node", None), getattr(error, "error_message", None)
    source = getattr(error, "src", None)
    if node is None or not isinstance(source, str) or not hasattr(node, "lineno"):
        return repr(error)
    line = source.splitlines()[node.lineno - 1].strip() if node.lineno <= len(source.splitlines()) else ""
    return f"line {node.lineno} ({line}): {message}"


def _lower_and_count(kernel: JITFunction, arguments: dict[str, Any], options: dict[str, Any]) -> tuple[str | None, int]:
    """Lower one launch: why it failed (one line, None if it lowered) and how many float64 ops its
    TTIR computes (0 where it failed). Every failure is caught, so that each is reported."""
    try:
        ttir = lower(kernel, arguments, options)
    except Exception as error:
        return _reason(error), 0
    return None, f64_math(ttir)


def main(target: str) -> int:
    module_name, function_name = target.split(":")
    cases = getattr(importlib.import_module(module_name), function_name)()
    lowered: set[tuple[Any, ...]] = set()
    failures: list[str] = []
    in_f64: list[str] = []
    for op, variant, spec, config in cases:
        # The module whose direct_launch the build calls: the family's own, or its launchers' module.
        family = inspect.getmodule(op.variant(variant).build)
        inputs = op.make_inputs(spec, seed=0, device="cpu")
        outputs = tuple(torch.empty(o.shape, dtype=o.torch_dtype) for o in op.output_specs(spec))
        with recording(family) as launches:
            op.variant(variant).build(spec, config)(inputs, outputs)
        for kernel, arguments, options in launches:
            signature, constants = _specialization(kernel, arguments)
            key = (kernel.__name__, tuple(signature.items()), tuple(constants.items()), tuple(options.items()))
            if key in lowered:
                continue
            lowered.add(key)
            failure, float64_ops = _lower_and_count(kernel, arguments, options)
            what = f"{variant} {config.key} {spec.describe()}: {kernel.__name__}"
            if failure is not None:
                failures.append(f"{what}: {failure}")
            elif float64_ops:
                in_f64.append(f"f64: {what}: {float64_ops} float64 ops")
    for line in in_f64:
        print(line)
    for line in failures:
        print(line, file=sys.stderr)
    print(f"lowered {len(lowered)} kernel specializations, {len(failures)} failed")
    return 1 if failures else 0


def main_launches(target: str) -> int:
    """``--launches``: every launch of every case lowered, strictly (module docstring)."""
    module_name, function_name = target.split(":")
    cases = getattr(importlib.import_module(module_name), function_name)()
    names: set[str] = set()
    failures: list[str] = []
    for case in cases:
        with recording(case.module) as launches:
            case.build()(case.inputs, case.outputs)
        if len(launches) != case.launches:
            failures.append(f"{case.what}: {len(launches)} launches, not {case.launches}")
        for kernel, arguments, options in launches:
            names.add(kernel.__name__)
            failure, float64_ops = _lower_and_count(kernel, arguments, options)
            if failure is None and float64_ops:
                failure = f"{float64_ops} float64 ops"
            if failure is not None:
                failures.append(f"{case.what}: {kernel.__name__}: {failure}")
    for line in failures:
        print(line, file=sys.stderr)
    print("lowered kernels", " ".join(sorted(names)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main_launches(sys.argv[2]) if sys.argv[1] == "--launches" else main(sys.argv[1]))
