"""The top-level gate of a kernel file: its statements and its launch data (``docs/kernel-files.md``).

:func:`check_kernel_file` reads a file's syntax tree, never runs it, and lists every problem on one
line that says what is wrong and what is allowed. :class:`_Checker` goes over the top-level
statements (a docstring, the Triton imports, ``@triton.jit`` functions with their decorators and
signatures, literal constants), hands every function body to the body gate
(:mod:`kernelsmith.evaluate.kernel_body_gate`), and then checks the shapes of ``SPACE``,
``CONFIG``, ``LAUNCH`` (with its scratch) and ``CONSTRAINTS`` against the functions it found: each
launch names a kernel of the file and passes one argument per non-constexpr parameter, each
expression is a launch expression (:mod:`kernelsmith.evaluate.launch_expr`). What passes is kept in
:class:`_Parsed`, from which :mod:`kernelsmith.evaluate.kernel_file` builds launchers, so nothing is
parsed twice and nothing the gate did not see is launched.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kernelsmith.evaluate import launch_expr
from kernelsmith.evaluate.kernel_body_gate import RESERVED_NAMES, _BodyChecker, _is_scalar, _is_tl_attr, _short
from kernelsmith.evaluate.launch_expr import Expr, LaunchExprError
from kernelsmith.spec import DTYPES

# The imports a kernel file may have (as `import X` / `from X import ...` module names).
ALLOWED_IMPORTS = frozenset({"__future__", "triton", "triton.language"})

JIT_OPTIONS = frozenset({"do_not_specialize", "do_not_specialize_on_alignment", "noinline", "debug"})
DATA_NAMES = ("SPACE", "CONSTRAINTS", "LAUNCH", "CONFIG")
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
LAUNCH_KEYS = frozenset({"kernel", "grid", "args", "constexprs", "scratch", *LAUNCH_OPTIONS})
SCRATCH_KEYS = frozenset({"shape", "dtype", "fill"})
SCRATCH_DTYPES = tuple(name for name in DTYPES if name != "bool")
MAX_LAUNCHES = 8
MAX_SPACE_CONFIGS = 100_000
CONSTANT_NAME = re.compile(r"[A-Z][A-Z0-9_]*\Z")

_ALLOWED_TOP_LEVEL = (
    "a docstring, `from __future__ import annotations`, `import triton`, `import triton.language as tl`, "
    "@triton.jit functions, NAME = literal, NAME = tl.constexpr(literal), SPACE, CONSTRAINTS, LAUNCH, CONFIG"
)


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
        if name in RESERVED_NAMES:
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

def check_kernel_file(source: str) -> list[str]:
    """Every problem of a kernel file, one line each ("line N: what is wrong; what is allowed");
    empty when the file passes the gate. The file is only read, never run.

    >>> check_kernel_file("import os")[0].split(";")[0]
    'line 1: `import os` is not allowed'
    """
    return list(_Checker(source).parsed.problems)

