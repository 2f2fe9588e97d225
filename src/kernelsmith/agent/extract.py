"""Turn a built-in kernel variant into a self-contained candidate module a person can edit.

A built-in variant (:class:`~kernelsmith.ops.Variant`) lives in its op family's module beside the
family's reference, input generators and the other variants. The coding-agent workspace wants
*one* readable file holding just the code that variant runs, in the form the evaluation worker
loads from source (``build(spec, config)``, optionally ``space(spec)``; see
:func:`kernelsmith.evaluate.worker._load_source`).

:func:`variant_source` cuts that file out of the family's module by reading its syntax tree:

1. start from the variant's ``build`` and ``space`` functions (they must be top-level functions
   of the family's module);
2. follow every global name they load (kernels, ``@triton.jit`` helpers, constants, other
   helpers) until nothing new is reached; a name imported from another kernelsmith module that
   candidates may not import (a backward family reusing its forward's helpers) is followed into
   that module and inlined;
3. emit the statements reached, module by module (inlined modules first) in their original
   order and with their own text (comments directly above a statement come along), behind only
   the imports they use;
4. bind ``build`` and ``space`` to the variant's functions, and check the result with the same
   static gate the worker applies (:func:`kernelsmith.evaluate.static_gate.check_source`).

Anything it cannot do cleanly raises :class:`ExtractionError` instead of guessing: functions made
by factories or closures, names bound by module-level ``if``/``for``/``try`` blocks, helpers
renamed on import from another kernelsmith module, decorated classes (a dataclass needs its
module in ``sys.modules``, where the worker does not put candidates), code the gate rejects (a
helper asking ``torch.cuda`` for the multiprocessor count, say). The caller then falls back to a
hand-written template (:mod:`kernelsmith.agent.templates`).

Nothing here imports or runs the code it extracts beyond what importing the op family already
did: the source text is read with :mod:`inspect` and parsed with :mod:`ast`.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import logging
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kernelsmith.evaluate.static_gate import ALLOWED_IMPORTS, check_source
from kernelsmith.ops import OpFamily

log = logging.getLogger(__name__)

# Names the workspace module binds itself: a reached statement must not bind them too.
ENTRY_POINTS = ("build", "space", "CONFIG")


class ExtractionError(Exception):
    """A variant cannot be cut out of its module cleanly; the message says why."""


@dataclass
class _Module:
    """A parsed module: its text and which top-level statement binds each name."""

    name: str
    text: str
    tree: ast.Module
    bindings: dict[str, int] = field(default_factory=dict)  # name -> index in tree.body

    @classmethod
    def load(cls, name: str) -> _Module:
        try:
            text = inspect.getsource(importlib.import_module(name))
        except (OSError, TypeError, ImportError) as exc:
            raise ExtractionError(f"cannot read the source of {name}: {exc}") from exc
        tree = ast.parse(text)
        module = cls(name, text, tree)
        for index, node in enumerate(tree.body):
            for bound in _bound_names(node):
                module.bindings[bound] = index
        return module

    def segment(self, index: int) -> str:
        """A statement's own text, decorators and the comment lines directly above it included."""
        node = self.tree.body[index]
        lines = self.text.splitlines(keepends=True)
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        start = first - 1
        while start > 0 and lines[start - 1].lstrip().startswith("#"):
            start -= 1
        return "".join(lines[start : node.end_lineno or node.lineno]).rstrip() + "\n"


def _bound_names(node: ast.stmt) -> tuple[str, ...]:
    """Names a top-level statement binds in the module namespace."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return (node.name,)
    if isinstance(node, ast.Import):
        return tuple(a.asname or a.name.split(".")[0] for a in node.names)
    if isinstance(node, ast.ImportFrom):
        return tuple(a.asname or a.name for a in node.names)
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, ast.AnnAssign | ast.AugAssign):
        targets = [node.target]
    else:  # if/for/while/with/try...: every name stored anywhere inside
        return tuple(n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
    return tuple(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))


def _loaded_names(node: ast.AST) -> set[str]:
    """Every name a statement loads (locals included: only those that are globals matter)."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store)}


def _inlined_module(node: ast.ImportFrom) -> bool:
    """Whether names imported by ``node`` are followed into their module rather than imported:
    kernelsmith modules a candidate may not import (other op families)."""
    module = node.module or ""
    return not node.level and module.startswith("kernelsmith.") and module not in ALLOWED_IMPORTS


def _top_level_function(module: str, fn: Callable[..., Any], role: str) -> str:
    name = getattr(fn, "__name__", "")
    if getattr(fn, "__module__", None) != module or getattr(importlib.import_module(module), name, None) is not fn:
        raise ExtractionError(
            f"the variant's {role} function {getattr(fn, '__qualname__', fn)!r} is not a top-level "
            f"function of {module} (made by a factory or a closure)"
        )
    return name


class _Gatherer:
    """Follows global names from the entry points through one or more modules."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.modules: dict[str, _Module] = {}
        self.statements: dict[tuple[str, int], set[str]] = {}  # (module, index) -> names wanted
        self.defined: dict[str, tuple[str, int]] = {}  # name -> the statement emitted for it
        self.rank: dict[str, int] = {}  # modules a module inlines from are emitted before it

    def module(self, name: str) -> _Module:
        if name not in self.modules:
            self.modules[name] = _Module.load(name)
        return self.modules[name]

    def follow(self, module_name: str, roots: list[str]) -> None:
        self.rank.setdefault(module_name, 0)
        todo = [(module_name, name) for name in roots]
        while todo:
            where, name = todo.pop()
            module = self.module(where)
            index = module.bindings.get(name)
            if index is None:
                continue  # a local or a builtin
            node = module.tree.body[index]
            if isinstance(node, ast.ImportFrom) and _inlined_module(node):
                alias = next(a for a in node.names if (a.asname or a.name) == name)
                if alias.asname and alias.asname != alias.name:
                    raise ExtractionError(f"{self.label}: {name!r} renames {node.module}.{alias.name} on import")
                target = str(node.module)
                self.rank[target] = max(self.rank.get(target, 0), self.rank[where] + 1)
                todo.append((target, alias.name))
                continue
            if (where, index) in self.statements and name in self.statements[where, index]:
                continue
            if not isinstance(node, ast.Import | ast.ImportFrom):
                if not isinstance(node, ast.FunctionDef | ast.ClassDef | ast.Assign | ast.AnnAssign):
                    raise ExtractionError(
                        f"{self.label}: {name!r} is bound by a module-level {type(node).__name__} block "
                        f"in {where}, which is not extracted"
                    )
                if isinstance(node, ast.ClassDef) and node.decorator_list:
                    # A dataclass looks its module up in sys.modules, where the worker does not
                    # register candidate modules: such a class would not even import.
                    raise ExtractionError(
                        f"{self.label}: {name!r} is a decorated class (a dataclass?), which the evaluation "
                        "worker cannot load from candidate source"
                    )
                earlier = self.defined.setdefault(name, (where, index))
                if earlier != (where, index) and self.module(earlier[0]).segment(earlier[1]) != module.segment(index):
                    raise ExtractionError(f"{self.label}: {name!r} is defined differently in {earlier[0]} and {where}")
                todo.extend((where, loaded) for loaded in _loaded_names(node))
            self.statements.setdefault((where, index), set()).add(name)

    def imports(self) -> list[str]:
        """One line per import the reached code needs, in order of first appearance."""
        lines = ["from __future__ import annotations\n\n"]
        bound: dict[str, str] = {}  # name -> the import that binds it
        for (where, index), names in self._ordered():
            node = self.module(where).tree.body[index]
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                continue
            for alias in node.names:
                name = alias.asname or (alias.name.split(".")[0] if isinstance(node, ast.Import) else alias.name)
                if name not in names:
                    continue
                if isinstance(node, ast.Import):
                    line = f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")
                else:
                    line = f"from {'.' * node.level}{node.module or ''} import {alias.name}" + (
                        f" as {alias.asname}" if alias.asname else "")
                if bound.setdefault(name, line) != line:
                    raise ExtractionError(f"{self.label}: {name!r} is imported differently in two modules")
        return lines + _sorted_imports(bound.values())

    def _ordered(self) -> list[tuple[tuple[str, int], set[str]]]:
        return sorted(self.statements.items(), key=lambda item: (-self.rank[item[0][0]], item[0][1]))

    def body(self) -> str:
        """The reached statements: two blank lines around definitions, none between constants
        (one before a constant with its own comment)."""
        text = ""
        previous_definition = True
        for (where, index), _ in self._ordered():
            node = self.module(where).tree.body[index]
            if isinstance(node, ast.Import | ast.ImportFrom):
                continue
            segment = self.module(where).segment(index)
            definition = isinstance(node, ast.FunctionDef | ast.ClassDef)
            if definition or previous_definition:
                text += "\n\n"
            elif segment.startswith("#"):
                text += "\n"
            text += segment
            previous_definition = definition
        return text


def _by_type(name: str) -> tuple[int, str]:
    """isort's order of imported names: CONSTANTS, then Classes, then functions."""
    return (0 if name.isupper() and len(name) > 1 else 1 if name[0].isupper() else 2, name)


def _sorted_imports(lines: Iterable[str]) -> list[str]:
    """Import lines in isort's layout: standard library, third party, kernelsmith; plain
    imports before from-imports; one from-import statement per module."""
    sections: list[dict[str, list[str]]] = [{}, {}, {}]
    for line in lines:
        head, _, name = line.partition(" import ")
        module = head.split()[1]
        top = module.split(".")[0]
        group = 0 if top in sys.stdlib_module_names else 2 if top == "kernelsmith" else 1
        names = sections[group].setdefault(head if head.startswith("from ") else line, [])
        if head.startswith("from "):
            names.append(name)
    out: list[str] = []
    for section in sections:
        if not section:
            continue
        plain = sorted(k for k in section if not k.startswith("from "))
        froms = sorted(k for k in section if k.startswith("from "))
        out += [f"{k}\n" for k in plain]
        for head in froms:
            out.append(f"{head} import {', '.join(sorted(section[head], key=_by_type))}\n")
        out.append("\n")
    return out


def variant_source(family: OpFamily, variant_name: str, header: str = "") -> str:
    """A self-contained candidate module for ``family``'s built-in variant ``variant_name``.

    The module defines the variant's kernels and helpers, ``space`` and ``build``; the caller
    appends the ``CONFIG`` to evaluate. ``header`` (a docstring's text) goes on top. Raises
    :class:`ExtractionError` when the variant cannot be cut out cleanly (see the module docstring).

    >>> from kernelsmith.ops import get_op
    >>> text = variant_source(get_op("rmsnorm"), "whole_row")
    >>> "def _whole_row_build(" in text and "\\nbuild = _whole_row_build\\n" in text
    True
    """
    label = f"{family.name}/{variant_name}"
    variant = family.variant(variant_name)
    module_name = getattr(variant.build, "__module__", None)
    if not module_name:
        raise ExtractionError(f"{label}: the module of its build function is unknown")
    build_name = _top_level_function(module_name, variant.build, "build")
    space_name = _top_level_function(module_name, variant.space, "space")
    gatherer = _Gatherer(label)
    gatherer.follow(module_name, [build_name, space_name])
    clashes = sorted(set(gatherer.defined) & set(ENTRY_POINTS))
    if clashes:
        raise ExtractionError(f"{label}: its code already binds {clashes}")

    parts = ['"""' + header.strip() + '\n"""\n\n'] if header else []
    body = gatherer.body().lstrip("\n")
    after_imports = "\n\n\n" if body.startswith(("def ", "@", "class ")) else "\n\n"
    parts.append("".join(gatherer.imports()).rstrip() + after_imports + body)
    parts.append(
        "\n\n# ---- what the harness calls " + "-" * 66 + "\n"
        f"space = {space_name}\n"
        f"build = {build_name}\n"
    )
    source = "".join(parts)
    problems = _unresolved(source) + check_source(source)
    if problems:
        raise ExtractionError(f"{label}: the extracted module does not pass: " + "; ".join(problems[:4]))
    log.debug("extracted %s from %s (%d lines)", label, ", ".join(gatherer.modules), source.count("\n"))
    return source


def _unresolved(source: str) -> list[str]:
    """Global names the module loads but never binds (a missed dependency), as problems."""
    tree = ast.parse(source)
    bound = {name for node in tree.body for name in _bound_names(node)} | set(dir(builtins))
    local: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            if not isinstance(node, ast.Lambda):
                local.add(node.name)
            args = node.args
            local.update(a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs))
            local.update(a.arg for a in (args.vararg, args.kwarg) if a is not None)
        elif isinstance(node, ast.ClassDef):
            local.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            local.add(node.id)
    missing = sorted(_loaded_names(tree) - bound - local)
    return [f"name {name!r} is used but not defined" for name in missing]
