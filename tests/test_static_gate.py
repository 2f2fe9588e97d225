"""The gate over candidate source (:mod:`kernelsmith.evaluate.static_gate`): a kernel file, or nothing.

Every untrusted kernel is a kernel file (docs/kernel-files.md). ``static_gate.check_source`` is
the kernel-file gate its callers (the worker, ``agent bench``, the ``llm`` strategy) apply
before anything of the text runs. Each construct outside the grammar is rejected with a line
that names it and says what is allowed; the kernel files the package itself ships (the agent
templates, the prompt's example, the planted controls) pass. Constructs the old Python gate
missed (frames, aliases of torch, re-exports through allowed modules, ``getattr`` with a string)
stay here as regression tests: none of them can even be written in a kernel file.
"""

from __future__ import annotations

import textwrap

import pytest

from kernelsmith.agent.templates import OPS, template_source
from kernelsmith.evaluate import static_gate
from kernelsmith.evaluate.kernel_file import ALLOWED_IMPORTS, check_kernel_file
from kernelsmith.strategies.llm import KERNEL_EXAMPLE
from kernelsmith.testing.bad_kernels import source

HEAD = "import triton\nimport triton.language as tl\n\n\n"
LAUNCH = '\n\nLAUNCH = {"kernel": "k", "grid": ["rows"], "args": ["in0", "N"], "constexprs": {"BLOCK": "16"}}\n'


def problems(text: str) -> list[str]:
    return static_gate.check_source(textwrap.dedent(text))


def in_body(statements: str) -> str:
    """A kernel file whose only kernel runs ``statements`` (and is launched)."""
    body = textwrap.indent(textwrap.dedent(statements), "    ")
    kernel = "@triton.jit\ndef k(x_ptr, N, BLOCK: tl.constexpr):\n" + body
    return HEAD + kernel + LAUNCH


# (test id, source, a fragment some problem must contain)
FORBIDDEN: list[tuple[str, str, str]] = [
    # imports: Triton only
    ("import_os", "import os", "`import os` is not allowed"),
    ("import_sys", "import sys", "`import sys` is not allowed"),
    ("import_torch", "import torch", "`import torch` is not allowed"),
    ("import_threading", "import threading", "`import threading` is not allowed"),
    ("import_harness", "from kernelsmith.evaluate import validate", "is not allowed"),
    ("import_from_triton_runtime", "from triton import runtime", "`from triton import runtime` is not allowed"),
    ("relative_import", "from . import helper", "is not allowed"),
    # no host code at module level
    ("host_function", HEAD + "def helper():\n    return 1\n", "function helper has 0 decorators"),
    ("class", HEAD + "class A:\n    pass\n", "a class at module level is not allowed"),
    ("top_level_loop", HEAD + "for i in range(3):\n    pass\n", "a loop at module level is not allowed"),
    ("top_level_call", HEAD + "print('hi')\n", "at module level is not allowed"),
    ("top_level_try", HEAD + "try:\n    X = 1\nexcept Exception:\n    X = 2\n", "try at module level is not allowed"),
    ("computed_constant", HEAD + "X = 1 + 2\n", "is not a literal"),
    ("lower_case_constant", HEAD + "x = 1\n", "is not an upper-case name"),
    ("autotune", HEAD + "@triton.autotune(configs=[], key=[])\n@triton.jit\ndef k(x_ptr):\n    pass\n",
     "function k has 2 decorators"),
    ("launch_metadata_hook", HEAD + "@triton.jit(launch_metadata=None)\ndef k(x_ptr):\n    pass\n",
     "option launch_metadata is not allowed"),
    ("no_launch", HEAD + "@triton.jit\ndef k(x_ptr):\n    pass\n", "the file has no LAUNCH"),
    ("launch_of_an_unknown_kernel", HEAD + 'LAUNCH = {"kernel": "nope", "grid": ["1"], "args": []}\n',
     "is not a @triton.jit function of this file"),
    ("launch_expression_calls_python", HEAD + "@triton.jit\ndef k(x_ptr):\n    pass\n\n\n"
     'LAUNCH = {"kernel": "k", "grid": ["__import__(\'os\')"], "args": ["in0"]}\n', "unknown function '__import__'"),
    # inside @triton.jit bodies: Triton, and nothing that reaches out of it
    ("device_clock", in_body("t = tl.extra.cuda.globaltimer()"), "'globaltimer' is not allowed"),
    ("device_cycle_counter", in_body("t = tl.clock()"), "'clock' is not allowed"),
    ("multiprocessor_id", in_body("s = tl.extra.cuda.smid()"), "'smid' is not allowed"),
    ("inline_asm", in_body("y = tl.inline_asm_elementwise('mov.b32 $0, $1;', '=r,r', [N], dtype=tl.int32, "
                           "is_pure=True, pack=1)"), "'inline_asm_elementwise' is not allowed"),
    ("device_print", in_body("tl.device_print('x', N)"), "'device_print' is not allowed"),
    ("interpreter_storage", in_body("h = x_ptr.handle"), "'handle' is not allowed"),
    ("dunder_class", in_body("c = x_ptr.__class__"), "never start with _"),
    ("private_member", in_body("c = tl._x"), "never start with _"),
    ("lambda", in_body("f = lambda a: a"), "a lambda is not allowed"),
    ("comprehension", in_body("xs = [i for i in range(3)]"), "a comprehension is not allowed"),
    ("nested_function", in_body("def g():\n    pass"), "a nested function is not allowed"),
    ("with", in_body("with N:\n    pass"), "with is not allowed"),
    ("f_string", in_body("s = f'{N}'"), "an f-string is not allowed"),
    ("getattr_with_a_string", in_body("g = getattr(tl, 'load')"), "unknown name 'getattr'"),
    ("globals", in_body("g = globals()"), "unknown name 'globals'"),
    ("interpreter_numpy_global", in_body("a = np.zeros(3)"), "unknown name 'np'"),
    ("import_in_a_body", in_body("import os"), "import is not allowed in a kernel body"),
    ("global_in_a_body", in_body("global STATE"), "global is not allowed in a kernel body"),
    ("try_in_a_body", in_body("try:\n    pass\nexcept Exception:\n    pass"), "try is not allowed in a kernel body"),
    # not Python at all
    ("syntax_error", "def f(:\n    pass", "syntax error"),
]


@pytest.mark.parametrize(("text", "fragment"), [(t, f) for _, t, f in FORBIDDEN], ids=[i for i, _, _ in FORBIDDEN])
def test_forbidden_construct_is_rejected_with_a_line_naming_it(text: str, fragment: str) -> None:
    found = problems(text)
    assert any(fragment in p for p in found), found
    assert all(p.startswith("line ") for p in found), found


def test_problems_name_their_line_and_what_is_allowed() -> None:
    found = problems(HEAD + "import os\n")
    assert found[0].startswith("line 5: `import os` is not allowed; the imports are `import triton`")


def test_every_problem_is_reported() -> None:
    found = problems(in_body("""
        t = tl.clock()
        h = x_ptr.handle
        f = lambda a: a
        """).replace("import triton\n", "import triton\nimport os\n", 1))
    for fragment in ("`import os`", "'clock'", "'handle'", "a lambda"):
        assert any(fragment in p for p in found), (fragment, found)


def test_check_source_is_the_kernel_file_gate() -> None:
    """One gate: the worker, agent bench and the llm strategy all apply the same function."""
    assert static_gate.ALLOWED_IMPORTS == ALLOWED_IMPORTS == {"__future__", "triton", "triton.language"}
    for text in (source("correct_rmsnorm"), source("forges_reply"), in_body("t = tl.clock()")):
        assert static_gate.check_source(text) == check_kernel_file(text)


# ---- legitimate kernel files pass --------------------------------------------------------------------
ALLOWED: list[tuple[str, str]] = [
    ("future_import_and_alias", "from __future__ import annotations\n\nfrom triton import language as tl\n"
     "import triton\n\n\n@triton.jit\ndef k(x_ptr, N, BLOCK: tl.constexpr):\n    pass\n" + LAUNCH),
    ("device_loops_and_branches", in_body("""
        acc = tl.zeros([BLOCK], tl.float32)
        for start in tl.range(0, N, BLOCK, num_stages=2):
            offs = start + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + offs, mask=offs < N, other=0.0).to(tl.float32)
        i = 0
        while i < 2:
            i += 1
        if N > 0:
            tl.store(x_ptr + tl.arange(0, BLOCK), acc.to(x_ptr.dtype.element_ty), mask=tl.arange(0, BLOCK) < N)
        """)),
    ("constexpr_constant_and_helper", HEAD + "SCALE = tl.constexpr(2.0)\n\n\n@triton.jit\ndef _twice(v):\n"
     "    return v * SCALE\n\n\n@triton.jit\ndef k(x_ptr, N, BLOCK: tl.constexpr):\n"
     "    offs = tl.arange(0, BLOCK)\n    x = tl.load(x_ptr + offs, mask=offs < N)\n"
     "    tl.store(x_ptr + offs, _twice(x), mask=offs < N)\n" + LAUNCH),
    ("bitcasts_and_math", in_body("""
        x = tl.load(x_ptr).to(tl.float32)
        bits = x.to(tl.uint32, bitcast=True)
        y = tl.math.rsqrt(tl.abs(x) + 1.0) + tl.extra.cuda.libdevice.tanh(x) * 0.0
        tl.store(x_ptr, (bits.to(tl.float32, bitcast=True) * y).to(x_ptr.dtype.element_ty))
        """)),
    ("an_endless_device_loop_is_the_timeout's_business", in_body("spin = 1\nwhile spin > 0:\n    spin = spin * 1")),
]


@pytest.mark.parametrize("text", [t for _, t in ALLOWED], ids=[i for i, _ in ALLOWED])
def test_legitimate_kernel_files_pass(text: str) -> None:
    assert problems(text) == []


@pytest.mark.parametrize("op", OPS)
def test_the_agent_templates_pass(op: str) -> None:
    text = template_source(op)
    assert text is not None and problems(text) == []


def test_the_llm_prompts_example_passes() -> None:
    assert problems(KERNEL_EXAMPLE) == []


# ---- former gaps of the Python gate --------------------------------------------------------------
# Each of these once passed the old gate (a list of forbidden names over Python); in a kernel file
# none is expressible. tests/test_harness_rules.py shows the planted modules built on them.
GAPS: list[tuple[str, str]] = [
    ("torch_under_an_alias", "import torch as T\n"),
    ("torch_function_imported_by_name", "from torch import softmax\n"),
    ("home_made_jit_decorator_hides_host_code", HEAD + "def jit(fn):\n    return fn\n\n\n@jit\ndef launch(inputs):\n"
     "    return inputs\n"),
    ("frame_introspection_through_a_generator", HEAD + "def frames():\n    box = yield\n"
     "    yield box[0].gi_frame.f_back.f_globals\n"),
    ("forbidden_module_re_exported_by_an_allowed_one", "from dataclasses import inspect\n"),
    ("kernelsmith_module_re_exports_os", "from kernelsmith.ops._launch import os\n"),
    ("frames_from_a_kernel_body", in_body("f = x_ptr.gi_frame")),
    ("code_object_swap", in_body("c = k.__code__")),
]


@pytest.mark.parametrize("text", [t for _, t in GAPS], ids=[i for i, _ in GAPS])
def test_known_gate_gaps_are_rejected(text: str) -> None:
    assert problems(text) != []
