"""Kernel files: the only form a kernel from outside the package takes (``docs/kernel-files.md``).

A coding agent's ``kernel.py``, an LLM's proposal, a kernel source in an imported record: each is
Triton device code (``@triton.jit`` functions) plus literal data (``SPACE``, ``CONSTRAINTS``,
``LAUNCH``, ``CONFIG``) that describes its configs and how to launch it. Nothing a candidate writes
runs as host Python. This module

1. checks a file against the grammar by reading its syntax tree (:func:`check_kernel_file`): the
   top-level statements, every ``@triton.jit`` body (names, attributes resolved against the
   installed Triton, statements) and the shapes of the launch data, each problem on one line that
   says what is wrong and what is allowed;
2. loads the ``@triton.jit`` functions of a file that passed (:func:`parse_kernel_file`): the text
   is written to a private temporary file (Triton reads kernel source through ``inspect``) and
   executed in a fresh namespace whose builtins are the eight a kernel body may name plus an
   ``__import__`` that hands back only Triton. The only host code that runs is the file's imports,
   ``triton.jit`` decorating its functions and ``tl.constexpr(literal)`` for its constants;
3. builds launchers with kernelsmith's own code (:meth:`KernelFile.build`): the ``LAUNCH``
   expressions are evaluated by :mod:`kernelsmith.evaluate.launch_expr` once per (spec, config),
   and each call only slots the call's tensors (and freshly filled scratch) into the kernel
   arguments, launched through :func:`kernelsmith.ops._launch.direct_launch` as the families do.

Why bodies are checked so strictly: the Triton interpreter (``TRITON_INTERPRET=1``, the CPU mode
of every test) runs a ``@triton.jit`` body as ordinary Python, with the function's module globals,
to which the interpreter itself adds its own (``numpy``, ``inspect``, ...). A body that could name
those, or reach a tensor's ``handle`` (its numpy storage), or walk ``__``-attributes, would be host
Python again. So a body may name only its parameters and locals, the file's ``tl.constexpr``
constants and ``@triton.jit`` functions, ``tl``, ``triton`` and eight builtins; attributes of ``tl``
must exist in the installed Triton's public namespaces; attributes of values must be public
members of Triton's tensor and dtype classes. Compiled Triton needs nothing more: its code
generator takes builtins from its own table, and globals a kernel reads must be ``tl.constexpr``.
"""

from __future__ import annotations

import ast
import builtins
import functools
import logging
import math
import os
import re
import tempfile
import threading
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import triton
import triton.language as tl

from kernelsmith.db import variant_source_hash
from kernelsmith.evaluate import launch_expr
from kernelsmith.evaluate.launch_expr import Expr, LaunchExprError, TensorInfo
from kernelsmith.ops._base import Launcher, rows_and_width
from kernelsmith.ops._launch import direct_launch
from kernelsmith.space import Config, Constraint, Param, Space
from kernelsmith.spec import DTYPES, OpSpec, contiguous_strides

log = logging.getLogger(__name__)

# The imports a kernel file may have (as `import X` / `from X import ...` module names).
ALLOWED_IMPORTS = frozenset({"__future__", "triton", "triton.language"})

# What a @triton.jit body may name besides its locals and the file's own definitions.
BODY_BUILTINS = ("range", "min", "max", "float", "int", "bool", "len", "isinstance")
# Namespaces of triton.language whose public members a body may use (paths from `tl`).
NAMESPACES = frozenset({"tl.math", "tl.extra", "tl.extra.cuda", "tl.extra.cuda.libdevice", "tl.extra.libdevice"})
# Members Triton has that a kernel may not use: inline assembly, clocks and the multiprocessor id
# (a kernel must not tell the harness from a user's program), printing, and the interpreter's raw
# storage of a tensor.
DENIED_MEMBERS = frozenset(
    {"inline_asm_elementwise", "clock", "globaltimer", "smid", "device_print", "static_print", "handle"}
)
JIT_OPTIONS = frozenset({"do_not_specialize", "do_not_specialize_on_alignment", "noinline", "debug"})
TRITON_FUNCTIONS = frozenset({"cdiv", "next_power_of_2"})  # triton.<name> a body may call
DATA_NAMES = ("SPACE", "CONSTRAINTS", "LAUNCH", "CONFIG")
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
LAUNCH_KEYS = frozenset({"kernel", "grid", "args", "constexprs", "scratch", *LAUNCH_OPTIONS})
SCRATCH_KEYS = frozenset({"shape", "dtype", "fill"})
SCRATCH_DTYPES = tuple(name for name in DTYPES if name != "bool")
MAX_LAUNCHES = 8
MAX_SPACE_CONFIGS = 100_000
MAX_SCRATCH_BYTES = 1 << 34
CONSTANT_NAME = re.compile(r"[A-Z][A-Z0-9_]*\Z")

_ALLOWED_TOP_LEVEL = (
    "a docstring, `from __future__ import annotations`, `import triton`, `import triton.language as tl`, "
    "@triton.jit functions, NAME = literal, NAME = tl.constexpr(literal), SPACE, CONSTRAINTS, LAUNCH, CONFIG"
)
_ALLOWED_STATEMENTS = (
    "assignments to local names, if, for over range/tl.range/tl.static_range, while, return, break, "
    "continue, pass, expression statements (calls)"
)
_ALLOWED_NAMES = (
    "the function's parameters and locals, the file's tl.constexpr constants and @triton.jit functions, "
    f"tl, triton and the builtins {', '.join(BODY_BUILTINS)}"
)


class KernelFileError(ValueError):
    """A kernel file that fails the gate or cannot be loaded or built; ``problems`` lists why."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


# ---- what Triton offers, read from the installed version -----------------------------------------
@functools.cache
def value_attributes() -> frozenset[str]:
    """Attributes a kernel body may read on a value (a tensor, a dtype, a constexpr, a descriptor):
    the public members of Triton's tensor and dtype classes and of sample instances (``element_ty``
    is set by a pointer type's constructor), minus the denied ones."""
    samples: list[Any] = [tl.tensor, tl.dtype, tl.constexpr, tl.float32, tl.pointer_type(tl.float32)]
    samples.append(tl.block_type(tl.float32, [2]))
    samples.append(tl.constexpr(1))
    for name in ("tensor_descriptor", "tensor_descriptor_base", "tuple"):
        if hasattr(tl, name):
            samples.append(getattr(tl, name))
    try:
        samples.append(tl.tensor(None, tl.block_type(tl.float32, [2])))
    except Exception:  # a Triton whose tensor constructor wants more: the class's members suffice
        log.debug("could not construct a sample tl.tensor", exc_info=True)
    names: set[str] = set()
    for sample in samples:
        names.update(n for n in dir(sample) if not n.startswith("_"))
    return frozenset(names - DENIED_MEMBERS - {"to_ir"})


def _is_public_member(module: types.ModuleType, path: str, name: str) -> bool:
    """Whether ``name`` is a public member of a namespace module (its ``__all__`` when it lists
    plain names, else any name not starting with ``_``)."""
    if f"{path}.{name}" in NAMESPACES:
        return True
    exported = getattr(module, "__all__", None)
    if exported and all("." not in item for item in exported):
        return name in exported
    return not name.startswith("_")


# ---- the parsed file -----------------------------------------------------------------------------
@dataclass(frozen=True)
class _Signature:
    """A @triton.jit function's parameters: (name, is_constexpr, has_default) in order."""

    name: str
    params: tuple[tuple[str, bool, bool], ...]

    @property
    def runtime(self) -> list[tuple[str, bool]]:
        return [(name, default) for name, constexpr, default in self.params if not constexpr]

    @property
    def constexprs(self) -> dict[str, bool]:
        return {name: default for name, constexpr, default in self.params if constexpr}


@dataclass(frozen=True)
class _Scratch:
    name: str
    shape: tuple[Expr, ...]
    dtype: str
    fill: float | int | bool


@dataclass(frozen=True)
class _Launch:
    kernel: str
    grid: tuple[Expr, ...]
    args: tuple[Expr, ...]
    constexprs: tuple[tuple[str, Expr], ...]
    options: tuple[tuple[str, Expr], ...]


@dataclass
class _Parsed:
    problems: list[str] = field(default_factory=list)
    docstring: str = ""
    constants: dict[str, Any] = field(default_factory=dict)  # every file constant's value
    constexpr_constants: set[str] = field(default_factory=set)
    kernels: dict[str, _Signature] = field(default_factory=dict)
    space: dict[str, tuple[Any, ...]] | None = None
    constraints: list[Expr] = field(default_factory=list)
    launches: list[_Launch] = field(default_factory=list)
    scratch: list[_Scratch] = field(default_factory=list)
    config: dict[str, Any] | None = None


class _NotLiteral(Exception):
    def __init__(self, node: ast.AST, message: str) -> None:
        super().__init__(message)
        self.node = node


def _literal(node: ast.AST, dicts: bool = False) -> Any:
    """The value of a literal: numbers, strings, booleans, None, tuples and lists of them (and,
    with ``dicts``, dicts with string keys). Raises _NotLiteral at the first other node."""
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, bool | int | float | str)):
        return node.value
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub | ast.UAdd)
        and isinstance(node.operand, ast.Constant)
        and isinstance(node.operand.value, int | float)
        and not isinstance(node.operand.value, bool)
    ):
        return -node.operand.value if isinstance(node.op, ast.USub) else node.operand.value
    if isinstance(node, ast.Tuple | ast.List):
        values = [_literal(e, dicts) for e in node.elts]
        return tuple(values) if isinstance(node, ast.Tuple) else values
    if dicts and isinstance(node, ast.Dict):
        result = {}
        for key, value in zip(node.keys, node.values, strict=True):
            if key is None:
                raise _NotLiteral(value, "`**` in a dict literal is not allowed")
            k = _literal(key)
            if not isinstance(k, str):
                raise _NotLiteral(key, f"dict keys must be strings, not {k!r}")
            result[k] = _literal(value, dicts)
        return result
    raise _NotLiteral(node, f"`{_short(node)}` is not a literal")


def _short(node: ast.AST, limit: int = 60) -> str:
    text = ast.unparse(node)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


def _is_tl_attr(node: ast.AST, attr: str) -> bool:
    """``tl.<attr>`` or ``triton.language.<attr>``."""
    if not (isinstance(node, ast.Attribute) and node.attr == attr):
        return False
    base = node.value
    if isinstance(base, ast.Name):
        return base.id == "tl"
    return isinstance(base, ast.Attribute) and base.attr == "language" and isinstance(base.value, ast.Name) \
        and base.value.id == "triton"


# ---- the gate ------------------------------------------------------------------------------------
class _Checker:
    """One pass over a file's syntax tree, collecting problems and the parsed data."""

    def __init__(self, source: str) -> None:
        self.parsed = _Parsed()
        self.imported: set[str] = set()  # "triton", "tl"
        self.defined: dict[str, int] = {}  # top-level name -> line
        self.data_nodes: dict[str, ast.Assign] = {}
        self.functions: list[ast.FunctionDef] = []
        try:
            tree = ast.parse(source)
        except SyntaxError as exc:
            self.flag_line(exc.lineno or 1, f"syntax error: {exc.msg}", "a kernel file is Python syntax")
            return
        except (ValueError, RecursionError) as exc:  # null bytes, absurd nesting
            self.flag_line(1, f"unreadable source: {exc}", "a kernel file is Python syntax")
            return
        for index, node in enumerate(tree.body):
            self.top_level(node, first=index == 0)
        for function in self.functions:
            _BodyChecker(self, function).check()
        self.check_data()

    # ---- reporting ---------------------------------------------------------------------------
    def flag_line(self, line: int, what: str, allowed: str) -> None:
        self.parsed.problems.append(f"line {line}: {what}; {allowed}")

    def flag(self, node: ast.AST, what: str, allowed: str) -> None:
        self.flag_line(getattr(node, "lineno", 1), what, allowed)

    def define(self, node: ast.AST, name: str) -> bool:
        if name in self.defined:
            self.flag(node, f"{name} is defined twice (first on line {self.defined[name]})",
                      "each name is defined once")
            return False
        if name in ("tl", "triton", *BODY_BUILTINS):
            self.flag(node, f"{name} is a reserved name", "name your definitions otherwise")
            return False
        self.defined[name] = getattr(node, "lineno", 1)
        return True

    # ---- top-level statements ----------------------------------------------------------------
    def top_level(self, node: ast.stmt, first: bool) -> None:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            if first:
                self.parsed.docstring = node.value.value
            else:
                self.flag(node, "a string statement after the start of the file",
                          "one docstring, at the top; use comments elsewhere")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            self.import_(node)
        elif isinstance(node, ast.FunctionDef):
            self.function(node)
        elif isinstance(node, ast.Assign):
            self.assign(node)
        else:
            what = {
                ast.ClassDef: "a class", ast.AsyncFunctionDef: "an async function", ast.Try: "try",
                ast.For: "a loop", ast.While: "a loop", ast.With: "with", ast.Global: "global",
                ast.If: "if", ast.AnnAssign: "an annotated assignment", ast.AugAssign: "an augmented assignment",
                ast.Expr: "an expression statement (a call?)", ast.Delete: "del", ast.Assert: "assert",
                ast.Raise: "raise",
            }.get(type(node), f"a {type(node).__name__} statement")
            self.flag(node, f"{what} at module level is not allowed", f"only {_ALLOWED_TOP_LEVEL}")

    def import_(self, node: ast.Import | ast.ImportFrom) -> None:
        allowed = "the imports are `import triton`, `import triton.language as tl` (or `from triton import " \
                  "language as tl`) and `from __future__ import annotations`"
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "triton" and alias.asname in (None, "triton"):
                    self.imported.add("triton")
                elif alias.name == "triton.language" and alias.asname == "tl":
                    self.imported.add("tl")
                else:
                    bound = f" as {alias.asname}" if alias.asname else ""
                    self.flag(node, f"`import {alias.name}{bound}` is not allowed", allowed)
            return
        names = [(a.name, a.asname) for a in node.names]
        if node.level == 0 and node.module == "__future__" and all(n == "annotations" and not a for n, a in names):
            return
        if node.level == 0 and node.module == "triton" and names == [("language", "tl")]:
            self.imported.add("tl")
            return
        listed = ", ".join(n + (f" as {a}" if a else "") for n, a in names)
        self.flag(node, f"`from {'.' * node.level}{node.module or ''} import {listed}` is not allowed", allowed)

    def function(self, node: ast.FunctionDef) -> None:
        allowed_jit = "exactly one decorator, @triton.jit or @triton.jit(...) with literal " \
                      f"{', '.join(sorted(JIT_OPTIONS))}"
        if len(node.decorator_list) != 1:
            where = node.decorator_list[0] if node.decorator_list else node
            self.flag(where, f"function {node.name} has {len(node.decorator_list)} decorators", allowed_jit)
        else:
            self.decorator(node.decorator_list[0], allowed_jit)
        if "triton" not in self.imported:
            self.flag(node, "@triton.jit is used before `import triton`", "import triton at the top of the file")
        if not self.define(node, node.name):
            return
        if node.name in DATA_NAMES or node.name.startswith("__"):
            self.flag(node, f"a function may not be named {node.name}", "name kernels as Python identifiers")
        args = node.args
        if args.posonlyargs or args.vararg or args.kwonlyargs or args.kwarg:
            self.flag(node, f"{node.name} has positional-only, keyword-only, *args or **kwargs parameters",
                      "plain parameters")
        if node.returns is not None:
            self.flag(node, f"{node.name} has a return annotation", "parameters may be annotated tl.constexpr")
        if getattr(node, "type_params", None):
            self.flag(node, f"{node.name} has type parameters", "plain parameters")
        params = []
        first_default = len(args.args) - len(args.defaults)
        for i, arg in enumerate(args.args):
            constexpr = False
            if arg.annotation is not None:
                constexpr = _is_tl_attr(arg.annotation, "constexpr")
                if not constexpr:
                    self.flag(arg, f"parameter {arg.arg} is annotated `{_short(arg.annotation)}`",
                              "annotations are tl.constexpr or none")
            params.append((arg.arg, constexpr, i >= first_default))
        for default in args.defaults:
            try:
                if not _is_scalar(_literal(default)):
                    raise _NotLiteral(default, "not a scalar")
            except _NotLiteral:
                self.flag(default, f"the default `{_short(default)}` is not a literal",
                          "defaults are numbers, strings, booleans or None")
        self.parsed.kernels[node.name] = _Signature(node.name, tuple(params))
        self.functions.append(node)

    def decorator(self, node: ast.expr, allowed: str) -> None:
        target = node.func if isinstance(node, ast.Call) else node
        is_jit = isinstance(target, ast.Attribute) and target.attr == "jit" and isinstance(target.value, ast.Name) \
            and target.value.id == "triton"
        if not is_jit:
            self.flag(node, f"the decorator @{_short(node)} is not allowed (kernelsmith does the tuning)", allowed)
            return
        if isinstance(node, ast.Call):
            if node.args:
                self.flag(node, "@triton.jit(...) with positional arguments", allowed)
            for keyword in node.keywords:
                if keyword.arg not in JIT_OPTIONS:
                    self.flag(keyword.value, f"@triton.jit option {keyword.arg or '**'} is not allowed", allowed)
                    continue
                try:
                    _literal(keyword.value)
                except _NotLiteral:
                    self.flag(keyword.value, f"@triton.jit option {keyword.arg} is not a literal", allowed)

    def assign(self, node: ast.Assign) -> None:
        if len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name):
            self.flag(node, f"the assignment `{_short(node)}` is not allowed",
                      "NAME = literal, NAME = tl.constexpr(literal), or SPACE/CONSTRAINTS/LAUNCH/CONFIG = literal")
            return
        name = node.targets[0].id
        if not self.define(node, name):
            return
        if name in DATA_NAMES:
            self.data_nodes[name] = node
            return
        if not CONSTANT_NAME.match(name):
            self.flag(node, f"the constant {name} is not an upper-case name", "constants are named like MAX_BLOCK_N")
            return
        value = node.value
        constexpr = isinstance(value, ast.Call) and _is_tl_attr(value.func, "constexpr")
        if constexpr:
            assert isinstance(value, ast.Call)
            spelled = "tl" if isinstance(value.func, ast.Attribute) and isinstance(value.func.value, ast.Name) \
                else "triton"
            if spelled not in self.imported:
                self.flag(node, f"{spelled} is used before it is imported",
                          "import triton and triton.language as tl at the top of the file")
            if len(value.args) != 1 or value.keywords:
                self.flag(node, f"{name} = tl.constexpr(...) takes one literal", "NAME = tl.constexpr(literal)")
                return
            value = value.args[0]
        try:
            literal = _literal(value)
        except _NotLiteral as exc:
            self.flag(exc.node, f"the constant {name}: {exc}",
                      "constants are numbers, strings, booleans, None, or tuples and lists of them")
            return
        self.parsed.constants[name] = literal
        if constexpr:
            self.parsed.constexpr_constants.add(name)

    # ---- SPACE, CONSTRAINTS, LAUNCH, CONFIG ----------------------------------------------------
    def data(self, name: str) -> tuple[Any, ast.AST] | None:
        node = self.data_nodes.get(name)
        if node is None:
            return None
        try:
            return _literal(node.value, dicts=True), node.value
        except _NotLiteral as exc:
            self.flag(exc.node, f"{name}: {exc}", f"{name} holds literal values only")
            return None

    def check_data(self) -> None:
        if not self.parsed.kernels and not self.parsed.problems:
            self.flag_line(1, "the file defines no @triton.jit function", "a kernel file holds Triton kernels")
        self.check_space()
        self.check_config()
        self.check_launch()
        self.check_constraints()

    def reserved_names(self) -> set[str]:
        return set(launch_expr.STANDARD_NAMES) | set(launch_expr.FUNCTIONS) | set(self.parsed.constants)

    def check_space(self) -> None:
        found = self.data("SPACE")
        if found is None:
            return
        space, node = found
        allowed = 'SPACE = {"PARAM": [choice, ...], ...} with literal choices'
        if not isinstance(space, dict):
            self.flag(node, "SPACE is not a dict", allowed)
            return
        checked: dict[str, tuple[Any, ...]] = {}
        count = 1
        for param, choices in space.items():
            if not param.isidentifier() or param.startswith("_") or launch_expr.is_io_tensor(param):
                self.flag(node, f"SPACE parameter {param!r} is not a valid name", "identifiers not starting with _")
            elif param in self.reserved_names():
                self.flag(node, f"SPACE parameter {param!r} hides a launch name or a constant of the file",
                          "name parameters apart from rows, N, numel, num_sms, the functions and constants")
            elif not isinstance(choices, list | tuple) or not choices or not all(_is_scalar(c) for c in choices):
                self.flag(node, f"SPACE[{param!r}] is not a non-empty list of literal choices", allowed)
            elif len(set(map(repr, choices))) != len(choices):
                self.flag(node, f"SPACE[{param!r}] lists a choice twice", "each choice once")
            else:
                checked[param] = tuple(choices)
                count *= len(choices)
        if count > MAX_SPACE_CONFIGS:
            self.flag(node, f"SPACE has {count} configs", f"at most {MAX_SPACE_CONFIGS}")
        self.parsed.space = checked

    def check_config(self) -> None:
        found = self.data("CONFIG")
        if found is None:
            return
        config, node = found
        space = self.parsed.space or {}
        if not isinstance(config, dict) or not all(_is_scalar(v) for v in config.values()):
            self.flag(node, "CONFIG is not a dict of literal values", 'CONFIG = {"PARAM": value, ...}')
            return
        if set(config) != set(space):
            self.flag(node, f"CONFIG names {sorted(config)} but SPACE has {sorted(space)}",
                      "CONFIG gives every SPACE parameter one of its choices")
        for param, value in config.items():
            if param in space and value not in space[param]:
                self.flag(node, f"CONFIG[{param!r}] = {value!r} is not one of SPACE's {list(space[param])}",
                          "CONFIG gives every SPACE parameter one of its choices")
        self.parsed.config = config

    def check_constraints(self) -> None:
        found = self.data("CONSTRAINTS")
        if found is None:
            return
        constraints, node = found
        if not isinstance(constraints, list | tuple) or not all(isinstance(c, str) for c in constraints):
            self.flag(node, "CONSTRAINTS is not a list of expression strings", 'CONSTRAINTS = ["expr", ...]')
            return
        for text in constraints:
            self.expression(node, text, "CONSTRAINTS", parsed=self.parsed.constraints)

    def expression(self, node: ast.AST, value: Any, where: str, parsed: list[Expr] | None = None,
                   tensors: Iterable[str] = (), whole_tensor: bool = False) -> Expr | None:
        """Parse one launch expression (a string, or a literal number), flagging its problems."""
        allowed = f"launch expressions: {launch_expr.ALLOWED_FORMS}"
        try:
            expr = launch_expr.literal_expr(value) if not isinstance(value, str) else None
        except LaunchExprError as exc:
            self.flag(node, f"{where}: {exc}", allowed)
            return None
        if expr is None:
            problems = launch_expr.check(value, tuple(tensors))
            if problems:
                for problem in problems:
                    self.flag(node, f"{where}: {problem}", allowed)
                return None
            expr = launch_expr.parse(value, tuple(tensors))
        if expr.tensor is not None and not whole_tensor:
            self.flag(node, f"{where}: the tensor {expr.tensor} is not a number", "tensors are passed only in args")
            return None
        if parsed is not None:
            parsed.append(expr)
        return expr

    def check_launch(self) -> None:
        node = self.data_nodes.get("LAUNCH")
        if node is None:
            self.flag_line(1, "the file has no LAUNCH", 'LAUNCH = {"kernel": ..., "grid": [...], "args": [...]}')
            return
        found = self.data("LAUNCH")
        if found is None:
            return
        launches, _ = found
        value_node = node.value
        nodes: list[ast.AST] = list(value_node.elts) if isinstance(value_node, ast.List | ast.Tuple) else [value_node]
        if isinstance(launches, dict):
            launches = [launches]
        if not isinstance(launches, list | tuple) or not launches or not all(isinstance(d, dict) for d in launches):
            self.flag(node, "LAUNCH is not a dict or a non-empty list of dicts", "one dict, or a list run in order")
            return
        if len(launches) > MAX_LAUNCHES:
            self.flag(node, f"LAUNCH has {len(launches)} launches", f"at most {MAX_LAUNCHES}")
            return
        scratch_names: list[str] = []
        for index, (launch, launch_node) in enumerate(zip(launches, nodes, strict=True)):
            if "scratch" in launch:
                if index:
                    self.flag(launch_node, "scratch is declared in a later launch", "declare it in the first launch")
                else:
                    scratch_names = self.check_scratch(launch_node, launch["scratch"])
            self.check_one_launch(launch_node, launch, scratch_names)

    def check_scratch(self, node: ast.AST, scratch: Any) -> list[str]:
        allowed = '"scratch": {"name": {"shape": [expr, ...], "dtype": "float32", "fill": 0.0}}'
        if not isinstance(scratch, dict):
            self.flag(node, "scratch is not a dict", allowed)
            return []
        names = []
        for name, entry in scratch.items():
            if not name.isidentifier() or name.startswith("_") or launch_expr.is_io_tensor(name) \
                    or name in self.reserved_names() or name in (self.parsed.space or {}):
                self.flag(node, f"the scratch name {name!r} is not a free identifier",
                          "name scratch apart from the tensors, launch names, parameters and constants")
                continue
            if not isinstance(entry, dict) or set(entry) - SCRATCH_KEYS or "shape" not in entry:
                self.flag(node, f"scratch {name!r} is not a dict of shape, dtype and fill", allowed)
                continue
            shape = entry["shape"]
            if not isinstance(shape, list | tuple) or not 1 <= len(shape) <= 8:
                self.flag(node, f"scratch {name!r} has no shape list", allowed)
                continue
            exprs = [self.expression(node, s, f"scratch {name!r} shape") for s in shape]
            dtype = entry.get("dtype", "float32")
            if dtype not in SCRATCH_DTYPES:
                self.flag(node, f"scratch {name!r} has dtype {dtype!r}", f"dtypes are {', '.join(SCRATCH_DTYPES)}")
                continue
            fill = entry.get("fill", 0)
            if isinstance(fill, str) and fill in ("inf", "-inf", "nan"):
                fill = float(fill)
            if not isinstance(fill, int | float):
                self.flag(node, f"scratch {name!r} has fill {fill!r}", 'fill is a number, "inf", "-inf" or "nan"')
                continue
            if all(e is not None for e in exprs):
                self.parsed.scratch.append(_Scratch(name, tuple(e for e in exprs if e is not None), dtype, fill))
                names.append(name)
        return names

    def check_one_launch(self, node: ast.AST, launch: dict[str, Any], scratch: list[str]) -> None:
        allowed = f"LAUNCH keys are {', '.join(sorted(LAUNCH_KEYS))}"
        unknown = set(launch) - LAUNCH_KEYS
        if unknown:
            self.flag(node, f"unknown LAUNCH keys {sorted(unknown)}", allowed)
        kernel = launch.get("kernel")
        signature = self.parsed.kernels.get(kernel) if isinstance(kernel, str) else None
        if signature is None:
            self.flag(node, f"LAUNCH kernel {kernel!r} is not a @triton.jit function of this file",
                      f"one of {sorted(self.parsed.kernels)}")
        grid = launch.get("grid")
        if not isinstance(grid, list | tuple) or not 1 <= len(grid) <= 3:
            self.flag(node, f"LAUNCH grid {grid!r} is not a list of 1 to 3 expressions", '"grid": ["rows"]')
            grid = []
        grid_exprs = [self.expression(node, g, "grid", tensors=scratch) for g in grid]
        args = launch.get("args", [])
        if not isinstance(args, list | tuple):
            self.flag(node, "LAUNCH args is not a list", '"args": ["in0", "out0", "N", ...]')
            args = []
        arg_exprs = [self.expression(node, a, "args", tensors=scratch, whole_tensor=True) for a in args]
        constexprs = launch.get("constexprs", {})
        if not isinstance(constexprs, dict):
            self.flag(node, "LAUNCH constexprs is not a dict", '"constexprs": {"BLOCK": "next_power_of_two(N)"}')
            constexprs = {}
        constexpr_exprs = {k: self.expression(node, v, f"constexprs[{k!r}]", tensors=scratch)
                           for k, v in constexprs.items()}
        options = {k: self.expression(node, launch[k], k, tensors=scratch) for k in LAUNCH_OPTIONS if k in launch}
        if signature is not None:
            runtime = signature.runtime
            required = sum(1 for _, default in runtime if not default)
            if not required <= len(args) <= len(runtime):
                count = str(required) if required == len(runtime) else f"{required} to {len(runtime)}"
                self.flag(node, f"LAUNCH of {signature.name} passes {len(args)} args, but it takes {count} "
                          f"(its parameters that are not tl.constexpr: {', '.join(n for n, _ in runtime)})",
                          "one args entry per non-constexpr parameter, in order")
            declared = signature.constexprs
            for name in constexprs:
                if name not in declared:
                    self.flag(node, f"constexprs[{name!r}]: {signature.name} has no tl.constexpr parameter {name}",
                              f"its tl.constexpr parameters are {sorted(declared) or 'none'}")
            for name, default in declared.items():
                if not default and name not in constexprs:
                    self.flag(node, f"LAUNCH of {signature.name} gives no value for its tl.constexpr {name}",
                              "every tl.constexpr parameter without a default is in constexprs")
        exprs = [*grid_exprs, *arg_exprs, *constexpr_exprs.values(), *options.values()]
        if signature is None or any(e is None for e in exprs):
            return
        self.parsed.launches.append(_Launch(
            signature.name,
            tuple(e for e in grid_exprs if e is not None),
            tuple(e for e in arg_exprs if e is not None),
            tuple((k, e) for k, e in constexpr_exprs.items() if e is not None),
            tuple((k, e) for k, e in options.items() if e is not None),
        ))


class _BodyChecker:
    """The grammar of one @triton.jit function's body (module docstring)."""

    def __init__(self, checker: _Checker, function: ast.FunctionDef) -> None:
        self.checker = checker
        self.function = function
        # Every name the function binds (its parameters and assignment targets: Python makes
        # them local to the whole body), with the node that binds it first.
        self.bound: dict[str, ast.AST] = {a.arg: a for a in function.args.args}
        for node in ast.walk(function):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                self.bound.setdefault(node.id, node)
        self.locals = set(self.bound)

    def flag(self, node: ast.AST, what: str, allowed: str) -> None:
        self.checker.flag(node, f"in {self.function.name}: {what}", allowed)

    def check(self) -> None:
        parsed = self.checker.parsed
        for name, where in self.bound.items():
            reserved = name in ("tl", "triton", *BODY_BUILTINS) or name in parsed.kernels or name in parsed.constants
            if name.startswith("_") or reserved:
                self.flag(where, f"the local name {name!r} is not allowed",
                          "locals do not start with _ and do not hide tl, triton, builtins or the file's names")
        for statement in self.function.body:
            self.statement(statement)

    # ---- statements ------------------------------------------------------------------------
    def statements(self, body: Iterable[ast.stmt]) -> None:
        for statement in body:
            self.statement(statement)

    def statement(self, node: ast.stmt) -> None:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                self.target(target)
            self.expr(node.value)
        elif isinstance(node, ast.AugAssign):
            self.target(node.target, unpack=False)
            self.expr(node.value)
        elif isinstance(node, ast.AnnAssign):
            self.target(node.target, unpack=False)
            self.expr(node.annotation)
            if node.value is not None:
                self.expr(node.value)
        elif isinstance(node, ast.If):
            self.expr(node.test)
            self.statements(node.body)
            self.statements(node.orelse)
        elif isinstance(node, ast.For):
            self.target(node.target)
            self.loop_iterator(node.iter)
            self.no_else(node)
            self.statements(node.body)
        elif isinstance(node, ast.While):
            self.expr(node.test)
            self.no_else(node)
            self.statements(node.body)
        elif isinstance(node, ast.Return):
            if node.value is not None:
                self.expr(node.value)
        elif isinstance(node, ast.Expr):
            self.expr(node.value)
        elif not isinstance(node, ast.Break | ast.Continue | ast.Pass):
            what = {
                ast.FunctionDef: "a nested function", ast.AsyncFunctionDef: "a nested function",
                ast.ClassDef: "a class", ast.With: "with", ast.AsyncWith: "with", ast.Try: "try",
                ast.Import: "import", ast.ImportFrom: "import", ast.Global: "global", ast.Nonlocal: "nonlocal",
                ast.Delete: "del", ast.Assert: "assert (use tl.device_assert or tl.static_assert)",
                ast.Raise: "raise",
            }.get(type(node), f"a {type(node).__name__} statement")
            self.flag(node, f"{what} is not allowed in a kernel body", f"statements: {_ALLOWED_STATEMENTS}")

    def no_else(self, node: ast.For | ast.While) -> None:
        if node.orelse:
            self.flag(node, "a loop with an else branch", "loops without else")

    def target(self, node: ast.expr, unpack: bool = True) -> None:
        if isinstance(node, ast.Name):
            return
        if unpack and isinstance(node, ast.Tuple | ast.List):
            for element in node.elts:
                self.target(element)
            return
        self.flag(node, f"assignment to `{_short(node)}`", "assign to local names (or unpack into them)")

    def loop_iterator(self, node: ast.expr) -> None:
        ok = isinstance(node, ast.Call) and (
            (isinstance(node.func, ast.Name) and node.func.id == "range" and "range" not in self.locals)
            or _is_tl_attr(node.func, "range")
            or _is_tl_attr(node.func, "static_range")
        )
        if not ok:
            self.flag(node, f"a loop over `{_short(node)}`", "for loops run over range, tl.range or tl.static_range")
        self.expr(node)

    # ---- expressions -----------------------------------------------------------------------
    def expr(self, node: ast.expr) -> None:
        if isinstance(node, ast.Constant):
            if not _is_scalar(node.value):
                self.flag(node, f"the literal {_short(node)}", "numbers, strings, booleans and None")
        elif isinstance(node, ast.Name):
            self.name(node)
        elif isinstance(node, ast.Attribute):
            self.attribute(node)
        elif isinstance(node, ast.Call):
            self.call(node)
        elif isinstance(node, ast.Subscript):
            if isinstance(node.value, ast.Name) and node.value.id in self.checker.parsed.kernels:
                self.flag(node, f"launching {node.value.id}[...] from a kernel", "call @triton.jit functions directly")
            else:
                self.expr(node.value)
            self.expr(node.slice)
        elif isinstance(node, ast.Slice):
            for part in (node.lower, node.upper, node.step):
                if part is not None:
                    self.expr(part)
        elif isinstance(node, ast.BinOp):
            self.expr(node.left)
            self.expr(node.right)
        elif isinstance(node, ast.UnaryOp):
            self.expr(node.operand)
        elif isinstance(node, ast.BoolOp):
            for value in node.values:
                self.expr(value)
        elif isinstance(node, ast.Compare):
            for value in (node.left, *node.comparators):
                self.expr(value)
        elif isinstance(node, ast.IfExp):
            for value in (node.test, node.body, node.orelse):
                self.expr(value)
        elif isinstance(node, ast.Tuple | ast.List):
            for element in node.elts:
                self.expr(element)
        else:
            what = {
                ast.Lambda: "a lambda", ast.ListComp: "a comprehension", ast.SetComp: "a comprehension",
                ast.DictComp: "a comprehension", ast.GeneratorExp: "a generator expression",
                ast.JoinedStr: "an f-string", ast.FormattedValue: "an f-string", ast.NamedExpr: "`:=`",
                ast.Dict: "a dict", ast.Set: "a set", ast.Starred: "`*` unpacking", ast.Await: "await",
                ast.Yield: "yield", ast.YieldFrom: "yield",
            }.get(type(node), f"a {type(node).__name__} expression")
            self.flag(node, f"{what} is not allowed in a kernel body",
                      "Triton expressions: names, constants, attributes, calls, indexing, operators")

    def name(self, node: ast.Name, bare: bool = True) -> str:
        """Check a name that is read; returns its kind ("local", "kernel", "tl", "triton", "builtin",
        "constant" or "" when it is not allowed)."""
        name = node.id
        parsed = self.checker.parsed
        if name in self.locals:
            return "local"
        if name in parsed.kernels:
            return "kernel"
        if name in ("tl", "triton"):
            if name not in self.checker.imported:
                self.flag(node, f"{name} is not imported", "import triton and triton.language as tl")
            elif bare:
                self.flag(node, f"`{name}` on its own", f"use {name}.<member>")
            return name
        if name in BODY_BUILTINS:
            return "builtin"
        if name in parsed.constants:
            if name not in parsed.constexpr_constants:
                self.flag(node, f"{name} is read in a kernel body but is not a tl.constexpr",
                          f"define it as {name} = tl.constexpr(literal)")
            return "constant"
        self.flag(node, f"the name {name!r} is not allowed" if name.startswith("_") else f"unknown name {name!r}",
                  f"a kernel body names {_ALLOWED_NAMES}")
        return ""

    def attribute(self, node: ast.Attribute) -> None:
        chain: list[ast.Attribute] = []
        root: ast.expr = node
        while isinstance(root, ast.Attribute):
            chain.insert(0, root)
            root = root.value
        for link in chain:
            if link.attr.startswith("_") or link.attr in DENIED_MEMBERS:
                self.flag(link, f"the attribute {link.attr!r} is not allowed", self.denied_reason(link.attr))
                return
        if isinstance(root, ast.Name):
            kind = self.name(root, bare=False)
            if kind == "tl":
                self.triton_language(chain, "tl")
                return
            if kind == "triton":
                self.triton_attribute(chain)
                return
            if kind in ("kernel", "builtin"):
                self.flag(node, f"attributes of {root.id}", "attributes of tl, triton and of tensor values")
                return
            if not kind:
                return
        else:
            self.expr(root)
        self.value_attributes(chain)

    @staticmethod
    def denied_reason(attr: str) -> str:
        if attr.startswith("_"):
            return "names and attributes never start with _"
        if attr == "handle":
            return "handle is the interpreter's raw storage; use tl.load and tl.store"
        return "no inline assembly, clocks, timers, multiprocessor ids or printing in kernels"

    def value_attributes(self, chain: Sequence[ast.Attribute]) -> None:
        allowed = value_attributes()
        for link in chain:
            if link.attr not in allowed:
                self.flag(link, f"the attribute .{link.attr} is not a public member of tl.tensor or tl.dtype",
                          "on values: the methods and properties of tl.tensor and tl.dtype (.to, .dtype, ...)")
                return

    def triton_attribute(self, chain: Sequence[ast.Attribute]) -> None:
        first = chain[0].attr
        if first == "language":
            if len(chain) == 1:
                self.flag(chain[0], "`triton.language` on its own", "use tl.<member>")
            else:
                self.triton_language(chain[1:], "triton.language")
            return
        if first not in TRITON_FUNCTIONS:
            self.flag(chain[0], f"triton.{first} is not allowed in a kernel body",
                      "triton.cdiv, triton.next_power_of_2 and tl.<member>")
            return
        self.value_attributes(chain[1:])

    def triton_language(self, chain: Sequence[ast.Attribute], spelled: str) -> None:
        """Resolve ``tl.a.b...`` against the installed Triton (a trusted module: getattr is safe)."""
        current: Any = tl
        path = "tl"
        for index, link in enumerate(chain):
            if not isinstance(current, types.ModuleType):
                self.value_attributes(chain[index:])
                return
            written = spelled + path[2:] + "." + link.attr
            member = getattr(current, link.attr, None) if _is_public_member(current, path, link.attr) else None
            if member is None:
                self.flag(link, f"{written} is not a public member of triton.language {triton.__version__}",
                          "public members of triton.language, tl.math, tl.extra.cuda, tl.extra.cuda.libdevice")
                return
            if isinstance(member, types.ModuleType) and f"{path}.{link.attr}" not in NAMESPACES:
                self.flag(link, f"{written} is a module outside the kernel namespaces",
                          f"namespaces: {', '.join(sorted(NAMESPACES))}")
                return
            current, path = member, f"{path}.{link.attr}"
        if isinstance(current, types.ModuleType):
            self.flag(chain[-1], f"`{spelled}{path[2:]}` on its own", "use its members")

    def call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name):
            kind = self.name(func, bare=False)
            if kind in ("local", "constant"):
                self.flag(node, f"calling {func.id}", "call tl functions, the file's kernels and the builtins")
        elif isinstance(func, ast.Attribute):
            self.attribute(func)
        elif isinstance(func, ast.Subscript) and isinstance(func.value, ast.Name) \
                and func.value.id in self.checker.parsed.kernels:
            self.expr(func)  # kernel[grid](...): says that kernels are not launched from kernels
        else:
            self.flag(node, f"calling `{_short(func)}`", "call tl functions, the file's kernels and the builtins")
        for arg in node.args:
            if isinstance(arg, ast.Starred):
                self.flag(arg, "`*` unpacking in a call", "plain arguments")
            else:
                self.expr(arg)
        for keyword in node.keywords:
            if keyword.arg is None:
                self.flag(keyword.value, "`**` unpacking in a call", "plain keyword arguments")
            else:
                self.expr(keyword.value)


def check_kernel_file(source: str) -> list[str]:
    """Every problem of a kernel file, one line each ("line N: what is wrong; what is allowed");
    empty when the file passes the gate. The file is only read, never run.

    >>> check_kernel_file("import os")[0].split(";")[0]
    'line 1: `import os` is not allowed'
    """
    return list(_Checker(source).parsed.problems)


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
                values = list(template)
                for position, where, index in slots:
                    values[position] = inputs[index] if where == "in" else outputs[index]
                kernel(*values, **options)

            return launch_one

        def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
            device = inputs[0].device
            tensors: list[torch.Tensor] = []
            for (_, shape, dtype, _), (fill, count, value) in zip(scratch, fills, strict=True):
                tensor = torch.empty(shape, dtype=dtype, device=device)
                fill(tensor, count, VALUE=value, BLOCK=_FILL_BLOCK)
                tensors.append(tensor)
            for kernel, template, slots, options in steps:
                values = list(template)
                for position, where, index in slots:
                    source = inputs if where == "in" else outputs if where == "out" else tensors
                    values[position] = source[index]
                kernel(*values, **options)

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
