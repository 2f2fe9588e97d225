"""Kernel files (docs/kernel-files.md): the launch-expression grammar, the gate over the file and
its @triton.jit bodies, and loading and launching them in the Triton interpreter."""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path

import pytest
import torch

from kernelsmith.evaluate import launch_expr
from kernelsmith.evaluate.errors import check_close
from kernelsmith.evaluate.kernel_file import (
    KernelFile,
    KernelFileError,
    _restricted_import,
    check_kernel_file,
    load_namespace,
    parse_kernel_file,
    restricted_builtins,
)
from kernelsmith.evaluate.launch_expr import LaunchExprError, TensorInfo
from kernelsmith.evaluate.pool import Evaluator
from kernelsmith.evaluate.protocol import Candidate
from kernelsmith.ops import get_op
from kernelsmith.space import Config

DOC = Path(__file__).resolve().parents[1] / "docs" / "kernel-files.md"
RMSNORM_FILE = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)  # type: ignore[union-attr]

SOFTMAX_FILE = '''\
"""Softmax over the last dimension: one row per program, three passes over column blocks."""

from __future__ import annotations

import triton
import triton.language as tl

MAX_BLOCK = 4096
ZERO = tl.constexpr(0.0)


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _row_max(x_row, N, BLOCK: tl.constexpr):
    m = tl.full([BLOCK], -float("inf"), tl.float32)
    for start in tl.range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < N, other=-float("inf")).to(tl.float32)
        m = tl.maximum(m, x)
    return tl.max(m, axis=0)


@triton.jit
def _softmax_kernel(x_ptr, y_ptr, x_row_stride, y_row_stride, N, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    tl.static_assert(BLOCK >= 1)
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    y_row = y_ptr + row * y_row_stride
    m = _row_max(x_row, N, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32) + ZERO
    start = 0
    while start < N:
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < N, other=-float("inf")).to(tl.float32)
        acc += tl.where(cols < N, tl.exp(x - m), 0.0)
        start += BLOCK
    total = tl.reduce(acc, 0, _add)
    for i in tl.static_range(UNROLL):
        pass
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_row + cols, (tl.exp(x - m) / total).to(y_ptr.dtype.element_ty), mask=mask)


SPACE = {"BLOCK": [16, 64, 256], "num_warps": [1, 4]}
CONSTRAINTS = ["BLOCK <= max(16, next_power_of_two(N))", "BLOCK <= MAX_BLOCK"]
LAUNCH = {
    "kernel": "_softmax_kernel",
    "grid": ["rows"],
    "args": ["in0", "out0", "row_stride(in0)", "row_stride(out0)", "N"],
    "constexprs": {"BLOCK": "BLOCK", "UNROLL": 2},
    "num_warps": "num_warps",
}
CONFIG = {"BLOCK": 64, "num_warps": 4}
'''

# RMSNorm in two launches: the first adds each column block's sum of squares into a scratch
# vector (atomically, so it relies on the scratch being zeroed on every call), the second
# normalises. The grid of the first is two-dimensional.
TWO_LAUNCH_FILE = '''\
import triton
import triton.language as tl


@triton.jit
def _sum_squares(x_ptr, sums_ptr, row_stride, N, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * row_stride + cols, mask=cols < N, other=0.0).to(tl.float32)
    tl.atomic_add(sums_ptr + row, tl.sum(x * x, axis=0))


@triton.jit
def _normalize(x_ptr, w_ptr, y_ptr, sums_ptr, row_stride, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    rstd = tl.rsqrt(tl.load(sums_ptr + row) / N + eps)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(x_ptr + row * row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * row_stride + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


SPACE = {"BLOCK": [16, 128]}
LAUNCH = [
    {
        "kernel": "_sum_squares",
        "grid": ["rows", "cdiv(N, BLOCK)"],
        "args": ["in0", "sums", "row_stride(in0)", "N"],
        "constexprs": {"BLOCK": "BLOCK"},
        "scratch": {"sums": {"shape": ["rows"], "dtype": "float32", "fill": 0.0}},
    },
    {
        "kernel": "_normalize",
        "grid": ["rows"],
        "args": ["in0", "in1", "out0", "sums", "row_stride(in0)", "N", "eps"],
        "constexprs": {"BLOCK": "BLOCK"},
        "num_warps": 4,
    },
]
'''

# Writes its scratch (filled with 2.5) to the output: shows every call fills it.
FILL_PROBE_FILE = '''\
import triton
import triton.language as tl


@triton.jit
def _copy(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offsets, tl.load(src_ptr + offsets, mask=offsets < n), mask=offsets < n)


LAUNCH = {
    "kernel": "_copy",
    "grid": ["cdiv(numel, 64)"],
    "args": ["fill", "out0", "numel"],
    "constexprs": {"BLOCK": 64},
    "scratch": {"fill": {"shape": ["rows", "N"], "dtype": "float32", "fill": 2.5}},
}
'''


def rmsnorm_spec(rows: int, n: int, dtype: str = "float32"):  # type: ignore[no-untyped-def]
    return get_op("rmsnorm").spec((rows, n), dtype)


# ---- launch expressions --------------------------------------------------------------------
TENSORS = {"in0": TensorInfo((6, 4, 10), (40, 10, 1)), "out0": TensorInfo((24, 10), (16, 1))}
NAMES = {"N": 10, "rows": 24, "BLOCK": 16, "num_warps": 4, "eps": 1e-6, "causal": True, "mode": "x"}


@pytest.mark.parametrize(
    "text, value",
    [
        ("cdiv(N, BLOCK)", 1),
        ("cdiv(rows * N, 7)", 35),
        ("next_power_of_two(N)", 16),
        ("next_power_of_two(1)", 1),
        ("min(BLOCK, N, 3)", 3),
        ("max(1, 2.5)", 2.5),
        ("abs(-3)", 3),
        ("size(in0, -1)", 10),
        ("size(in0, 0) * stride(in0, 0)", 240),
        ("numel(in0)", 240),
        ("ndim(in0)", 3),
        ("row_stride(in0)", 10),
        ("row_stride(out0)", 16),
        ("BLOCK // 3 + BLOCK % 3 - 2 ** 3", -2),
        ("N / 4", 2.5),
        ("-N", -10),
        ("1 if causal else 2", 1),
        ("num_warps == 1 or 32 * num_warps <= next_power_of_two(N)", False),
        ("1 < N <= 10 and not causal", False),
        ("mode == 'x'", True),
        ("None", None),
        ("eps", 1e-6),
        ("2 ** 64", 2**64),
    ],
)
def test_expressions_evaluate(text: str, value: object) -> None:
    assert launch_expr.evaluate(launch_expr.parse(text), NAMES, TENSORS) == value


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("open('x')", "unknown function 'open'"),
        ("N.bit_length()", "unknown function 'N.bit_length'"),
        ("x.y", "Attribute is not part of the grammar"),
        ("[1, 2]", "List is not part of the grammar"),
        ("{}", "Dict is not part of the grammar"),
        ("lambda: 1", "Lambda is not part of the grammar"),
        ("f'{N}'", "JoinedStr is not part of the grammar"),
        ("N[0]", "Subscript is not part of the grammar"),
        ("in0 + 1", "in0 is a tensor"),
        ("size(N, 0)", "must be a tensor"),
        ("cdiv(1)", "cdiv() takes 2 arguments, not 1"),
        ("min(a=1)", "positional arguments only"),
        ("_secret", "never start with '_'"),
        ("N << 2", "LShift is not allowed"),
        ("N in (1, 2)", "In is not allowed"),
        ("N +", "not an expression"),
        ("1" * 500, "longer than"),
        (b"x", "not an expression string"),
    ],
)
def test_expressions_that_do_not_parse(text: str, fragment: str) -> None:
    problems = launch_expr.check(text)  # type: ignore[arg-type]
    assert any(fragment in p for p in problems), problems
    with pytest.raises(LaunchExprError, match=re.escape(fragment)):
        launch_expr.parse(text)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("2 ** 100", "exponent of at most 64"),
        ("2 ** 10 ** 3", "exponent of at most 64"),
        ("(2 ** 40) * (2 ** 40)", "out of range"),
        ("1 // 0", "division by zero"),
        ("N % 0", "division by zero"),
        ("N / (BLOCK - 16)", "division by zero"),
        ("cdiv(N, 0)", "division by zero"),
        ("'x' * 1000000000", "takes numbers"),
        ("mode + 1", "takes numbers"),
        ("cdiv(N, 2.5)", "takes integers"),
        ("mode < 1", "cannot compare"),
        ("unknown_name + 1", "unknown name 'unknown_name'"),
        ("size(in0, 3)", "has 3 dimensions"),
        ("size(in1, 0)", "no tensor in1"),
        ("1.0e308 * 10.0 ** 10", "inf") ,
    ],
)
def test_expressions_that_fail_to_evaluate(text: str, fragment: str) -> None:
    expr = launch_expr.parse(text)
    if fragment == "inf":  # float overflow is inf in Python, not an error: it stays a float
        assert launch_expr.evaluate(expr, NAMES, TENSORS) == float("inf")
        return
    with pytest.raises(LaunchExprError, match=re.escape(fragment)) as raised:
        launch_expr.evaluate(expr, NAMES, TENSORS)
    assert text in str(raised.value)  # the message names the expression


def test_row_stride_refuses_leading_dimensions_that_do_not_flatten() -> None:
    expr = launch_expr.parse("row_stride(in0)")
    strided = {"in0": TensorInfo((4, 3, 8), (48, 8, 1))}  # a gap between the leading rows
    with pytest.raises(LaunchExprError, match="cannot be flattened"):
        launch_expr.evaluate(expr, {}, strided)
    assert launch_expr.evaluate(expr, {}, {"in0": TensorInfo((5,), (1,))}) == 5


# ---- the gate: files that pass -----------------------------------------------------------------
@pytest.mark.parametrize("source", [RMSNORM_FILE, SOFTMAX_FILE, TWO_LAUNCH_FILE, FILL_PROBE_FILE],
                         ids=["rmsnorm-doc", "softmax", "two-launch", "fill-probe"])
def test_good_files_pass_the_gate(source: str) -> None:
    assert check_kernel_file(source) == []


def test_parse_reads_the_file() -> None:
    kernel_file = parse_kernel_file(RMSNORM_FILE)
    assert kernel_file.config == Config(num_warps=4, EVICT_X="")
    assert kernel_file.kernels == ("_rmsnorm_row_kernel",)
    assert kernel_file.docstring.startswith("RMSNorm, one program per row")
    from kernelsmith.db import variant_source_hash

    assert kernel_file.source_hash == variant_source_hash(RMSNORM_FILE)
    with pytest.raises(AttributeError):
        kernel_file.source = "import os"  # type: ignore[misc]
    assert parse_kernel_file(TWO_LAUNCH_FILE).config is None


def test_space_comes_from_space_and_constraints() -> None:
    kernel_file = parse_kernel_file(RMSNORM_FILE)
    space = kernel_file.space(rmsnorm_spec(8, 100))  # next_power_of_two(N) = 128: 1, 2 or 4 warps
    assert {c["num_warps"] for c in space} == {1, 2, 4}
    assert len(space) == 6
    assert space.violations(Config(num_warps=8, EVICT_X="")) == [
        "num_warps == 1 or 32 * num_warps <= next_power_of_two(N)"
    ]
    wide = get_op("rmsnorm").spec((2, 70000), "float32")
    assert len(kernel_file.space(wide)) == 0  # "next_power_of_two(N) <= MAX_BLOCK_N" fails
    assert list(parse_kernel_file(FILL_PROBE_FILE).space(wide)) == [Config()]


# ---- the gate: files that fail, one rule at a time ------------------------------------------------
BASE = '''\
"""A base kernel file; tests insert one bad line at the marker."""

import triton
import triton.language as tl

MAX_BLOCK_N = 65536
HALF = tl.constexpr(0.5)
# TOP


@triton.jit
def _helper(x):
    return x * HALF


@triton.jit
def _kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + pid * N + cols, mask=cols < N, other=0.0)
    # BODY
    tl.store(y_ptr + pid * N + cols, _helper(x), mask=cols < N)


LAUNCH = {"kernel": "_kernel", "grid": ["rows"], "args": ["in0", "out0", "N"],
          "constexprs": {"BLOCK": "next_power_of_two(N)"}}
'''


def _with(marker: str, snippet: str) -> tuple[str, range]:
    """BASE with ``snippet`` in place of the marker comment, and the lines the snippet spans."""
    lines = BASE.splitlines()
    index = next(i for i, line in enumerate(lines) if line.strip() == f"# {marker}")
    indent = lines[index][: len(lines[index]) - len(lines[index].lstrip())]
    inserted = [indent + line for line in textwrap.dedent(snippet).splitlines()]
    lines[index : index + 1] = inserted
    return "\n".join(lines) + "\n", range(index + 1, index + 1 + len(inserted))


def _flagged(problems: list[str], lines: range, fragment: str, prefix: str = "") -> bool:
    """Whether a problem on one of ``lines`` mentions ``fragment``."""
    for problem in problems:
        found = re.match(r"line (\d+): (.*)", problem)
        if found and int(found.group(1)) in lines and found.group(2).startswith(prefix) and fragment in problem:
            return True
    return False


def test_the_base_file_passes() -> None:
    assert check_kernel_file(BASE) == []


TOP_LEVEL_CASES = {
    "import os": ("import os", "`import os` is not allowed"),
    "import from os": ("from os import path", "`from os import path` is not allowed"),
    "import torch": ("import torch", "`import torch` is not allowed"),
    "triton alias": ("import triton as t", "`import triton as t` is not allowed"),
    "relative import": ("from . import x", "`from . import x` is not allowed"),
    "future other": ("from __future__ import division", "is not allowed"),
    "class": ("class A:\n    pass", "a class at module level is not allowed"),
    "try": ("try:\n    X = 1\nexcept Exception:\n    X = 2", "try at module level"),
    "loop": ("for i in range(3):\n    pass", "a loop at module level"),
    "call": ("print('hi')", "an expression statement (a call?) at module level"),
    "global": ("global X", "global at module level"),
    "if": ("if True:\n    X = 1", "if at module level"),
    "non-literal constant": ("X = len('ab')", "`len('ab')` is not a literal"),
    "constant from a name": ("X = MAX_BLOCK_N", "`MAX_BLOCK_N` is not a literal"),
    "lower-case constant": ("x = 1", "not an upper-case name"),
    "constexpr of a call": ("X = tl.constexpr(len('a'))", "is not a literal"),
    "dict constant": ("X = {'a': 1}", "is not a literal"),
    "redefinition": ("MAX_BLOCK_N = 3", "defined twice"),
    "plain function": ("def build(spec, config):\n    return None", "function build has 0 decorators"),
    "autotune": ("@triton.autotune(configs=[], key=[])\ndef k(x):\n    pass", "@triton.autotune(configs=[], key=[])"),
    "heuristics": ("@triton.heuristics({})\ndef k(x):\n    pass", "is not allowed (kernelsmith does the tuning)"),
    "two decorators": ("@triton.jit\n@triton.jit\ndef k(x):\n    pass", "has 2 decorators"),
    "launch_metadata": ("@triton.jit(launch_metadata=None)\ndef k(x):\n    pass", "option launch_metadata"),
    "repr hook": ("@triton.jit(repr=None)\ndef k(x):\n    pass", "option repr is not allowed"),
    "jit option not literal": ("@triton.jit(debug=len)\ndef k(x):\n    pass", "option debug is not a literal"),
    "default not literal": ("@triton.jit\ndef k(x=len):\n    pass", "the default `len` is not a literal"),
    "annotation": ("@triton.jit\ndef k(x: int):\n    pass", "annotations are tl.constexpr or none"),
    "varargs": ("@triton.jit\ndef k(*xs):\n    pass", "*args or **kwargs"),
    "async": ("async def k():\n    pass", "an async function at module level"),
    "later string": ("'not a docstring'", "a string statement after the start"),
    "reserved name": ("range = 3", "range is a reserved name"),
    "SPACE not a dict": ("SPACE = [1, 2]", "SPACE is not a dict"),
    "SPACE choices": ("SPACE = {'BLOCK': 3}", "is not a non-empty list of literal choices"),
    "SPACE launch name": ("SPACE = {'N': [1]}", "hides a launch name"),
    "SPACE duplicate": ("SPACE = {'W': [1, 1]}", "lists a choice twice"),
    "SPACE non-literal": ("SPACE = {'W': [len]}", "SPACE: `len` is not a literal"),
    "CONFIG outside SPACE": ("SPACE = {'W': [1, 2]}\nCONFIG = {'W': 3}", "is not one of SPACE's"),
    "CONFIG extra": ("CONFIG = {'W': 3}", "CONFIG names ['W'] but SPACE has []"),
    "CONSTRAINTS function": ("CONSTRAINTS = ['open(N)']", "unknown function 'open'"),
    "CONSTRAINTS not strings": ("CONSTRAINTS = [1]", "not a list of expression strings"),
    "CONSTRAINTS tensor": ("CONSTRAINTS = ['in0 > 1']", "in0 is a tensor"),
}


@pytest.mark.parametrize("name", list(TOP_LEVEL_CASES))
def test_top_level_rules(name: str) -> None:
    snippet, fragment = TOP_LEVEL_CASES[name]
    source, lines = _with("TOP", snippet)
    problems = check_kernel_file(source)
    assert _flagged(problems, lines, fragment), problems
    assert all("; " in p for p in problems)  # every line says what is allowed


BODY_CASES = {
    # reaching out of the language
    "handle": ("h = x.handle", "the attribute 'handle' is not allowed"),
    "dunder dict": ("d = tl.core.__dict__", "the attribute '__dict__' is not allowed"),
    "tl.core": ("d = tl.core.tensor", "tl.core is not a public member"),
    "range self": ("r = range.__self__", "the attribute '__self__' is not allowed"),
    "class of tuple": ("c = ().__class__", "the attribute '__class__' is not allowed"),
    "subclasses": ("c = x.dtype.__class__.__subclasses__()", "'__class__' is not allowed"),
    "open": ("f = open('/etc/passwd')", "unknown name 'open'"),
    "getattr": ("h = getattr(x, 'handle')", "unknown name 'getattr'"),
    "import builtin": ("os = __import__('os')", "the name '__import__' is not allowed"),
    "eval": ("y = eval('1')", "unknown name 'eval'"),
    "numpy from the interpreter": ("z = np.zeros(3)", "unknown name 'np'"),
    "globals": ("g = globals()", "unknown name 'globals'"),
    "private tl": ("s = tl._semantic", "the attribute '_semantic' is not allowed"),
    "not exported": ("t = tl.str_to_ty('fp32')", "tl.str_to_ty is not a public member"),
    "missing member": ("t = tl.no_such_thing(x)", "tl.no_such_thing is not a public member"),
    "extra module": ("t = tl.extra.hip.libdevice.exp(x)", "tl.extra.hip is a module outside"),
    "libdevice core": ("t = tl.extra.cuda.libdevice.core", "is a module outside the kernel namespaces"),
    "namespace alone": ("m = tl.math", "`tl.math` on its own"),
    "tl alone": ("m = tl", "`tl` on its own"),
    "triton runtime": ("k = triton.knobs", "triton.knobs is not allowed"),
    "value attribute": ("y = x.tolist()", ".tolist is not a public member"),
    "kernel attribute": ("f = _helper.fn", "attributes of _helper"),
    "kernel launch": ("_helper[(1,)](x)", "launching _helper[...] from a kernel"),
    # denied members
    "inline asm": ("y = tl.inline_asm_elementwise('mov', '=r,r', [x], tl.int32, True, 1)", "inline_asm"),
    "globaltimer": ("t = tl.extra.cuda.globaltimer()", "'globaltimer' is not allowed"),
    "smid": ("t = tl.extra.cuda.smid()", "'smid' is not allowed"),
    "clock": ("t = tl.clock()", "'clock' is not allowed"),
    "device_print": ("tl.device_print('x', x)", "'device_print' is not allowed"),
    "static_print": ("tl.static_print(x)", "'static_print' is not allowed"),
    # names
    "plain constant": ("y = x * MAX_BLOCK_N", "MAX_BLOCK_N is read in a kernel body but is not a tl.constexpr"),
    "data name": ("s = SPACE", "unknown name 'SPACE'"),
    "private local": ("_y = x", "the local name '_y' is not allowed"),
    "local hides tl": ("tl = 3", "the local name 'tl' is not allowed"),
    "local hides a constant": ("HALF = 1", "the local name 'HALF' is not allowed"),
    "calling a local": ("y = pid(3)", "calling pid"),
    # statements and expressions
    "lambda": ("f = lambda v: v", "a lambda is not allowed"),
    "comprehension": ("ys = [v for v in range(3)]", "a comprehension is not allowed"),
    "generator": ("s = sum(v for v in range(3))", "unknown name 'sum'"),
    "f-string": ("s = f'{pid}'", "an f-string is not allowed"),
    "walrus": ("y = (z := x)", "`:=` is not allowed"),
    "dict": ("d = {'a': 1}", "a dict is not allowed"),
    "starred": ("y = tl.maximum(*x)", "`*` unpacking in a call"),
    "kwargs": ("y = tl.maximum(**x)", "`**` unpacking in a call"),
    "with": ("with x:\n    pass", "with is not allowed in a kernel body"),
    "try": ("try:\n    y = x\nexcept Exception:\n    y = x", "try is not allowed"),
    "import": ("import os", "import is not allowed"),
    "global": ("global HALF", "global is not allowed"),
    "del": ("del x", "del is not allowed"),
    "assert": ("assert N > 0", "assert (use tl.device_assert"),
    "raise": ("raise ValueError('x')", "raise is not allowed"),
    "nested def": ("def inner():\n    pass", "a nested function is not allowed"),
    "class": ("class C:\n    pass", "a class is not allowed"),
    "attribute assignment": ("x.dtype = 1", "assignment to `x.dtype`"),
    "subscript assignment": ("x[0] = 1", "assignment to `x[0]`"),
    "loop over a list": ("for v in [1, 2]:\n    pass", "a loop over `[1, 2]`"),
    "loop else": ("for v in range(2):\n    pass\nelse:\n    pass", "a loop with an else branch"),
    "bytes": ("b = b'x'", "the literal b'x'"),
}


@pytest.mark.parametrize("name", list(BODY_CASES))
def test_kernel_body_rules(name: str) -> None:
    snippet, fragment = BODY_CASES[name]
    source, lines = _with("BODY", snippet)
    problems = check_kernel_file(source)
    assert _flagged(problems, lines, fragment, prefix="in _kernel: "), problems


LAUNCH_CASES = {
    "no launch": ("LAUNCH", None, "the file has no LAUNCH"),
    "unknown kernel": ('"kernel": "_kernel"', '"kernel": "os"', "LAUNCH kernel 'os' is not a @triton.jit function"),
    "helper arity": ('"kernel": "_kernel"', '"kernel": "_helper"', "_helper passes 3 args, but it takes 1"),
    "too few args": ('["in0", "out0", "N"]', '["in0", "out0"]', "passes 2 args, but it takes 3"),
    "unknown constexpr": ('{"BLOCK": "next_power_of_two(N)"}', '{"BLOCK": "N", "X": 1}', "no tl.constexpr parameter X"),
    "missing constexpr": ('"constexprs": {"BLOCK": "next_power_of_two(N)"}', '"constexprs": {}',
                          "gives no value for its tl.constexpr BLOCK"),
    "bad grid": ('["rows"]', '["rows", "N", "1", "2"]', "is not a list of 1 to 3 expressions"),
    "grid function": ('["rows"]', '["os.getpid()"]', "unknown function 'os.getpid'"),
    "grid tensor": ('["rows"]', '["in0"]', "the tensor in0 is not a number"),
    "unknown key": ('"grid":', '"hook": "x", "grid":', "unknown LAUNCH keys ['hook']"),
    "not a dict": ("LAUNCH = {", "LAUNCH = 3 or {", "LAUNCH: `3 or"),
    "later scratch": ("LAUNCH = {", 'LAUNCH = [{"kernel": "_helper", "grid": [1], "args": ["in0"]}, {"scratch": {}, ',
                      "scratch is declared in a later launch"),
    "scratch dtype": ('"grid":', '"scratch": {"s": {"shape": ["rows"], "dtype": "complex64"}}, "grid":',
                      "has dtype 'complex64'"),
    "scratch name": ('"grid":', '"scratch": {"N": {"shape": ["rows"]}}, "grid":', "scratch name 'N' is not a free"),
    "scratch fill": ('"grid":', '"scratch": {"s": {"shape": [1], "fill": "x"}}, "grid":', "has fill 'x'"),
}


@pytest.mark.parametrize("name", list(LAUNCH_CASES))
def test_launch_rules(name: str) -> None:
    old, new, fragment = LAUNCH_CASES[name]
    if new is None:
        source = BASE[: BASE.index("LAUNCH = ")]
    else:
        assert BASE.count(old) == 1
        source = BASE.replace(old, new)
        if name == "later scratch":
            source = source.rstrip().rstrip("}") + "}}]\n"
    problems = check_kernel_file(source)
    assert any(fragment in p for p in problems), problems


def test_syntax_errors_are_one_problem() -> None:
    assert check_kernel_file("def (:\n") == ["line 1: syntax error: invalid syntax; a kernel file is Python syntax"]


def test_a_python_module_candidate_is_told_what_is_allowed() -> None:
    module = "import torch\n\ndef build(spec, config):\n    return lambda inputs, outputs: None\n"
    problems = check_kernel_file(module)
    assert problems[0].startswith("line 1: `import torch` is not allowed; the imports are `import triton`")
    assert any("function build has 0 decorators; exactly one decorator, @triton.jit" in p for p in problems)
    assert any("no LAUNCH" in p for p in problems)
    with pytest.raises(KernelFileError) as raised:
        parse_kernel_file(module)
    assert raised.value.problems == problems


# ---- loading and launching in the interpreter --------------------------------------------------------
def _check(kernel_file: KernelFile, op_name: str, rows: int, n: int, device: str) -> None:
    op = get_op(op_name)
    spec = op.spec((rows, n), "float32")
    configs = kernel_file.space(spec).configs()
    assert configs, f"no config for {spec.describe()}"
    for config in (configs[0], configs[-1]):
        launcher = kernel_file.build(spec, config)
        inputs = op.make_inputs(spec, seed=rows * 1000 + n, distribution=op.distributions[0], device=device)
        outputs = [torch.full(t.shape, float("nan"), dtype=t.torch_dtype, device=device)
                   for t in op.output_specs(spec)]
        launcher(inputs, outputs)
        for out, ref64, lowp in zip(outputs, op.reference_fp64(spec, inputs), op.reference(spec, inputs),
                                    strict=True):
            assert check_close(out, ref64, lowp, op.tolerance) is None, (spec.describe(), config)


SHAPES = [(rows, n) for rows in (1, 3, 17) for n in (1, 7, 33, 1000)]


@pytest.fixture(scope="module")
def loaded() -> dict[str, KernelFile]:
    return {"rmsnorm": parse_kernel_file(RMSNORM_FILE), "softmax": parse_kernel_file(SOFTMAX_FILE),
            "two_launch": parse_kernel_file(TWO_LAUNCH_FILE)}


@pytest.mark.parametrize("rows, n", SHAPES)
def test_rmsnorm_file_runs_in_the_interpreter(loaded: dict[str, KernelFile], rows: int, n: int, device: str) -> None:
    _check(loaded["rmsnorm"], "rmsnorm", rows, n, device)


@pytest.mark.parametrize("rows, n", SHAPES)
def test_softmax_file_runs_in_the_interpreter(loaded: dict[str, KernelFile], rows: int, n: int, device: str) -> None:
    _check(loaded["softmax"], "softmax", rows, n, device)


@pytest.mark.parametrize("rows, n", [(1, 7), (3, 33), (17, 300)])
def test_two_launches_with_scratch(loaded: dict[str, KernelFile], rows: int, n: int, device: str) -> None:
    _check(loaded["two_launch"], "rmsnorm", rows, n, device)


def test_scratch_is_filled_on_every_call(device: str) -> None:
    kernel_file = parse_kernel_file(FILL_PROBE_FILE)
    spec = rmsnorm_spec(3, 70)
    launcher = kernel_file.build(spec, Config())
    x, w = get_op("rmsnorm").make_inputs(spec, 0, "normal", device)
    for _ in range(2):
        out = torch.zeros(3, 70, device=device)
        launcher([x, w], [out])
        assert torch.equal(out, torch.full((3, 70), 2.5, device=device))


def test_build_errors_name_the_expression() -> None:
    source = BASE.replace('"grid": ["rows"]', '"grid": ["cdiv(rows, N - N)"]')
    kernel_file = parse_kernel_file(source)
    with pytest.raises(KernelFileError, match=r"'cdiv\(rows, N - N\)': division by zero"):
        kernel_file.build(rmsnorm_spec(4, 8), Config())
    bad_input = parse_kernel_file(BASE.replace('"args": ["in0", "out0", "N"]', '"args": ["in0", "out3", "N"]'))
    with pytest.raises(KernelFileError, match="the op has 2 inputs and 1 outputs"):
        bad_input.build(rmsnorm_spec(4, 8), Config())
    clash = parse_kernel_file(BASE.replace("MAX_BLOCK_N = 65536", "EPS = 1.0").replace("# TOP", ""))
    assert clash.names(rmsnorm_spec(4, 8))["EPS"] == 1.0
    with pytest.raises(KernelFileError, match="'eps' is both"):
        parse_kernel_file(BASE.replace("MAX_BLOCK_N = 65536", "X = 1")).names(rmsnorm_spec(4, 8), {"eps": 1})


# ---- what a body can reach, with and without the gate ------------------------------------------
def test_the_namespace_has_only_the_restricted_builtins(device: str) -> None:
    table = restricted_builtins()
    assert set(table) == {"range", "min", "max", "float", "int", "bool", "len", "isinstance", "__import__"}
    namespace = load_namespace(RMSNORM_FILE, "builtins-probe")
    kernel = namespace["_rmsnorm_row_kernel"]
    function = getattr(kernel, "fn", kernel)  # the Python function under Triton's wrapper
    assert function.__globals__ is namespace
    # The interpreter adds its own module globals to the function's (numpy, inspect: what the gate
    # keeps bodies from naming) but leaves the builtins as they are.
    x = torch.ones(2, 8, device=device)
    y = torch.empty_like(x)
    kernel[(2,)](x, x[0], y, 8, 8, 8, 1e-6, BLOCK_N=8, EVICT_X="")
    assert torch.allclose(y, torch.ones_like(y), atol=1e-5)
    assert namespace["__builtins__"] == table


@pytest.mark.parametrize(
    "name, fromlist",
    [("os", ()), ("sys", ()), ("triton", ("knobs",)), ("triton.runtime", ()), ("__future__", ("barry_as_FLUFL",))],
)
def test_the_restricted_import_hands_back_only_triton(name: str, fromlist: tuple[str, ...]) -> None:
    with pytest.raises(ImportError, match="a kernel file cannot import"):
        _restricted_import(name, None, None, fromlist, 0)
    import triton

    assert _restricted_import("triton", None, None, ("language",), 0) is triton


@pytest.mark.parametrize(
    "body, error",
    [
        ("import os", "cannot import 'os'"),
        ("X = open('/etc/passwd')", "name 'open' is not defined"),
        ("X = getattr(int, 'mro')", "name 'getattr' is not defined"),
        ("X = __import__('os')", "cannot import 'os'"),
        ("from triton import knobs", "cannot import 'triton'"),
        ("class A:\n    pass", "__build_class__ not found"),
    ],
)
def test_bypassing_the_gate_still_gives_no_way_out_at_module_level(body: str, error: str) -> None:
    source = f"import triton\nimport triton.language as tl\n{body}\n"
    assert check_kernel_file(source)  # the gate refuses it...
    with pytest.raises((ImportError, NameError), match=re.escape(error)):
        load_namespace(source, f"bypass-{abs(hash(body))}")  # ...and the namespace refuses it too


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter runs bodies as Python")
def test_bypassing_the_gate_in_a_kernel_body_gives_no_import() -> None:
    """A body that calls ``__import__`` (refused by the gate) run anyway by the interpreter:
    the namespace's ``__import__`` is the restricted one, so os is out of reach."""
    source, _ = _with("BODY", "os = __import__('os')")
    assert check_kernel_file(source)
    namespace = load_namespace(source, "bypass-body-import")
    x = torch.ones(8)
    with pytest.raises(Exception, match="cannot import 'os'"):
        namespace["_kernel"][(1,)](x, torch.empty(8), 8, BLOCK=8)


# ---- end to end through the evaluator -------------------------------------------------------
def test_the_evaluator_accepts_a_kernel_file_and_refuses_a_python_module() -> None:
    spec = rmsnorm_spec(4, 64)
    kernel_file = parse_kernel_file(RMSNORM_FILE)
    config = kernel_file.space(spec).configs()[0]
    module = (
        "import torch\n\n\ndef build(spec, config):\n"
        "    def launch(inputs, outputs):\n        outputs[0].copy_(inputs[0])\n    return launch\n"
    )
    candidates = [Candidate("doc_rmsnorm", config, RMSNORM_FILE), Candidate("module", Config(), module)]
    with Evaluator("interpreter", workers=1, timeout_s=300) as evaluator:
        good, bad = evaluator.evaluate(spec, candidates, measure=False)
    assert good.status == "ok", good.error
    assert good.source_hash == kernel_file.source_hash
    assert bad.status == "cheat"
    assert bad.error.startswith("kernel file: line 1: `import torch` is not allowed; the imports are")
    assert "exactly one decorator, @triton.jit" in bad.error
