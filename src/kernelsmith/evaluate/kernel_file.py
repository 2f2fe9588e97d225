"""Kernel files: the only form a kernel from outside the package takes (``docs/kernel-files.md``).

A coding agent's ``kernel.py``, an LLM's proposal, a kernel source in an imported record: each is
Triton device code (``@triton.jit`` functions) plus literal data (``SPACE``, ``CONSTRAINTS``,
``LAUNCH``, ``CONFIG``) that describes its configs and how to launch it. Nothing a candidate writes
runs as host Python. This module

1. checks a file against the grammar by reading its syntax tree (:func:`check_kernel_file`): the
   top-level statements and the shapes of the launch data (:mod:`kernelsmith.evaluate.kernel_gate`)
   and every ``@triton.jit`` body (names, attributes resolved against the installed Triton,
   statements: :mod:`kernelsmith.evaluate.kernel_body_gate`, which says why bodies are checked so
   strictly), each problem on one line that says what is wrong and what is allowed;
2. loads the ``@triton.jit`` functions of a file that passed (:func:`parse_kernel_file`): the text
   is written to a private temporary file (Triton reads kernel source through ``inspect``) and
   executed in a fresh namespace whose builtins are the eight a kernel body may name plus an
   ``__import__`` that hands back only Triton. The only host code that runs is the file's imports,
   ``triton.jit`` decorating its functions and ``tl.constexpr(literal)`` for its constants;
3. builds launchers with kernelsmith's own code (:meth:`KernelFile.build`): the ``LAUNCH``
   expressions are evaluated by :mod:`kernelsmith.evaluate.launch_expr` once per (spec, config),
   and each call only slots the call's tensors (and freshly filled scratch) into the kernel
   arguments, launched through :func:`kernelsmith.ops._launch.direct_launch` as the families do.

This module is the gates' front door: every name a caller needs is importable from here.
"""

from __future__ import annotations

import builtins
import functools
import math
import os
import tempfile
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from kernelsmith.db import variant_source_hash
from kernelsmith.evaluate import launch_expr
from kernelsmith.evaluate.kernel_body_gate import BODY_BUILTINS, DENIED_MEMBERS, NAMESPACES, value_attributes
from kernelsmith.evaluate.kernel_gate import (
    ALLOWED_IMPORTS,
    _Checker,
    _is_scalar,
    _Launch,
    _Parsed,
    _Scratch,
    check_kernel_file,
)
from kernelsmith.evaluate.launch_expr import Expr, LaunchExprError, TensorInfo
from kernelsmith.exceptions import KernelsmithError
from kernelsmith.ops._base import Launcher, rows_and_width
from kernelsmith.ops._launch import direct_launch
from kernelsmith.space import Config, Constraint, Param, Space
from kernelsmith.spec import DTYPES, OpSpec, contiguous_strides

__all__ = [
    "ALLOWED_IMPORTS",
    "BODY_BUILTINS",
    "DENIED_MEMBERS",
    "NAMESPACES",
    "KernelFile",
    "KernelFileError",
    "check_kernel_file",
    "load_namespace",
    "parse_kernel_file",
    "restricted_builtins",
    "value_attributes",
]

MAX_SCRATCH_BYTES = 1 << 34


class KernelFileError(KernelsmithError, ValueError):
    """A kernel file that fails the gate or cannot be loaded or built; ``problems`` lists why."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


# ---- loading ---------------------------------------------------------------------------------------
_SOURCE_DIR: tempfile.TemporaryDirectory[str] | None = None
_SOURCE_LOCK = threading.Lock()

_IMPORTABLE = {
    "triton": frozenset({"language"}),
    "triton.language": frozenset(),
    "__future__": frozenset({"annotations"}),
}


def _restricted_import(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
    """The only ``__import__`` a kernel file's namespace has: Triton, triton.language and
    ``from __future__ import annotations``, nothing else (the gate allows no other import; this
    holds even if the gate were bypassed)."""
    names = tuple(fromlist or ())
    if level != 0 or name not in _IMPORTABLE or not set(names) <= _IMPORTABLE[name]:
        raise ImportError(f"a kernel file cannot import {name!r}{f' {names}' if names else ''}")
    return builtins.__import__(name, None, None, names, 0)


def restricted_builtins() -> dict[str, Any]:
    """The builtins of a kernel file's namespace: the eight a body may name, and the import above."""
    table: dict[str, Any] = {name: getattr(builtins, name) for name in BODY_BUILTINS}
    table["__import__"] = _restricted_import
    return table


def _source_path(source: str, source_hash: str) -> str:
    """A private file holding ``source`` (Triton reads kernel source through inspect/linecache)."""
    global _SOURCE_DIR
    with _SOURCE_LOCK:
        if _SOURCE_DIR is None:
            _SOURCE_DIR = tempfile.TemporaryDirectory(prefix="kernelsmith-kernel-files-")
        path = os.path.join(_SOURCE_DIR.name, f"kernel_{source_hash}.py")
        if not os.path.exists(path):
            with open(path, "w") as handle:
                handle.write(source)
    return path


def load_namespace(source: str, source_hash: str) -> dict[str, Any]:
    """Execute a kernel file (that passed the gate) in a fresh namespace with restricted builtins."""
    path = _source_path(source, source_hash)
    namespace: dict[str, Any] = {
        "__name__": f"kernelsmith_kernel_file_{source_hash}",
        "__file__": path,
        "__builtins__": restricted_builtins(),
    }
    exec(compile(source, path, "exec"), namespace)  # gated source, restricted builtins
    return namespace


# ---- scratch memory ----------------------------------------------------------------------------------
@triton.jit
def _fill_kernel(ptr, n, VALUE: tl.constexpr, BLOCK: tl.constexpr):
    """Scratch is filled by a kernel, not by torch.full: the harness counts PyTorch compute issued
    from a launcher as cheating, and Triton's own work as the runtime's."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(ptr + offsets, tl.full([BLOCK], VALUE, ptr.dtype.element_ty), mask=mask)


_FILL_BLOCK = 1024


@functools.cache
def _multiprocessor_count() -> int:
    """``num_sms``: the current GPU's multiprocessors, or a small stand-in without one (the
    interpreter), as the families use."""
    if torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count)
    return 4


# ---- the kernel file -------------------------------------------------------------------------------
class KernelFile:
    """A kernel file that passed the gate and whose kernels are loaded.

    ``space(spec)`` and ``build(spec, config)`` take the place of a family variant's functions;
    ``config`` is the file's CONFIG (or None), ``source_hash`` the database's name of the text.
    """

    __slots__ = ("_namespace", "_parsed", "config", "source", "source_hash")

    def __init__(self, source: str, parsed: _Parsed, namespace: dict[str, Any]) -> None:
        self.source = source
        self.source_hash = variant_source_hash(source)
        self._parsed = parsed
        self._namespace = namespace
        self.config: Config | None = Config(parsed.config) if parsed.config is not None else None

    def __setattr__(self, name: str, value: Any) -> None:
        if hasattr(self, name):
            raise AttributeError(f"KernelFile.{name} is read-only")
        object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        return f"KernelFile({self.source_hash}, kernels={sorted(self._parsed.kernels)})"

    @property
    def docstring(self) -> str:
        return self._parsed.docstring

    @property
    def kernels(self) -> tuple[str, ...]:
        return tuple(self._parsed.kernels)

    # ---- names the expressions read ------------------------------------------------------------
    def names(self, spec: OpSpec, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The environment of the launch expressions for ``spec`` (and ``config``): rows, N, numel,
        num_sms, the workload's constants, the file's constants and the config's parameters.
        Raises KernelFileError when two of them share a name."""
        rows, n = rows_and_width(spec)
        layers: list[tuple[str, Mapping[str, Any]]] = [
            ("launch names", {"rows": rows, "N": n, "numel": spec.inputs[0].numel, "num_sms": _multiprocessor_count()}),
            ("workload constants", dict(spec.constants)),
            ("file constants", self._parsed.constants),
            ("config parameters", dict(config or {})),
        ]
        names: dict[str, Any] = {}
        seen: dict[str, str] = {}
        clashes = []
        for layer, values in layers:
            for key, value in values.items():
                if key in seen:
                    clashes.append(f"{key!r} is both one of the {seen[key]} and of the {layer}")
                seen[key] = layer
                names[key] = value
        if clashes:
            raise KernelFileError(clashes)
        return names

    def space(self, spec: OpSpec) -> Space:
        """The configs of SPACE for ``spec``, filtered by CONSTRAINTS (a constraint that cannot be
        evaluated for a config, such as a division by zero, excludes it)."""
        space = self._parsed.space or {}
        params = [Param(name, choices) for name, choices in space.items()]
        base = self.names(spec, {name: choices[0] for name, choices in space.items()})
        constraints = []
        for expr in self._parsed.constraints:
            missing = sorted(expr.names - set(base))
            if missing:
                raise KernelFileError([f"CONSTRAINTS {expr.text!r}: unknown names {missing} for {spec.op}"])
            constraints.append(Constraint(expr.text, functools.partial(_holds, expr, base)))
        return Space(params, constraints)

    def build(self, spec: OpSpec, config: Mapping[str, Any]) -> Launcher:
        """The launcher of this file for calls with exactly ``spec``'s inputs, at ``config``.

        Every expression is evaluated here, once (tensor sizes and strides from the spec, as the
        families' launchers compute them): a call only slots its tensors and fresh scratch into
        the argument lists. Raises KernelFileError when an expression fails for this spec.
        """
        try:
            return self._build(spec, config)
        except LaunchExprError as exc:
            raise KernelFileError([f"LAUNCH for {spec.describe()} at {Config(config).key or 'the empty config'}: "
                                   f"{exc}"]) from None

    def _build(self, spec: OpSpec, config: Mapping[str, Any]) -> Launcher:
        from kernelsmith.ops import get_op  # the families import this package's siblings

        names = self.names(spec, config)
        infos: dict[str, TensorInfo] = {f"in{i}": TensorInfo(t.shape, t.strides) for i, t in enumerate(spec.inputs)}
        outputs = get_op(spec.op).output_specs(spec)
        infos.update({f"out{i}": TensorInfo(t.shape, t.strides) for i, t in enumerate(outputs)})
        scratch = [self._scratch_plan(s, names, infos) for s in self._parsed.scratch]
        for (name, shape, _, _), _ in zip(scratch, self._parsed.scratch, strict=True):
            infos[name] = TensorInfo(shape, contiguous_strides(shape))
        scratch_index = {plan[0]: i for i, plan in enumerate(scratch)}
        steps = [self._launch_plan(launch, names, infos, scratch_index, len(spec.inputs), len(outputs))
                 for launch in self._parsed.launches]
        fills = [(direct_launch(_fill_kernel, (max(1, triton.cdiv(math.prod(shape), _FILL_BLOCK)),)),
                  math.prod(shape), value) for _, shape, _, value in scratch]

        if not scratch and len(steps) == 1:
            kernel, template, slots, options = steps[0]

            def launch_one(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
                kernel(*_arguments(template, slots, inputs, outputs), **options)

            return launch_one

        def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
            device = inputs[0].device
            tensors: list[torch.Tensor] = []
            for (_, shape, dtype, _), (fill, count, value) in zip(scratch, fills, strict=True):
                tensor = torch.empty(shape, dtype=dtype, device=device)
                fill(tensor, count, VALUE=value, BLOCK=_FILL_BLOCK)
                tensors.append(tensor)
            for kernel, template, slots, options in steps:
                kernel(*_arguments(template, slots, inputs, outputs, tensors), **options)

        return launch

    def _scratch_plan(self, scratch: _Scratch, names: Mapping[str, Any],
                      infos: Mapping[str, TensorInfo]) -> tuple[str, tuple[int, ...], torch.dtype, Any]:
        shape = tuple(_integer(launch_expr.evaluate(e, names, infos), f"scratch {scratch.name!r} shape", 0)
                      for e in scratch.shape)
        dtype = DTYPES[scratch.dtype]
        if math.prod(shape) * dtype.itemsize > MAX_SCRATCH_BYTES:
            raise KernelFileError([f"scratch {scratch.name!r} of shape {shape} is larger than "
                                   f"{MAX_SCRATCH_BYTES >> 30} GiB"])
        fill = scratch.fill
        if not dtype.is_floating_point and isinstance(fill, float):
            if not math.isfinite(fill) or fill != int(fill):
                raise KernelFileError([f"scratch {scratch.name!r}: an integer tensor cannot be filled with {fill}"])
            fill = int(fill)
        return scratch.name, shape, dtype, fill

    def _launch_plan(self, launch: _Launch, names: Mapping[str, Any], infos: Mapping[str, TensorInfo],
                     scratch_index: Mapping[str, int], n_inputs: int, n_outputs: int) -> tuple[Any, ...]:
        """(launcher, argument template, tensor slots, launch options) of one LAUNCH entry."""
        signature = self._parsed.kernels[launch.kernel]
        grid = tuple(_integer(launch_expr.evaluate(e, names, infos), "grid", 0) for e in launch.grid)
        # Argument values by parameter name: args fill the non-constexpr parameters in order.
        given: dict[str, Any] = {}
        slots_by_name: dict[str, tuple[str, int]] = {}
        for (param, _), expr in zip(signature.runtime, launch.args, strict=False):
            tensor = expr.tensor
            if tensor is None:
                given[param] = _scalar(launch_expr.evaluate(expr, names, infos), f"args {expr.text!r}")
                continue
            where, index = _tensor_slot(tensor, scratch_index)
            limit = {"in": n_inputs, "out": n_outputs, "scratch": len(scratch_index)}[where]
            if index >= limit:
                raise KernelFileError([f"args {tensor}: the op has {n_inputs} inputs and {n_outputs} outputs"])
            given[param] = None
            slots_by_name[param] = (where, index)
        for param, expr in launch.constexprs:
            given[param] = _scalar(launch_expr.evaluate(expr, names, infos), f"constexprs[{param!r}]")
        options = {k: _integer(launch_expr.evaluate(e, names, infos), k, 1) for k, e in launch.options}
        # Positional in signature order up to the first parameter left to its default, keywords after.
        template: list[Any] = []
        slots: list[tuple[int, str, int]] = []
        keywords: dict[str, Any] = {}
        positional = True
        for param, _, _ in signature.params:
            if param not in given:
                positional = False
                continue
            if positional:
                if param in slots_by_name:
                    slots.append((len(template), *slots_by_name[param]))
                template.append(given[param])
            elif param in slots_by_name:
                raise KernelFileError([f"{launch.kernel}: tensor argument {param} follows a defaulted parameter"])
            else:
                keywords[param] = given[param]
        kernel = direct_launch(self._namespace[launch.kernel], grid)
        return kernel, tuple(template), tuple(slots), {**keywords, **options}


def _arguments(template: Sequence[Any], slots: Sequence[tuple[int, str, int]], inputs: Sequence[torch.Tensor],
               outputs: Sequence[torch.Tensor], scratch: Sequence[torch.Tensor] = ()) -> list[Any]:
    """A launch's arguments: the template with the call's tensors slotted in ("in", "out" or
    "scratch" ``index`` at ``position``)."""
    values = list(template)
    for position, where, index in slots:
        values[position] = (inputs if where == "in" else outputs if where == "out" else scratch)[index]
    return values


def _holds(expr: Expr, base: Mapping[str, Any], config: Config) -> bool:
    try:
        return bool(launch_expr.evaluate(expr, {**base, **config}))
    except LaunchExprError:
        return False


def _tensor_slot(name: str, scratch_index: Mapping[str, int]) -> tuple[str, int]:
    if name in scratch_index:
        return "scratch", scratch_index[name]
    kind = "in" if name.startswith("in") else "out"
    return kind, int(name[len(kind):])


def _integer(value: Any, where: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise LaunchExprError(f"{where} must be an integer >= {least}, not {value!r}")
    return value


def _scalar(value: Any, where: str) -> Any:
    if not _is_scalar(value):
        raise LaunchExprError(f"{where} must be a number, string, boolean or None, not {value!r}")
    return value


def parse_kernel_file(source: str) -> KernelFile:
    """Check a kernel file and load its kernels; raises KernelFileError listing every problem."""
    checker = _Checker(source)
    if checker.parsed.problems:
        raise KernelFileError(checker.parsed.problems)
    try:
        namespace = load_namespace(source, variant_source_hash(source))
    except Exception as exc:  # Triton refusing a decorated function, say: the file's fault
        raise KernelFileError([f"the file failed to load: {type(exc).__name__}: {exc}"]) from exc
    return KernelFile(source, checker.parsed, namespace)
