"""The gate of a ``@triton.jit`` body: what a kernel function of a kernel file may say.

:class:`_BodyChecker` reads one function's syntax tree (it never runs it) for the top-level gate
(:mod:`kernelsmith.evaluate.kernel_gate`) and reports each problem there, on one line that says what
is wrong and what is allowed. Names, statements and expressions follow ``docs/kernel-files.md``;
attributes are resolved against the installed Triton (:func:`value_attributes`,
:func:`_is_public_member`), so the grammar follows the Triton version the kernels will run on.

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
import functools
import logging
import types
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import triton
import triton.language as tl

if TYPE_CHECKING:  # the top-level gate runs this one; only its type is named here
    from kernelsmith.evaluate.kernel_gate import _Checker

log = logging.getLogger(__name__)

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
TRITON_FUNCTIONS = frozenset({"cdiv", "next_power_of_2"})  # triton.<name> a body may call
# Names a file may not define and a body may not bind: they would hide what a body reads.
RESERVED_NAMES = ("tl", "triton", *BODY_BUILTINS)

_ALLOWED_STATEMENTS = (
    "assignments to local names, if, for over range/tl.range/tl.static_range, while, return, break, "
    "continue, pass, expression statements (calls)"
)
_ALLOWED_NAMES = (
    "the function's parameters and locals, the file's tl.constexpr constants and @triton.jit functions, "
    f"tl, triton and the builtins {', '.join(BODY_BUILTINS)}"
)


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


# ---- syntax helpers (shared with the top-level gate) -------------------------------------------
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


# ---- the body gate -------------------------------------------------------------------------------
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
            reserved = name in RESERVED_NAMES or name in parsed.kernels or name in parsed.constants
            if name.startswith("_") or reserved:
                self.flag(where, f"the local name {name!r} is not allowed",
                          "locals do not start with _ and do not hide tl, triton, builtins or the file's names")
        self.statements(self.function.body)

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

