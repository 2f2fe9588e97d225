"""Rewriting a copy of the graph with the kept sites, and timing graphs in context.

Step 3 of the ``kernelsmith`` torch.compile backend (:mod:`kernelsmith.frontends.backend`): each
kept site becomes one ``kernelsmith::kernel`` (``kernelsmith::triton_kernel``, or
``kernelsmith::kernel_mutating`` for a family that writes its inputs) call in a copy
of the graph, with example values for the nodes it adds. :func:`time_graphs` times compiled
graphs on the same inputs in alternating rounds, for the backend's ``compare`` option and the
whole-model decode step.
"""

from __future__ import annotations

import functools
import logging
import operator
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from kernelsmith import dispatch
from kernelsmith.frontends import triton_ops
from kernelsmith.frontends._backend_sites import Site, _layout_problem, _value
from kernelsmith.ops import get_op

log = logging.getLogger("kernelsmith.frontends.backend")  # this code's logger in backend.py


_KERNEL = torch.ops.kernelsmith.kernel.default
_KERNEL_MUTATING = torch.ops.kernelsmith.kernel_mutating.default
# ---------------------------------------------------------------------------------------------
# Rewriting a copy of the graph
# ---------------------------------------------------------------------------------------------


def rewrite(gm: fx.GraphModule, sites: Sequence[Site]) -> fx.GraphModule:
    """A copy of ``gm`` in which every site is one ``kernelsmith::kernel`` call (``gm`` itself is
    left as it was, for Inductor alone or for a comparison)."""
    graph = fx.Graph(tracer_cls=gm.graph._tracer_cls)
    val_map: dict[fx.Node, fx.Node] = {}
    copied = graph.graph_copy(gm.graph, val_map, return_output_node=True)
    assert isinstance(copied, tuple)
    output_value, old_output = copied
    graph._codegen = gm.graph._codegen
    graph.output(output_value, type_expr=getattr(old_output, "type", None))
    fake_mode = _fake_mode(gm)
    for site in sites:
        _rewrite_site(graph, site, val_map, fake_mode)
    _erase_dead_prologues(graph, sites, val_map)
    graph.lint()
    return fx.GraphModule(gm, graph, class_name=type(gm).__name__)


def _erase_dead_prologues(graph: fx.Graph, sites: Sequence[Site], val_map: dict[fx.Node, fx.Node]) -> None:
    """The nodes of an RMSNorm that projections recompute in their prologue, erased once nothing
    reads them (a projection left to the original code still does, and keeps them)."""
    erased: set[fx.Node] = set()
    for site in sites:
        for node in reversed(site.prologue):  # outputs first, so an erased user frees its inputs
            copy = val_map[node]
            if copy not in erased and not copy.users:
                graph.erase_node(copy)
                erased.add(copy)


def _fake_mode(gm: fx.GraphModule) -> Any:
    for node in gm.graph.nodes:
        mode = getattr(_value(node), "fake_mode", None)
        if mode is not None:
            return mode
    return None


def _site_args(graph: fx.Graph, site: Site, val_map: dict[fx.Node, fx.Node], fake_mode: Any) -> list[fx.Node]:
    """The kernel's arguments, inserted at the graph's insertion point: each input's node, or its
    derived value or reshape."""
    args: list[fx.Node] = []
    for op_input in site.inputs:
        node = val_map[op_input.node]
        if op_input.derive is not None:
            source, extra = _value(node), op_input.derive_args
            node = graph.call_function(op_input.derive, (node, *extra))
            _set_value(node, fake_mode, functools.partial(op_input.derive, source, *extra))
        elif op_input.reshape is not None:
            source, shape = _value(node), op_input.reshape
            node = graph.call_method("reshape", (node, shape))
            _set_value(node, fake_mode, functools.partial(torch.reshape, source, shape))
        args.append(node)
    return args


def _rewrite_site(graph: fx.Graph, site: Site, val_map: dict[fx.Node, fx.Node], fake_mode: Any) -> None:
    if site.slices:
        _rewrite_sliced_site(graph, site, val_map, fake_mode)
        return
    out = val_map[site.output]
    region = [val_map[n] for n in site.region]
    add = val_map[site.residual_add] if site.residual_add is not None else None
    if add is None:
        before = out
    else:  # right after the op's last input: the sum's other users may come before the norm
        order = {n: i for i, n in enumerate(graph.nodes)}
        last = max((val_map[i.node] for i in site.inputs), key=order.__getitem__)
        before = last.next
    constants = dispatch.constants_json(site.constants)
    with graph.inserting_before(before):
        args = _site_args(graph, site, val_map, fake_mode)
        target, call_args = _kernel_call(site, args, constants)
        kernel = graph.call_function(target, call_args)
        if target is _KERNEL_MUTATING:  # its one output is the call itself (no list)
            results = [kernel]
        else:
            results = [graph.call_function(operator.getitem, (kernel, i)) for i in range(2 if add is not None else 1)]
        # A RoPE site's kernel writes the projection's (B, S, H * D) rows; the graph read the
        # rotated heads through .view(B, S, H, D).transpose(1, 2): the same view and transpose here.
        added = list(dict.fromkeys([kernel, *results]))
        if site.output_view is not None:
            heads = graph.call_method("view", (results[0], site.output_view))
            added += [heads, graph.call_method("transpose", (heads, 1, 2))]
    for node in added:
        for key in ("stack_trace", "nn_module_stack", "source_fn_stack"):
            if key in out.meta:
                node.meta[key] = out.meta[key]
    # map_arg maps the nodes only: the op's name, constants and decisions stay the strings they are
    _set_value(kernel, fake_mode, lambda: target(*fx.node.map_arg(call_args, _value)))
    for i, node in enumerate(results):
        if kernel.meta.get("example_value") is not None and node is not kernel:
            node.meta["example_value"] = kernel.meta["example_value"][i]
    if site.output_view is not None:
        heads, transposed = added[-2:]
        _set_value(heads, fake_mode, lambda: _value(results[0]).view(site.output_view))
        _set_value(transposed, fake_mode, lambda: _value(heads).transpose(1, 2))
        problem = _layout_problem(_value(transposed), _value(out))
        if not problem and isinstance(_value(out), torch.Tensor) and _value(transposed) is None:
            problem = "no example value for the kernel's viewed output, so its layout cannot be checked"
        if problem:  # the site finder checks this: a site that gets here anyway is left as the graph had it
            _leave_to_original(graph, site, args, val_map, added, problem)
            return
        results[0] = transposed
    out.replace_all_uses_with(results[0])
    val_map[site.output] = results[0]  # a later site may take this value as an input
    for node in reversed(region):
        graph.erase_node(node)
    if add is not None:
        assert site.residual_add is not None
        add.replace_all_uses_with(results[1])
        val_map[site.residual_add] = results[1]
        graph.erase_node(add)


def _rewrite_sliced_site(graph: fx.Graph, site: Site, val_map: dict[fx.Node, fx.Node], fake_mode: Any) -> None:
    """A site with several outputs (``site.slices``: the q heads, k heads and v projection of a
    ``weights="qkv"`` site): one kernel call where the region ends, then per output a narrow of
    its row (``.narrow(-1, start, stop - start)``), viewed to heads and transposed where the
    output is heads, each replacing its node's uses. If any is not laid out as the graph read it
    (the site finder checks this), nothing is replaced."""
    out = val_map[site.output]
    constants = dispatch.constants_json(site.constants)
    with graph.inserting_before(out):
        args = _site_args(graph, site, val_map, fake_mode)
        target, call_args = _kernel_call(site, args, constants)
        kernel = graph.call_function(target, call_args)
        row = graph.call_function(operator.getitem, (kernel, 0))
        added, parts = [kernel, row], []
        for piece in site.slices:
            part = graph.call_method("narrow", (row, -1, piece.start, piece.stop - piece.start))
            added.append(part)
            if piece.view is not None:
                heads = graph.call_method("view", (part, piece.view))
                part = graph.call_method("transpose", (heads, 1, 2))
                added += [heads, part]
            parts.append(part)
    for node in added:
        for key in ("stack_trace", "nn_module_stack", "source_fn_stack"):
            if key in out.meta:
                node.meta[key] = out.meta[key]
    _set_value(kernel, fake_mode, lambda: target(*fx.node.map_arg(call_args, _value)))
    if kernel.meta.get("example_value") is not None:
        row.meta["example_value"] = kernel.meta["example_value"][0]
    for node in added[2:]:  # in order: each reads the one before it, or the row
        _set_value(node, fake_mode, functools.partial(_apply, node))
    problems = [_layout_problem(_value(part), _value(val_map[piece.node])) for piece, part in
                zip(site.slices, parts, strict=True)]  # fmt: skip
    problem = next((p for p in problems if p), "")
    if not problem and fake_mode is not None and any(_value(p) is None for p in parts):
        problem = "no example value for a slice of the kernel's output, so its layout cannot be checked"
    if problem:  # the site finder checks this: a site that gets here anyway is left as the graph had it
        _leave_to_original(graph, site, args, val_map, added, problem)
        return
    originals = [val_map[n] for n in site.region]  # (before the slices' nodes are mapped to the slices)
    for piece, part in zip(site.slices, parts, strict=True):
        val_map[piece.node].replace_all_uses_with(part)
        val_map[piece.node] = part  # a later site may take this value as an input
    for node in reversed(originals):
        graph.erase_node(node)


def _leave_to_original(
    graph: fx.Graph, site: Site, args: list[fx.Node], val_map: dict[fx.Node, fx.Node], added: list[fx.Node],
    problem: str,
) -> None:
    """Undo a site's insertion (the kernel call and the nodes after it, and the inputs the rewrite
    made for it), leaving the graph's own nodes to compute what the site would have: a layout the
    site finder should have refused (``problem``), found only now."""
    log.warning("%s at %s left to the original code: %s", site.op, site.output.name, problem)
    inserted_inputs = [a for a, i in zip(args, site.inputs, strict=True) if a is not val_map[i.node]]
    for node in reversed([*inserted_inputs, *added]):
        graph.erase_node(node)


def _apply(node: fx.Node) -> Any:
    """``node``'s value computed from its inputs' example values (a narrow, view or transpose)."""
    args = fx.node.map_arg(node.args, _value)
    return getattr(args[0], str(node.target))(*args[1:])


def _kernel_call(site: Site, args: list[fx.Node], constants: str) -> tuple[Any, tuple[Any, ...]]:
    """The op a site's kernel is called through, and its arguments.

    Inductor compiles ``kernelsmith::triton_kernel``'s kernel itself; ``kernelsmith::kernel``
    stays a call. A family that writes some of its inputs (decode attention's ``write_kv``: the
    caches) is called through ``kernelsmith::kernel_mutating``, whose schema declares them written,
    so that functionalization sees the write: the written inputs first, their places among the
    family's inputs, then the others. The site's region holds the writes it replaces (the caches'
    ``index_copy_``): erased with it, and the kernel's write happens where the attention was,
    which the site finder checked is safe (nothing reads or writes the caches in between).
    """
    written = tuple(get_op(site.op).written_inputs(site.spec))
    if written:
        others = [a for i, a in enumerate(args) if i not in written]
        return _KERNEL_MUTATING, (site.op, [args[i] for i in written], list(written), others, constants,
                                  site.decisions)  # fmt: skip
    if site.triton_decision:
        return triton_ops.OP, (site.op, args, constants, site.triton_decision)
    return _KERNEL, (site.op, args, constants, site.decisions)


def _set_value(node: fx.Node, fake_mode: Any, compute: Callable[[], Any]) -> None:
    """``node``'s example value, computed on fake tensors (later passes read it)."""
    if fake_mode is None:
        return
    try:
        with fake_mode:
            node.meta["example_value"] = compute()
    except Exception as exc:  # the value is informative only
        log.debug("no example value for %s: %s", node.name, exc)


# ---------------------------------------------------------------------------------------------
# In-context comparison
# ---------------------------------------------------------------------------------------------


def _call(compiled: Callable[..., Any], inputs: Sequence[Any]) -> Any:
    """A backend's compiled graph is called as Dynamo calls it: with the inputs as arguments
    (what ``compile_fx`` returns carries ``_boxed_call`` yet takes them so, in torch 2.11-2.13)."""
    return compiled(*inputs)


def time_graphs(candidates: Sequence[Callable[..., Any]], inputs: Sequence[Any], rounds: int = 7,
                calls: int = 3) -> list[float]:
    """Median milliseconds per call of each compiled graph, timed interleaved (A B A B ...) on the
    same inputs, after two warm-up calls each."""
    cuda = [t.device for t in inputs if isinstance(t, torch.Tensor) and t.device.type == "cuda"]

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(cuda[0])

    samples: list[list[float]] = [[] for _ in candidates]
    with torch.no_grad():
        for fn in candidates:
            for _ in range(2):
                _call(fn, inputs)
        for _ in range(rounds):
            for i, fn in enumerate(candidates):
                sync()
                start = time.perf_counter()
                for _ in range(calls):
                    _call(fn, inputs)
                sync()
                samples[i].append((time.perf_counter() - start) * 1000.0 / calls)
    return [sorted(s)[len(s) // 2] for s in samples]


