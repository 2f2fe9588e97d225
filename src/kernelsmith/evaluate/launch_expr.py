"""Launch expressions: the small grammar a kernel file describes its grid, arguments and configs in.

A kernel file (``docs/kernel-files.md``) never runs host Python, so whatever its launch depends on
(the grid from the problem size, a block size from the row width, a stride) is written as a string
in this grammar, which kernelsmith parses with :func:`ast.parse` and evaluates *itself*, node by
node: nothing here is ever handed to Python's ``eval``, and only the node types listed below exist
for it. What an expression can name:

- literals: integers, floats, strings, ``True``, ``False``, ``None``;
- tensors (``in0``, ``out0``, scratch names), only as the whole expression (an ``args`` entry) or
  as the first argument of ``size``, ``stride``, ``numel``, ``ndim``, ``row_stride``;
- any other name is looked up in the environment the caller gives :func:`evaluate` (``rows``,
  ``N``, ``numel``, ``num_sms``, the workload's constants, the config's parameters, the file's
  constants);
- the integer helpers ``cdiv``, ``next_power_of_two``, ``min``, ``max``, ``abs``;
- ``+ - * / // % **``, unary ``-``/``+``, ``not``, ``and``, ``or``, comparisons, ``a if c else b``.

Arithmetic is bounded: only numbers take part in it (no ``"x" * 10**9``), ``**`` takes an exponent
of at most :data:`MAX_EXPONENT`, integers beyond 2**64 are refused, and division by zero is a
:class:`LaunchExprError` with the expression in its message, like every other failure.

Parsing (:func:`parse`, :func:`check`) needs no workload, so the kernel-file gate can list every
problem of every expression before anything is loaded; evaluation needs an environment.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kernelsmith.exceptions import KernelsmithError

MAX_LENGTH = 400  # characters in one expression: enough for any launch, too few to nest deeply
MAX_EXPONENT = 64
MAX_INT = 1 << 64

TENSOR_FUNCTIONS = frozenset({"size", "stride", "numel", "ndim", "row_stride"})
# Arity (fewest, most) of every function; None: any number from the fewest up.
FUNCTIONS: dict[str, tuple[int, int | None]] = {
    "size": (2, 2),
    "stride": (2, 2),
    "numel": (1, 1),
    "ndim": (1, 1),
    "row_stride": (1, 1),
    "cdiv": (2, 2),
    "next_power_of_two": (1, 1),
    "min": (1, None),
    "max": (1, None),
    "abs": (1, 1),
}
# Names every launch environment defines (about the first input and the device).
STANDARD_NAMES = frozenset({"rows", "N", "numel", "num_sms"})
_IO_TENSOR = re.compile(r"(in|out)(0|[1-9][0-9]*)\Z")

ALLOWED_FORMS = (
    "literals, names, size/stride/numel/ndim/row_stride(tensor, ...), cdiv, next_power_of_two, "
    "min, max, abs, + - * / // % **, comparisons, and/or/not, a if c else b"
)


class LaunchExprError(KernelsmithError, ValueError):
    """An expression that does not parse in the grammar, or fails to evaluate."""


def is_io_tensor(name: str) -> bool:
    """Whether ``name`` is one of the call's tensors (``in0``, ``out2``...)."""
    return _IO_TENSOR.match(name) is not None


@dataclass(frozen=True)
class TensorInfo:
    """What the tensor functions read: a tensor's shape and strides (from a spec, or a tensor)."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]


@dataclass(frozen=True)
class Expr:
    """A parsed launch expression. ``tensor`` names the tensor when the expression is nothing but
    one (an ``args`` entry passing it to the kernel); ``names`` are the other names it reads."""

    text: str
    tree: ast.expr
    names: frozenset[str]
    tensors: frozenset[str]  # tensors read by the tensor functions (or as the whole expression)

    @property
    def tensor(self) -> str | None:
        return self.tree.id if isinstance(self.tree, ast.Name) and self.tree.id in self.tensors else None


_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}
_SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**"}


# ---- parsing -----------------------------------------------------------------------------------
class _Parser:
    def __init__(self, text: str, tensor_names: Collection[str]) -> None:
        self.text = text
        self.tensor_names = tensor_names
        self.problems: list[str] = []
        self.names: set[str] = set()
        self.tensors: set[str] = set()

    def is_tensor(self, name: str) -> bool:
        return is_io_tensor(name) or name in self.tensor_names

    def flag(self, what: str) -> None:
        self.problems.append(f"{self.text!r}: {what}")

    def visit(self, node: ast.AST, whole: bool = False) -> None:
        if isinstance(node, ast.Constant):
            if not (node.value is None or isinstance(node.value, bool | int | float | str)):
                self.flag(f"the literal {node.value!r} is not allowed; numbers, strings, True, False, None are")
        elif isinstance(node, ast.Name):
            if self.is_tensor(node.id):
                self.tensors.add(node.id)
                if not whole:
                    self.flag(f"{node.id} is a tensor: use it as a whole argument of args or inside "
                              "size/stride/numel/ndim/row_stride")
            elif node.id.startswith("_"):
                self.flag(f"the name {node.id!r} is not allowed (names never start with '_')")
            else:
                self.names.add(node.id)
        elif isinstance(node, ast.BinOp):
            if type(node.op) not in _BINARY:
                self.flag(f"the operator {type(node.op).__name__} is not allowed; + - * / // % ** are")
            self.visit(node.left)
            self.visit(node.right)
        elif isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, ast.USub | ast.UAdd | ast.Not):
                self.flag(f"the operator {type(node.op).__name__} is not allowed; unary -, + and not are")
            self.visit(node.operand)
        elif isinstance(node, ast.BoolOp):
            for value in node.values:
                self.visit(value)
        elif isinstance(node, ast.Compare):
            for op in node.ops:
                if type(op) not in _COMPARE:
                    self.flag(f"the comparison {type(op).__name__} is not allowed; == != < <= > >= is are")
            for value in (node.left, *node.comparators):
                self.visit(value)
        elif isinstance(node, ast.IfExp):
            for value in (node.test, node.body, node.orelse):
                self.visit(value)
        elif isinstance(node, ast.Call):
            self.visit_call(node)
        else:
            self.flag(f"{type(node).__name__} is not part of the grammar; allowed: {ALLOWED_FORMS}")

    def visit_call(self, node: ast.Call) -> None:
        name = node.func.id if isinstance(node.func, ast.Name) else None
        if name not in FUNCTIONS:
            called = name or ast.unparse(node.func)
            self.flag(f"unknown function {called!r}; the functions are {', '.join(FUNCTIONS)}")
            return
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            self.flag(f"{name}() takes positional arguments only")
            return
        fewest, most = FUNCTIONS[name]
        if len(node.args) < fewest or (most is not None and len(node.args) > most):
            count = str(fewest) if most == fewest else f"{fewest} or more"
            self.flag(f"{name}() takes {count} arguments, not {len(node.args)}")
            return
        rest = node.args
        if name in TENSOR_FUNCTIONS:
            first, *rest = node.args
            if not (isinstance(first, ast.Name) and self.is_tensor(first.id)):
                self.flag(f"the first argument of {name}() must be a tensor (in0, out0, a scratch name)")
            else:
                self.tensors.add(first.id)
        for arg in rest:
            self.visit(arg)


def check(text: str, tensor_names: Collection[str] = ()) -> list[str]:
    """Every problem of one expression, as short sentences (empty when it parses in the grammar).

    >>> check("cdiv(N, BLOCK)")
    []
    >>> check("N ** 2 if x else y.z")[0].split(";")[0]
    "'N ** 2 if x else y.z': Attribute is not part of the grammar"
    """
    return _parse(text, tensor_names)[1]


def parse(text: str, tensor_names: Collection[str] = ()) -> Expr:
    """The parsed expression; raises LaunchExprError listing every problem. ``tensor_names`` are
    the scratch tensors of the launch (``in0``..., ``out0``... are always tensors)."""
    expr, problems = _parse(text, tensor_names)
    if expr is None:
        raise LaunchExprError("; ".join(problems))
    return expr


def _parse(text: str, tensor_names: Collection[str]) -> tuple[Expr | None, list[str]]:
    if not isinstance(text, str):
        return None, [f"{text!r} is not an expression string"]
    if len(text) > MAX_LENGTH:
        return None, [f"{text[:40]!r}...: longer than {MAX_LENGTH} characters"]
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        return None, [f"{text!r}: not an expression ({exc.msg})"]
    parser = _Parser(text, tensor_names)
    parser.visit(tree.body, whole=True)
    if parser.problems:
        return None, parser.problems
    return Expr(text, tree.body, frozenset(parser.names), frozenset(parser.tensors)), []


def literal_expr(value: Any) -> Expr:
    """An expression for a literal number, boolean or None written directly in a launch dict."""
    if not (value is None or isinstance(value, bool | int | float)):
        raise LaunchExprError(f"{value!r} is neither an expression string nor a number")
    return Expr(repr(value), ast.Constant(value), frozenset(), frozenset())


# ---- evaluation --------------------------------------------------------------------------------
def evaluate(expr: Expr, names: Mapping[str, Any], tensors: Mapping[str, TensorInfo] | None = None) -> Any:
    """The value of ``expr`` with ``names`` for its names and ``tensors`` for its tensor functions.

    Raises LaunchExprError (with the expression's text) for an unknown name, a bad operand, a
    division by zero or a value out of range. A bare tensor name is not a value: callers pass the
    tensor itself for an ``args`` entry whose :attr:`Expr.tensor` is set.
    """
    try:
        return _Evaluator(names, tensors or {}).value(expr.tree)
    except LaunchExprError as exc:
        raise LaunchExprError(f"{expr.text!r}: {exc}") from None


class _Evaluator:
    def __init__(self, names: Mapping[str, Any], tensors: Mapping[str, TensorInfo]) -> None:
        self.names = names
        self.tensors = tensors

    def value(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in self.tensors or is_io_tensor(node.id):
                raise LaunchExprError(f"{node.id} is a tensor, not a number")
            if node.id not in self.names:
                known = ", ".join(sorted(self.names))
                raise LaunchExprError(f"unknown name {node.id!r} (known here: {known})")
            return self.names[node.id]
        if isinstance(node, ast.BinOp):
            return self.binary(node)
        if isinstance(node, ast.UnaryOp):
            operand = self.value(node.operand)
            if isinstance(node.op, ast.Not):
                return not operand
            number = _number(operand, "unary -" if isinstance(node.op, ast.USub) else "unary +")
            return -number if isinstance(node.op, ast.USub) else +number
        if isinstance(node, ast.BoolOp):
            result: Any = None
            for item in node.values:
                result = self.value(item)
                if isinstance(node.op, ast.And) and not result:
                    return result
                if isinstance(node.op, ast.Or) and result:
                    return result
            return result
        if isinstance(node, ast.Compare):
            left = self.value(node.left)
            for op, right_node in zip(node.ops, node.comparators, strict=True):
                right = self.value(right_node)
                try:
                    holds = _COMPARE[type(op)](left, right)
                except TypeError:
                    raise LaunchExprError(f"cannot compare {left!r} with {right!r}") from None
                if not holds:
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            return self.value(node.body) if self.value(node.test) else self.value(node.orelse)
        if isinstance(node, ast.Call):
            return self.call(node)
        raise LaunchExprError(f"{type(node).__name__} is not part of the grammar")  # parse() refuses these

    def binary(self, node: ast.BinOp) -> Any:
        symbol = _SYMBOL[type(node.op)]
        left = _number(self.value(node.left), symbol)
        right = _number(self.value(node.right), symbol)
        if isinstance(node.op, ast.Pow) and (not isinstance(right, int) or abs(right) > MAX_EXPONENT):
            raise LaunchExprError(f"** takes an integer exponent of at most {MAX_EXPONENT}, not {right!r}")
        if isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod) and right == 0:
            raise LaunchExprError(f"division by zero in {left!r} {symbol} {right!r}")
        try:
            return _bounded(_BINARY[type(node.op)](left, right))
        except (OverflowError, ZeroDivisionError) as exc:
            raise LaunchExprError(f"{left!r} {symbol} {right!r}: {exc}") from None

    def call(self, node: ast.Call) -> Any:
        assert isinstance(node.func, ast.Name)
        name = node.func.id
        if name in TENSOR_FUNCTIONS:
            first, *rest = node.args
            assert isinstance(first, ast.Name)
            info = self.tensors.get(first.id)
            if info is None:
                raise LaunchExprError(f"there is no tensor {first.id} here (known: {', '.join(self.tensors)})")
            return _tensor_function(name, first.id, info, [self.value(a) for a in rest])
        args = [self.value(a) for a in node.args]
        if name == "cdiv":
            a, b = (_integer(v, "cdiv") for v in args)
            if b == 0:
                raise LaunchExprError(f"division by zero in cdiv({a}, {b})")
            return -(-a // b)
        if name == "next_power_of_two":
            n = _integer(args[0], "next_power_of_two")
            if n > MAX_INT:
                raise LaunchExprError(f"next_power_of_two({n}) is out of range")
            return 1 if n <= 1 else 1 << (n - 1).bit_length()
        numbers = [_number(v, name) for v in args]
        if name == "abs":
            return abs(numbers[0])
        return min(numbers) if name == "min" else max(numbers)


def _tensor_function(name: str, tensor: str, info: TensorInfo, args: Sequence[Any]) -> int:
    shape, strides = info.shape, info.strides
    if name == "numel":
        return math.prod(shape)
    if name == "ndim":
        return len(shape)
    if name == "row_stride":
        return _row_stride(tensor, info)
    d = _integer(args[0], name)
    if not -len(shape) <= d < len(shape):
        raise LaunchExprError(f"{name}({tensor}, {d}): {tensor} has {len(shape)} dimensions")
    return shape[d] if name == "size" else strides[d]


def _row_stride(tensor: str, info: TensorInfo) -> int:
    """The stride between rows of ``tensor`` viewed as (rows, N): every leading dimension
    flattened into rows. A 1-D tensor is one row (its stride is then its length)."""
    shape, strides = info.shape, info.strides
    if not shape:
        raise LaunchExprError(f"row_stride({tensor}): a 0-D tensor has no rows")
    if len(shape) == 1:
        return shape[0]
    for i in range(len(shape) - 2):
        if shape[i] > 1 and strides[i] != strides[i + 1] * shape[i + 1]:
            raise LaunchExprError(f"row_stride({tensor}): its leading dimensions {shape[:-1]} with strides "
                                  f"{strides[:-1]} cannot be flattened into rows")
    return strides[-2]


def _number(value: Any, where: str) -> int | float:
    if not isinstance(value, int | float):  # bool is an int
        raise LaunchExprError(f"{where} takes numbers, not {value!r}")
    return value


def _integer(value: Any, where: str) -> int:
    if not isinstance(value, int):
        raise LaunchExprError(f"{where} takes integers, not {value!r}")
    return value


def _bounded(value: int | float) -> int | float:
    if isinstance(value, int) and abs(value) > MAX_INT:
        raise LaunchExprError(f"the integer {value} is out of range (more than 2**64)")
    return value
