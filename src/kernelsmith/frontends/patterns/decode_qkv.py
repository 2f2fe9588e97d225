"""A decoder layer's q, k and v projections as one ``decode_matmul`` site (``weights="qkv"``).

Hugging Face's Llama attention projects the (normed) hidden state three times::

    q = rotate(F.linear(x, Wq).view(B, S, H, D).transpose(1, 2))
    k = rotate(F.linear(x, Wk).view(B, S, KV, D).transpose(1, 2))
    v = F.linear(x, Wv)                       # then .view(B, S, KV, D).transpose(1, 2)

The decode pattern (:mod:`kernelsmith.frontends.patterns.decode`) makes a RoPE site of q and of
k and a plain site of v, each recomputing the input norm in its prologue: three launches. The
family's ``weights="qkv"`` form computes all three from the three weights in one launch (one
norm), its output the concatenated ``(B, S, (H + 2 KV) * D)`` row. :func:`qkv_site` makes that
site of the three checked sites when:

- q and k are RoPE sites (``rope=(H, 0)`` and ``(KV, 0)``) and v a plain projection without a bias
  or epilogue, all three reading the same ``x`` (unreshaped), with the same head dim, v as wide
  as k, k and v reading the same position tables in the same order (q and k, as their checks
  decided which one is cos);
- all three fold the same norm into their prologue (the same nodes, gamma and eps), or none does;
- nothing a barrier (an in-place op, a side effect) lies between the norm's first node and the
  region's end, and no user of q's, k's or v's value comes before the region's end (the kernel
  runs there);
- each of the three, as a slice of the kernel's row (``narrow``; q and k then viewed to heads and
  transposed, as their own sites' outputs are), is laid out as the graph reads it. A slice of a
  ``(B, S, N)`` row steps ``N`` between rows, the projection's own output its own width: they
  agree only where the leading dims are size 1, one token of one sequence (batch 1 decode, what
  the graphs of a served step are); at batch > 1 the three sites stay;
- the union (norm, projections, views and rotations) run as one module on random inputs gives,
  concatenated, the family's reference on the fused spec.

The site's region is the three regions, its output their last node (where the rewrite puts the
kernel), and :attr:`Site.slices <kernelsmith.frontends._backend_sites.Site.slices>` says which
columns replace which value. When any condition fails, or the fused site has no decision, the three
sites are served (or not) as before: never a wrong answer.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import torch
from torch import fx

from kernelsmith.frontends._backend_sites import (
    OutputSlice,
    Site,
    _input_meta,
    _layout_problem,
    _moves_across_barrier,
    _region_inputs,
    _value,
)
from kernelsmith.frontends.patterns.decode import (
    _TRANSPOSES,
    _VIEWS,
    OP,
    _is_call,
    _only_user,
    decode_rows,
    decode_spec,
    region_samples,
)
from kernelsmith.ops import get_op

log = logging.getLogger("kernelsmith.frontends.backend")  # the backend's logger: this is its site finding


def _linear(site: Site) -> fx.Node | None:
    """The ``F.linear`` node of a decode projection's site (the first in its region)."""
    return next((n for n in site.region if decode_rows(n) is not None), None)


def v_projection(q: Site, k: Site, taken: set[fx.Node]) -> fx.Node | str:
    """The third decode projection of the ``x`` q's and k's products read (v's), or why none."""
    q_linear, k_linear = _linear(q), _linear(k)
    if q_linear is None or k_linear is None or q_linear.args[0] is not k_linear.args[0]:
        return "q and k do not project the same x"
    x = q_linear.args[0]
    assert isinstance(x, fx.Node)
    others = [u for u in x.users if u not in (q_linear, k_linear)]
    if len(others) != 1 or decode_rows(others[0]) is None or others[0] in taken or others[0].args[0] is not x:
        return f"x is read by {len(others)} nodes besides q and k, not by one decode projection"
    return others[0]


def _v_heads(v: fx.Node, view: tuple[int, int, int, int]) -> list[fx.Node]:
    """v's product, and its ``.view(B, S, KV, D).transpose(1, 2)`` when that is all that reads it
    (Hugging Face's spelling): the nodes the fused site replaces, v's heads last."""
    viewed = _only_user(v)
    if viewed is None or not _is_call(viewed, _VIEWS) or tuple(getattr(_value(viewed), "shape", ())) != view:
        return [v]
    transposed = _only_user(viewed)
    b, s, h, d = view
    if (transposed is None or not _is_call(transposed, _TRANSPOSES)
            or tuple(getattr(_value(transposed), "shape", ())) != (b, h, s, d)):  # fmt: skip
        return [v]
    return [v, viewed, transposed]


def _same_prologue(q: Site, k: Site, v: Site) -> str:
    """Why the three do not fold the same norm (or all none), "" when they do."""
    folded = ["prologue" in s.constants for s in (q, k, v)]
    if not any(folded):
        return ""
    if not all(folded):
        return "only some of q, k and v fold the input norm"
    gammas = {s.inputs[-3 if "rope" in s.constants else -1].node for s in (q, k, v)}  # (before cos and sin)
    if q.prologue != k.prologue or q.prologue != v.prologue or len(gammas) != 1:
        return "q, k and v fold different norms"
    if len({s.constants["eps"] for s in (q, k, v)}) != 1:
        return "q, k and v fold norms of different eps"
    return ""


def qkv_site(
    gm: fx.GraphModule,
    q: Site,
    k: Site,
    v: Site,
    nodes: list[fx.Node],
    order: dict[fx.Node, int],
    generators: dict[torch.device, torch.Generator],
) -> Site | str:
    """One ``weights="qkv"`` site for the checked sites of q (RoPE), k (RoPE) and v (plain), or
    why not (module docstring)."""
    from kernelsmith.frontends.decorator import _differs_from_op

    if q.output_view is None or k.output_view is None or v.output_view is not None or v.slices:
        return "q and k are not RoPE sites, or v is not a plain projection"
    (heads, q_kv), (kv_heads, k_kv) = q.constants.get("rope", (0, 1)), k.constants.get("rope", (0, 1))
    if q_kv or k_kv or v.constants.get("epilogue") != "none" or v.constants.get("bias"):
        return "q and k are not single rotated projections, or v has a bias or an epilogue"
    x = q.inputs[0]
    if any(s.inputs[0].node is not x.node or s.inputs[0].reshape is not None for s in (q, k, v)):
        return "q, k and v do not read the same x"
    problem: str | None = _same_prologue(q, k, v)
    if problem:
        return problem
    batch, seq, _, d = q.output_view
    if k.output_view[3] != d or tuple(_value(v.output).shape) != (batch, seq, kv_heads * d):
        return "q's, k's and v's heads do not match"
    q_tables, k_tables = q.inputs[-2:], k.inputs[-2:]
    if [(t.node, t.reshape) for t in q_tables] != [(t.node, t.reshape) for t in k_tables]:
        return "q and k rotate with different tables (or take them in another order)"
    gamma = [q.inputs[-3]] if "prologue" in q.constants else []
    inputs = [x, q.inputs[1], k.inputs[1], v.inputs[1], *gamma, *q_tables]
    constants = {**q.constants, "rope": [heads, kv_heads], "weights": "qkv"}
    spec = decode_spec([_input_meta(i) for i in inputs], constants)
    if isinstance(spec, str):
        return spec
    v_view = (batch, seq, kv_heads, d)
    v_nodes = _v_heads(v.output, v_view)  # with its view to heads where that is all that reads it
    region = sorted({*q.region, *k.region, *v.region, *v_nodes}, key=order.__getitem__)
    end = order[region[-1]]
    slices = [OutputSlice(q.output, 0, heads * d, q.output_view),
              OutputSlice(k.output, heads * d, (heads + kv_heads) * d, k.output_view),
              OutputSlice(v_nodes[-1], (heads + kv_heads) * d, (heads + 2 * kv_heads) * d,
                          v_view if len(v_nodes) > 1 else None)]  # fmt: skip
    if any(order[u] < end for piece in slices for u in piece.node.users if u not in region):
        return "q's, k's or v's value is read before the last of them is computed"
    everything = sorted({*q.prologue, *region}, key=order.__getitem__)
    if _moves_across_barrier(nodes, order[everything[0]], end, everything):
        return "an in-place op or a side effect lies between the norm and the last projection"
    (produced,) = get_op(OP).output_specs(spec)
    row = torch.empty(produced.shape, dtype=produced.torch_dtype, device="meta")
    for piece in slices:
        part = row.narrow(-1, piece.start, piece.stop - piece.start)
        part = part if piece.view is None else part.view(piece.view).transpose(1, 2)
        problem = _layout_problem(part, _value(piece.node))
        if problem:
            return f"{piece.node.name} as a slice of the fused row: {problem}"
    outside = _region_inputs(everything, order)
    if set(outside) != {i.node for i in inputs}:
        return "the projections read more than the fused op's inputs"
    device = _value(x.node).device
    samples = region_samples(outside, device, generators)
    bound = tuple(samples[i.node] if i.reshape is None else samples[i.node].reshape(i.reshape) for i in inputs)
    try:
        with torch.no_grad():
            values = _outputs_module(gm, everything, outside, [p.node for p in slices])(*(samples[n] for n in outside))
            # each value where its slice says the kernel writes it (NaN where none does)
            fused_row = torch.full(produced.shape, math.nan, dtype=produced.torch_dtype, device=device)
            for t, piece in zip(values, slices, strict=True):
                rows = t if piece.view is None else t.transpose(1, 2).reshape(batch, seq, -1)
                fused_row[..., piece.start : piece.stop] = rows
            problem = _differs_from_op(get_op(OP), spec, bound, fused_row)
    except Exception as exc:  # a region that cannot run on random inputs: not this site
        problem = f"{type(exc).__name__}: {exc}"
    if problem:
        return f"the three projections do not compute the fused op: {problem}"
    # (a graph that needs gradients through any of the three needs them through the fused site:
    # the resolver refuses it there, as it refuses each of the three, for a family with no backward)
    needs_grad = any(s.needs_grad for s in (q, k, v))
    return Site(OP, region[-1], region, inputs, constants, spec, needs_grad, prologue=list(q.prologue), slices=slices)


def _outputs_module(
    gm: fx.GraphModule, nodes: list[fx.Node], inputs: list[fx.Node], outputs: list[fx.Node]
) -> fx.GraphModule:
    """``nodes`` as a module of its own taking ``inputs`` positionally and returning ``outputs``."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for i, node in enumerate(inputs):
        env[node] = graph.placeholder(f"input_{i}")
    for node in nodes:
        env[node] = graph.node_copy(node, env.__getitem__)
    graph.output(tuple(env[n] for n in outputs))
    return fx.GraphModule(gm, graph)


def qkv_sites(
    gm: fx.GraphModule,
    ropes: list[Site],
    taken: set[fx.Node],
    nodes: list[fx.Node],
    order: dict[fx.Node, int],
    generators: dict[torch.device, torch.Generator],
    plain_site: Callable[[fx.Node], Site | None],
) -> list[Site]:
    """The ``weights="qkv"`` sites of ``ropes`` (checked RoPE sites, norms folded): for each q and
    k pair reading the same x (q the one with more heads, or the first), v's plain site
    (``plain_site`` of v's projection) and the fused site where :func:`qkv_site` makes one."""
    found: list[Site] = []
    by_x: dict[fx.Node, list[Site]] = {}
    for site in ropes:
        linear = _linear(site)
        if linear is not None and isinstance(linear.args[0], fx.Node):
            by_x.setdefault(linear.args[0], []).append(site)
    for pair in by_x.values():
        if len(pair) != 2:
            continue
        q, k = sorted(pair, key=lambda s: (-s.constants["rope"][0], order[s.output]))
        v_linear = v_projection(q, k, taken)
        v = plain_site(v_linear) if isinstance(v_linear, fx.Node) else None
        fused = qkv_site(gm, q, k, v, nodes, order, generators) if v is not None else "no plain site for v"
        if isinstance(fused, str):
            log.debug("%s, %s and v stay three sites: %s", q.output.name, k.output.name, fused)
            continue
        found.append(fused)
    return found


__all__ = ["qkv_site", "qkv_sites", "v_projection"]
