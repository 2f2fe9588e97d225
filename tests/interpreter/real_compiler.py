"""Lower the kernels a family's launchers launch with Triton's real compiler, on a machine without a GPU.

The interpreter runs a kernel as Python over numpy arrays, and accepts what the compiler rejects:
numpy broadcasting where Triton wants equal block shapes, and a ``return`` inside an ``if`` on a
constexpr that the compiler does not stop at (it goes on to compile the statements that follow).
Generating Triton IR (TTIR) is the compiler's front end, where those errors are raised; it needs
no GPU and no driver, only the installed Triton's CUDA backend, so it runs here.

Run as a script (not under pytest, whose conftest turns the interpreter on before the kernels are
made) with ``MODULE:FUNCTION``: the function, found in a module next to this file, returns
``(op, variant name, spec, config)`` cases. Every case is built and launched on CPU tensors with
the family module's ``direct_launch`` and its module-level kernels replaced by recorders, and
every distinct (kernel, specialization) recorded is lowered. Exit status 1 and one line per
failure on stderr if any does not lower.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import sys
from collections.abc import Iterator
from typing import Any

import torch

assert os.environ.get("TRITON_INTERPRET") != "1", "the real compiler, not the interpreter"

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)  # the H200
OPTIONS = ("num_warps", "num_stages")
POINTER_TYPES = {
    torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64",
    torch.int32: "i32", torch.int64: "i64", torch.int8: "i8", torch.uint8: "u8", torch.bool: "i1",
}  # fmt: skip

Launch = tuple[JITFunction, dict[str, Any], dict[str, Any]]  # kernel, arguments by name, options


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
    """Replace ``module.direct_launch`` and the module's kernels by recorders for the duration."""
    launches: list[Launch] = []
    saved = dict(vars(module))
    try:
        module.direct_launch = lambda kernel, grid: (
            kernel if isinstance(kernel, _Recorder) else _Recorder(kernel, launches)
        )
        for name, value in saved.items():
            if isinstance(value, JITFunction):
                setattr(module, name, _Recorder(value, launches))
        yield launches
    finally:
        for name in ("direct_launch", *(n for n, v in saved.items() if isinstance(v, JITFunction))):
            setattr(module, name, saved[name])


def _specialization(
    kernel: JITFunction, arguments: dict[str, Any]
) -> tuple[dict[str, str], dict[tuple[int, ...], Any]]:
    """Triton's signature and constexprs for these arguments: tensors are pointers of their dtype,
    integers equal to 1 are specialized to the constant 1 (as Triton does), other scalars are i32,
    i64, fp32 or i1, and the kernel's constexpr parameters are constants."""
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
            signature[name] = "fp32"
        else:
            raise TypeError(f"{kernel.__name__}: argument {name} of type {type(value).__name__}")
    return signature, constants


def lower(kernel: JITFunction, arguments: dict[str, Any], options: dict[str, Any]) -> None:
    """Generate the TTIR of one launch; raises Triton's CompilationError where the compiler would."""
    from triton._C.libtriton import ir

    backend = make_backend(TARGET)
    signature, constants = _specialization(kernel, arguments)
    parsed = backend.parse_options(dict(options))
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    source = ASTSource(kernel, signature, constexprs=constants)
    source.make_ir(TARGET, parsed, backend.get_codegen_implementation(parsed), backend.get_module_map(), context)


def main(target: str) -> int:
    module_name, function_name = target.split(":")
    cases = getattr(importlib.import_module(module_name), function_name)()
    lowered: set[tuple[Any, ...]] = set()
    failures: list[str] = []
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
            try:
                lower(kernel, arguments, options)
            except Exception as error:  # every failure is reported, one line each
                cause: BaseException = error
                while cause.__cause__ is not None:  # the compiler wraps the error once per call level
                    cause = cause.__cause__
                failures.append(f"{variant} {config.key} {spec.describe()}: {kernel.__name__}: {cause!r}")
    for line in failures:
        print(line, file=sys.stderr)
    print(f"lowered {len(lowered)} kernel specializations, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
