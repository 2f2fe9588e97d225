"""The static gate over candidate source (:mod:`kernelsmith.evaluate.static_gate`).

Each forbidden construct is rejected with a message that names it; legitimate kernel modules
(the planted controls, the package's own kernels and launchers) pass. Constructs the gate is
once missed (found by the planted kernels) stay here as regression tests.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from types import ModuleType

import pytest

import kernelsmith.ops.rmsnorm
import kernelsmith.ops.softmax
from kernelsmith.evaluate.static_gate import check_source
from kernelsmith.testing.bad_kernels import source


def problems(text: str) -> list[str]:
    return check_source(textwrap.dedent(text))


# (test id, source, a fragment some problem must contain)
FORBIDDEN: list[tuple[str, str, str]] = [
    # imports: no threads, processes, files, sockets, timers, harness modules
    ("import_os", "import os", "import of 'os'"),
    ("import_sys", "import sys", "import of 'sys'"),
    ("import_threading", "import threading", "import of 'threading'"),
    ("import_subprocess", "import subprocess", "import of 'subprocess'"),
    ("import_ctypes", "import ctypes", "import of 'ctypes'"),
    ("import_time", "import time", "import of 'time'"),
    ("import_importlib", "import importlib", "import of 'importlib'"),
    ("import_socket", "import socket", "import of 'socket'"),
    ("import_harness", "import kernelsmith.evaluate.errors", "kernelsmith.evaluate.errors"),
    ("import_from_os", "from os import path", "import from 'os'"),
    ("import_from_harness", "from kernelsmith.evaluate import validate",
     "import from 'kernelsmith.evaluate'"),
    ("relative_import", "from . import helper", "is not allowed"),
    ("star_import", "from triton.language import *", "star imports"),
    # no silent fallbacks, no state outside the launcher
    ("try_except", """
        try:
            x = 1
        except Exception:
            x = 2
        """, "try/except"),
    ("global", """
        def f():
            global CACHE
        """, "global state"),
    ("nonlocal", """
        def f():
            n = 0
            def g():
                nonlocal n
        """, "nonlocal state"),
    # dynamic code and introspection
    ("eval", "eval('1')", "'eval'"),
    ("exec", "exec('x = 1')", "'exec'"),
    ("compile", "compile('1', 'f', 'eval')", "'compile'"),
    ("open", "open('/etc/passwd')", "'open'"),
    ("dunder_import", "__import__('os')", "'__import__'"),
    ("globals", "globals()", "'globals'"),
    ("vars", "vars()", "'vars'"),
    ("getattr", "getattr(object, 'x')", "'getattr'"),
    ("setattr", "setattr(object, 'x', 1)", "'setattr'"),
    ("builtins", "__builtins__", "'__builtins__'"),
    ("dunder_dict", "x = object.__dict__", "'__dict__'"),
    ("dunder_class", "x = (1).__class__", "'__class__'"),
    ("dunder_globals", "x = (lambda: 0).__globals__", "'__globals__'"),
    ("dunder_subclasses", "x = object.__subclasses__()", "'__subclasses__'"),
    ("dunder_inside_kernel", """
        import triton
        @triton.jit
        def k(x):
            y = x.__class__
        """, "'__class__'"),
    # storage addresses (caching by address, rule 5)
    ("data_ptr", "def f(x):\n    return x.data_ptr()", "'data_ptr'"),
    ("untyped_storage", "def f(x):\n    return x.untyped_storage()", "'untyped_storage'"),
    # streams, events, synchronization, timers (rule 6)
    ("stream", "def f(torch_like):\n    return torch_like.cuda.Stream()", "'Stream'"),
    ("synchronize", "def f(device):\n    device.synchronize()", "'synchronize'"),
    ("event_record", "def f(event):\n    event.record()", "'record'"),
    ("sleep", "def f(clock):\n    clock.sleep(1)", "'sleep'"),
    # PyTorch computing instead of the kernel (rule 7)
    ("torch_softmax", "import torch\ny = torch.softmax", "torch.softmax is not allowed"),
    ("torch_empty", "import torch\ny = torch.empty(3)", "torch.empty is not allowed"),
    ("torch_cuda", "import torch\nn = torch.cuda.device_count()", "torch.cuda is not allowed"),
    ("torch_ops", "import torch\nop = torch.ops.aten.softmax", "torch.ops is not allowed"),
    ("torch_C", "import torch\nc = torch._C", "torch._C is not allowed"),
    ("copy_", "def f(out, y):\n    out.copy_(y)", "'copy_'"),
    ("clone", "def f(x):\n    return x.clone()", "'clone'"),
    ("fill_", "def f(out):\n    out.fill_(0)", "'fill_'"),
    ("to_dtype_on_host", "def f(x, dt):\n    return x.to(dt)", "'to'"),
    ("half_on_host", "def f(x):\n    return x.half()", "'half'"),
    ("item", "def f(x):\n    return x.item()", "'item'"),
    # monkey-patching the harness or PyTorch (rule 10)
    ("patch_torch", "import torch\ntorch.equal = lambda a, b: True", "module attribute (torch.equal)"),
    ("patch_triton", "import triton\ntriton.jit = lambda f: f", "module attribute (triton.jit)"),
    ("patch_tl_alias", "import triton.language as tl\ntl.load = None", "module attribute (tl.load)"),
    ("patch_augmented", "import math\nmath.pi += 1", "module attribute (math.pi)"),
    ("patch_imported_name", "from kernelsmith.space import Space\nSpace.configs = None",
     "module attribute (Space.configs)"),
    # not Python at all
    ("syntax_error", "def f(:\n    pass", "syntax error"),
]


@pytest.mark.parametrize(("text", "fragment"), [(t, f) for _, t, f in FORBIDDEN],
                         ids=[i for i, _, _ in FORBIDDEN])
def test_forbidden_construct_is_rejected(text: str, fragment: str) -> None:
    found = problems(text)
    assert any(fragment in p for p in found), found


def test_problems_name_their_line() -> None:
    found = problems("import triton\n\n\nimport os\n")
    assert found == ["line 4: import of 'os' is not allowed"]


def test_every_problem_is_reported() -> None:
    found = problems("""
        import os
        import threading
        def f(x, out):
            out.copy_(x)
            return x.data_ptr()
        """)
    assert len(found) == 4
    for fragment in ("'os'", "'threading'", "'copy_'", "'data_ptr'"):
        assert any(fragment in p for p in found), (fragment, found)


# ---- legitimate code passes ----------------------------------------------------------------------
ALLOWED: list[tuple[str, str]] = [
    ("empty_module", ""),
    ("triton_imports", "import triton\nimport triton.language as tl\nfrom triton import cdiv"),
    ("helpers", """
        from __future__ import annotations
        import functools
        import math
        from collections.abc import Sequence
        from dataclasses import dataclass
        from typing import Any
        from kernelsmith.ops._base import Launcher
        from kernelsmith.space import Config, Constraint, Param, Space, next_power_of_two
        from kernelsmith.spec import OpSpec
        """),
    ("launcher_views_and_strides", """
        import torch
        def launch(inputs, outputs):
            x = inputs[0].view(-1, inputs[0].shape[-1])
            y = outputs[0].reshape(x.shape)
            scratch = x.new_empty(x.shape)
            return x.stride(0), y.numel(), x.dtype == torch.float32, scratch.device
        """),
    ("kernel_body_casts", """
        import triton
        import triton.language as tl
        @triton.jit
        def k(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
            cols = tl.arange(0, BLOCK)
            x = tl.load(x_ptr + cols, mask=cols < N).to(tl.float32)
            tl.store(y_ptr + cols, x.to(y_ptr.dtype.element_ty), mask=cols < N)
        """),
    ("autotuned_kernel", """
        import triton
        import triton.language as tl
        @triton.autotune(configs=[triton.Config({"BLOCK": 64})], key=["N"])
        @triton.jit
        def k(x_ptr, N, BLOCK: tl.constexpr):
            cols = tl.arange(0, BLOCK)
            tl.store(x_ptr + cols, tl.load(x_ptr + cols, mask=cols < N).to(tl.float32),
                     mask=cols < N)
        """),
    ("local_state_in_closures", """
        def build(spec, config):
            grid = (spec,)
            def launch(inputs, outputs):
                return grid
            return launch
        """),
    ("an_endless_loop_is_the_timeout's_business", "while True:\n    pass"),
]


@pytest.mark.parametrize("text", [t for _, t in ALLOWED], ids=[i for i, _ in ALLOWED])
def test_legitimate_code_passes(text: str) -> None:
    assert problems(text) == []


@pytest.mark.parametrize("name", ["correct_rmsnorm", "correct_softmax", "writes_zeros",
                                  "reads_output", "replaces_output", "swaps_output_data"])
def test_planted_kernels_that_only_the_run_time_checks_can_stop_pass_the_gate(name: str) -> None:
    """The controls pass; so do wrong kernels and cheats that look like ordinary code. The gate
    is a first line only: these are stopped at run time (tests/test_harness_rules.py)."""
    assert check_source(source(name)) == []


@pytest.mark.parametrize("name", ["caches_by_data_ptr", "background_thread", "torch_softmax",
                                  "torch_fallback", "lazy_subclass", "tampers_check_close",
                                  "tampers_torch_equal", "exits", "segfaults", "side_stream"])
def test_planted_cheats_are_stopped_by_the_gate(name: str) -> None:
    assert check_source(source(name)) != []


# Functions of the op modules that ask the device for its multiprocessor count (torch.cuda):
# host code that an outside candidate may not contain.
DEVICE_QUERIES = {"_multiprocessor_count", "_programs"}


def kernels_and_launchers(module: ModuleType) -> str:
    """The part of an op module that an outside candidate would contain: its imports, kernels,
    spaces, launchers and their helpers (without the op family class, whose reference math and
    input generation are PyTorch by design, and without device queries)."""
    tree = ast.parse(inspect.getsource(module))
    kept = [node for node in tree.body
            if isinstance(node, ast.Import | ast.ImportFrom)
            or (isinstance(node, ast.FunctionDef) and node.name not in DEVICE_QUERIES)]
    assert any(isinstance(n, ast.FunctionDef) and n.name.endswith("_build") for n in kept)
    return ast.unparse(ast.Module(body=kept, type_ignores=[]))


@pytest.mark.parametrize("module", [kernelsmith.ops.rmsnorm, kernelsmith.ops.softmax],
                         ids=["rmsnorm", "softmax"])
def test_builtin_kernels_and_launchers_pass_the_gate(module: ModuleType) -> None:
    """The package's own kernels would be accepted as candidates. (The whole op modules are
    not: their reference implementations and input generators call torch by design, and their
    persistent variants query torch.cuda for the multiprocessor count.)"""
    assert check_source(kernels_and_launchers(module)) == []


# ---- former gaps -----------------------------------------------------------------------------------
# Each of these once passed the gate; tests/test_harness_rules.py shows, with the planted kernel
# rewrites_harness_globals, how frame introspection got a wrong kernel accepted.
GAPS: list[tuple[str, str]] = [
    ("torch_under_an_alias", """
        import torch as T
        def launch(inputs, outputs):
            return T.softmax(inputs[0], -1)
        """),
    ("torch_function_imported_by_name", """
        from torch import softmax
        def launch(inputs, outputs):
            return softmax(inputs[0], -1)
        """),
    ("home_made_jit_decorator_hides_host_code", """
        def jit(fn):
            return fn
        @jit
        def launch(inputs, outputs):
            outputs[0].copy_(inputs[0])
            return inputs[0].data_ptr()
        """),
    ("frame_introspection_through_a_generator", """
        def frames():
            box = yield
            yield box[0].gi_frame.f_back.f_globals
        """),
    ("forbidden_module_re_exported_by_an_allowed_one", """
        from dataclasses import inspect
        frame = inspect.currentframe()
        """),
]


@pytest.mark.parametrize("text", [t for _, t in GAPS], ids=[i for i, _ in GAPS])
def test_known_gate_gaps_are_rejected(text: str) -> None:
    assert problems(text) != []


@pytest.mark.parametrize("text", [
    "import torch\nDTYPES = (torch.float16, torch.bfloat16, torch.float32)",
    "import torch\nimport triton.language as tl\nTL = {torch.bfloat16: tl.bfloat16}",
    "import torch\nDOUBLE = torch.double",
], ids=["torch_bfloat16", "tl_bfloat16", "torch_double"])
def test_dtype_names_on_the_host_pass(text: str) -> None:
    assert problems(text) == []
