"""A static gate over candidate kernel source, applied before the source is ever imported.

Source proposed from outside the package (an LLM, a coding agent, a test's planted kernel) may
only *launch Triton kernels*. The gate rejects, by reading the syntax tree, the known ways a
kernel module cheats a benchmark harness (DESIGN.md rules 6, 7 and 10):

- imports other than triton, math, typing and kernelsmith's space/op helpers (no threads, no
  processes, no files, no sockets, no timers);
- ``try``/``except`` (a silent fallback to PyTorch when the kernel fails), ``global`` state;
- calls of ``torch`` functions (doing the work with PyTorch instead of the kernel) and of tensor
  methods that compute, copy or expose storage addresses outside ``@triton.jit`` bodies;
- any mention of streams, events, synchronization, timers, threads, ``data_ptr`` or the
  interpreter's introspection (``__dict__``, ``globals()``, ``setattr``...), and assignments to
  attributes of imported modules (monkey-patching the harness or PyTorch).

The gate is a first line; the worker repeats the important checks at run time (torch ops seen
by a dispatch mode, thread counts, harness integrity), so a construct the gate misses is still
caught when it acts.
"""

from __future__ import annotations

import ast
import importlib
import types

ALLOWED_IMPORTS = frozenset(
    {
        "__future__",
        "math",
        "typing",
        "collections.abc",
        "dataclasses",
        "functools",
        "triton",
        "triton.language",
        "torch",
        "kernelsmith.space",
        "kernelsmith.ops._base",
        "kernelsmith.ops._launch",  # direct_launch: Triton's own launch, minus the per-call binding
        "kernelsmith.spec",
    }
)

FORBIDDEN_NAMES = frozenset(
    {
        "eval",
        "exec",
        "compile",
        "open",
        "__import__",
        "globals",
        "locals",
        "vars",
        "setattr",
        "delattr",
        "getattr",
        "input",
        "breakpoint",
        "memoryview",
        "__builtins__",
        "sys",
        "os",
        "threading",
        "multiprocessing",
        "subprocess",
        "socket",
        "time",
        "ctypes",
        "importlib",
    }
)

FORBIDDEN_ATTRIBUTES = frozenset(
    {
        # streams, events, synchronization and timers
        "Stream",
        "stream",
        "current_stream",
        "Event",
        "synchronize",
        "record",
        "elapsed_time",
        "wait_stream",
        "perf_counter",
        "time",
        "sleep",
        # storage addresses and caching by address
        "data_ptr",
        "untyped_storage",
        "storage",
        "_cdata",
        # introspection and monkey-patching
        "__dict__",
        "__class__",
        "__globals__",
        "__code__",
        "__subclasses__",
        "__builtins__",
        "__setattr__",
        "__getattribute__",
        "modules",
        "_getframe",
        # torch compute, copies and dtype changes done on the host side instead of in the kernel
        "copy_",
        "clone",
        "fill_",
        "zero_",
        "to",
        "float",
        "half",
        "bfloat16",
        "double",
        "contiguous",
        "cpu",
        "cuda",
        "numpy",
        "item",
        "tolist",
        "detach",
        "requires_grad_",
        "backward",
    }
)

# Tensor/config methods a launcher legitimately calls outside @triton.jit functions.
ALLOWED_TORCH_ATTRIBUTES = frozenset(
    {
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "int8",
        "int16",
        "int32",
        "int64",
        "bool",
        "dtype",
        "Tensor",
        "Size",
        "device",
    }
)


# Reaching into frames, code objects or the import system is never needed to launch a kernel,
# inside a kernel or outside: it is how a candidate would rebind the harness's own names.
INTROSPECTION_ATTRIBUTES = frozenset(
    {
        "f_back",
        "f_globals",
        "f_locals",
        "f_builtins",
        "f_code",
        "gi_frame",
        "gi_code",
        "cr_frame",
        "ag_frame",
        "tb_frame",
        "tb_next",
        "currentframe",
        "import_module",
        "settrace",
        "setprofile",
    }
)

DTYPE_NAMES = frozenset(
    {
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "float",
        "half",
        "double",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "bool",
        "int1",
        "float8e4nv",
        "float8e5",
    }
)


class _Gate(ast.NodeVisitor):
    def __init__(self, tree: ast.Module) -> None:
        self.problems: list[str] = []
        self._jit_depth = 0
        # Names bound by imports, resolved before the walk so that uses anywhere are judged.
        self.module_names: set[str] = set()
        self.torch_names: set[str] = set()  # import torch [as T]
        self.triton_names: set[str] = set()  # import triton [as t]
        self.language_names: set[str] = set()  # import triton.language as tl / from triton import language
        self.jit_names: set[str] = set()  # from triton import jit [as j]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    bound = a.asname or a.name.split(".")[0]
                    self.module_names.add(bound)
                    if a.name == "torch":
                        self.torch_names.add(bound)
                    elif a.name == "triton":
                        self.triton_names.add(bound)
                    elif a.name == "triton.language":
                        self.language_names.add(a.asname or "triton")
            elif isinstance(node, ast.ImportFrom):
                for a in node.names:
                    bound = a.asname or a.name
                    self.module_names.add(bound)
                    if node.module == "triton" and a.name == "language":
                        self.language_names.add(bound)
                    if node.module == "triton" and a.name in ("jit", "autotune", "heuristics"):
                        self.jit_names.add(bound)

    def _flag(self, node: ast.AST, message: str) -> None:
        self.problems.append(f"line {getattr(node, 'lineno', '?')}: {message}")

    # imports ------------------------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name not in ALLOWED_IMPORTS:
                self._flag(node, f"import of {alias.name!r} is not allowed")
            self.module_names.add((alias.asname or alias.name).split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level or module not in ALLOWED_IMPORTS:
            self._flag(node, f"import from {node.module!r} is not allowed")
            return
        for alias in node.names:
            if alias.name == "*":
                self._flag(node, "star imports are not allowed")
            elif module == "torch" and alias.name not in ALLOWED_TORCH_ATTRIBUTES:
                self._flag(node, f"torch.{alias.name} is not allowed: compute in the Triton kernel")
            elif _is_module(module, alias.name) and f"{module}.{alias.name}" not in ALLOWED_IMPORTS:
                # An allowed module re-exporting another (dataclasses.inspect, say) is no way in.
                self._flag(node, f"import of module {module}.{alias.name} is not allowed")

    # statements ---------------------------------------------------------------------------
    def visit_Try(self, node: ast.Try) -> None:
        self._flag(node, "try/except is not allowed (no silent fallbacks)")
        self.generic_visit(node)

    visit_TryStar = visit_Try  # type: ignore[assignment]

    def visit_Global(self, node: ast.Global) -> None:
        self._flag(node, "global state is not allowed")

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        self._flag(node, "nonlocal state is not allowed")

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        is_jit = any(self._is_triton_decorator(d) for d in node.decorator_list)
        self._jit_depth += is_jit
        self.generic_visit(node)
        self._jit_depth -= is_jit

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def _check_target(self, target: ast.expr) -> None:
        if isinstance(target, ast.Attribute) and _root_name(target) in self.module_names:
            self._flag(target, f"assignment to a module attribute ({ast.unparse(target)})")

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._check_target(target)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_target(node.target)
        self.generic_visit(node)

    # expressions --------------------------------------------------------------------------
    def visit_Name(self, node: ast.Name) -> None:
        if node.id in FORBIDDEN_NAMES:
            self._flag(node, f"use of {node.id!r} is not allowed")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        inside_kernel = self._jit_depth > 0
        base = node.value.id if isinstance(node.value, ast.Name) else ""
        is_dtype = base in self.torch_names | self.language_names and node.attr in DTYPE_NAMES
        host_only = node.attr in FORBIDDEN_ATTRIBUTES and not inside_kernel and not is_dtype
        if node.attr.startswith("__") or node.attr in INTROSPECTION_ATTRIBUTES or host_only:
            self._flag(node, f"use of attribute {node.attr!r} is not allowed")
        if base in self.torch_names and node.attr not in ALLOWED_TORCH_ATTRIBUTES | DTYPE_NAMES:
            self._flag(node, f"torch.{node.attr} is not allowed: compute in the Triton kernel")
        self.generic_visit(node)

    def _is_triton_decorator(self, node: ast.expr) -> bool:
        """Only Triton's own decorators mark a kernel body (a home-made ``jit`` does not)."""
        target = node.func if isinstance(node, ast.Call) else node
        if isinstance(target, ast.Name):
            return target.id in self.jit_names
        return (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id in self.triton_names
            and target.attr in ("jit", "autotune", "heuristics")
        )


def _root_name(node: ast.expr) -> str:
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Call):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


def _is_module(module: str, name: str) -> bool:
    """Whether ``from module import name`` binds a module (``module`` is on the allowlist)."""
    try:
        value = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return False
    return isinstance(value, types.ModuleType)


def check_source(source: str) -> list[str]:
    """Problems found in candidate source (empty when it passes the gate).

    >>> check_source("import os")
    ["line 1: import of 'os' is not allowed"]
    >>> check_source("import triton\\n")
    []
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return [f"syntax error: {exc}"]
    gate = _Gate(tree)
    gate.visit(tree)
    return gate.problems
