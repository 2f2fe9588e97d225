"""Every variant's source hash covers every kernelsmith module whose jitted code its kernels run.

A stored decision is served only while its variant's source hash is unchanged. The hash covers the
module the variant's build lives in and the modules it names (``Variant.modules``); a kernel that
calls a ``@triton.jit`` helper of another module (``_to_storage`` of ``add_rmsnorm``, the row
helpers of a skeleton...) runs that module's code too, so an edit there must change the hash, or
a decision measured on the old code would be served for the new.

The walk: from every ``@triton.jit`` function of the build's module and of the modules the
variant names (a skeleton's build launches the family's kernels, which live in a module of
``Variant.modules``), follow the names each one's code uses (``fn.__code__.co_names``) into its
globals (``fn.__globals__``), directly or as an attribute of an imported module
(``skeleton.helper``), to the jitted functions they are, recursively; each kernelsmith module
defining one of them must be covered. A hash covers whole modules, so the rule is at that grain:
the covered modules are closed under "its jitted code calls jitted code of" (a module covered for
one helper brings what its other functions call; covering more costs only a re-measurement).

The gaps this test found when it was written (add_rmsnorm's kernels calling RMSNorm's row math,
matmul's epilogues calling the elementwise activations, the linear + cross-entropy tiles calling
matmul's helpers) are covered now: the test admits none.
"""

from __future__ import annotations

import inspect
import sys
import types
from typing import Any

import pytest

from kernelsmith.ops import get_op, op_names


def _is_jitted(obj: Any) -> bool:
    """A ``@triton.jit`` function, compiled (JITFunction) or interpreted (InterpretedFunction)."""
    return hasattr(obj, "arg_names") and inspect.isfunction(getattr(obj, "fn", None))


def _called(fn: Any) -> list[Any]:
    """The jitted functions the code of jitted ``fn`` names, directly or through a module."""
    code, scope = fn.fn.__code__, fn.fn.__globals__
    found = []
    for name in code.co_names:
        value = scope.get(name)
        if isinstance(value, types.ModuleType):
            found += [getattr(value, attr) for attr in code.co_names if _is_jitted(getattr(value, attr, None))]
        elif _is_jitted(value):
            found.append(value)
    return found


def reached_modules(*modules: types.ModuleType) -> set[str]:
    """The kernelsmith modules defining a jitted function reachable from ``modules``' own."""
    pending = [obj for module in modules for obj in vars(module).values() if _is_jitted(obj)]
    seen: set[int] = set()
    modules: set[str] = set()
    while pending:
        fn = pending.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        if fn.fn.__module__.startswith("kernelsmith"):
            modules.add(fn.fn.__module__)
        pending += _called(fn)
    return modules


def uncovered_modules(op: str, variant_name: str) -> set[str]:
    """The modules whose jitted code the variant runs and its source hash does not cover."""
    variant = next(v for v in get_op(op).variants if v.name == variant_name)
    build_module = inspect.getmodule(variant.build)
    assert build_module is not None
    named = [sys.modules[name] for name in variant.modules]
    return reached_modules(build_module, *named) - {build_module.__name__, *variant.modules}


VARIANTS = [(op, variant.name) for op in op_names() for variant in get_op(op).variants]


@pytest.mark.parametrize(("op", "variant_name"), VARIANTS, ids=[f"{op}-{v}" for op, v in VARIANTS])
def test_the_source_hash_covers_every_module_whose_jitted_code_the_variant_runs(op: str, variant_name: str) -> None:
    uncovered = uncovered_modules(op, variant_name)
    assert not uncovered, (f"{op}.{variant_name}: its kernels run jitted code of {sorted(uncovered)}, which its "
                           "source hash does not cover (add them to Variant.modules)")  # fmt: skip


def test_the_walk_follows_jitted_helpers_into_other_modules() -> None:
    """The walk sees calls across modules (were it blind to them, the test above could not fail):
    add_rmsnorm_backward's kernels store through add_rmsnorm's ``_to_storage`` and call
    rmsnorm_backward's row math, which addresses rows through the backward skeleton's helpers."""
    reached = reached_modules(sys.modules["kernelsmith.ops.add_rmsnorm_backward"])
    assert {"kernelsmith.ops.add_rmsnorm", "kernelsmith.ops.rmsnorm_backward",
            "kernelsmith.ops._rowwise_backward"} <= reached
