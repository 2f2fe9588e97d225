"""Decode-shaped projections: where the compile backend routes ``F.linear`` to ``decode_matmul``.

When a language model generates, every projection of a step is ``F.linear`` of a few rows (one
per sequence: ``M`` = 1 to :data:`~kernelsmith.ops.decode_matmul.MAX_M` after flattening the
leading dims) against an ``nn.Linear`` weight. What the user writes is the same ``F.linear`` as
at any other size, so *recognizing* it is the matmul pattern's job
(:mod:`kernelsmith.frontends.patterns.matmul`: the product, the bias, the residual add, the
SwiGLU pair); only the shape decides that the ``decode_matmul`` family, whose kernels stream the
weight across every multiprocessor, is the one to serve it. So this module is not a second
pattern in :data:`~kernelsmith.frontends.patterns.PATTERNS` (the recognizer tries every entry on
every function: two entries matching every small linear would make each decorated product
ambiguous, and ``@kernelsmith.optimize`` keeps routing products to ``matmul``), but the two
things the backend needs besides the matmul pattern:

- :func:`candidate_regions`: where to look. The backend grows regions backwards from cheap ops
  and stops at products, which are the inputs of the other families; a decode site *starts* at a
  product. For each ``F.linear`` node of decode shape, the regions that could be one
  ``decode_matmul`` call, largest first: the SwiGLU pair ``silu(linear(x, w1)) * linear(x, w3)``
  (one pass over both weights), the product and a residual add ``linear(x, w) + r`` (the o and
  down projections), the product alone. A region holds only nodes no other site took (an
  ``add_rmsnorm`` site keeps the residual add it folded in) and nodes whose every user is in the
  region, except its output;
- :func:`prologue_norms` and :func:`with_prologue`: the RMSNorm before a projection, folded
  into its prologue (below);
- :func:`decode_spec`: the routing rule. A matmul match whose weight is stored as ``nn.Linear``
  stores it (layout ``"linear"``) and whose ``x`` has at most ``MAX_M`` rows is a
  ``decode_matmul`` workload; anything else (``x @ w`` with a ``(K, N)`` weight, more rows, a
  dtype the family does not take) is left to Inductor and cuBLAS, with the family's reason.

RMSNorm prologues
-----------------
In a decoder layer the ``input_layernorm`` feeds q, k and v, and the
``post_attention_layernorm`` feeds gate and up: one RMSNorm, several projections. The family
recomputes the norm in each projection's prologue (``prologue="rmsnorm"``: one row of ``K``
elements a sequence, nothing next to the ``N x K`` weight it streams), so the norm needs no kernel
of its own once every projection reading it is served. The region rules stay as they are: each
projection's site keeps its own region (the product, its SwiGLU partner or residual add), and the
norm is a *region input duplicated per projection*: the site reads the norm's input ``x`` and
``gamma`` instead of the normed row, the norm's nodes are listed in :attr:`Site.prologue
<kernelsmith.frontends._backend_sites.Site.prologue>`, and the rewrite erases them once no user
is left. This reads better than one region covering the norm and all its projections (a site
with several outputs), and it degrades by itself: where one projection is not served (not tuned,
slower in context) the norm keeps computing its row for that one, and the others still recompute
it. The norm's nodes are taken (no ``rmsnorm`` site of their own) only when a projection takes the
prologue. Each fused site is checked like any other: the norm's nodes and the projection's, run
as one module on random inputs, against the family's reference.

Folded where (:func:`prologue_norms`): the node ``x`` of a decode-shaped ``F.linear(x, w)`` whose
users are all decode-shaped ``F.linear`` calls taking it as ``x`` (q, k, v; gate and up), and
which the rmsnorm pattern recognizes as an RMSNorm of one input. Not folded, with the norm left as
it is (an ``rmsnorm`` site of its own, and the projections served without a prologue): a norm
whose output has any other user (a returned value, an ``x @ w`` product, a slice as before Hugging
Face's LM head), prefill shapes (more than ``MAX_M`` rows: no decode site at all), a weight not
stored as ``nn.Linear`` (``x @ w``: not a decode site), and Gemma's ``x * (1 + weight)`` (the
prologue has no weight offset). A residual add before the norm (``h = a + b; rmsnorm(h)``, what
``add_rmsnorm`` folds elsewhere) stays a node of the graph: its sum is the next residual, so only
the norm is folded, and the projections read ``h``.

Gemma's norm is not matched: it would need a ``weight_offset`` in the prologue (the rmsnorm family
has one, the decode kernels do not).

RoPE epilogues (Llama's separate q and k projections)
-----------------------------------------------------
Hugging Face's Llama attention projects, views and rotates::

    q = F.linear(x, Wq).view(B, S, H, D).transpose(1, 2)        # (B, H, S, D)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)               # (B, 1, S, D), shared by q and k
    q = q * cos + rotate_half(q) * sin                          # rotate_half(q) = cat(-q2, q1)

and k the same with its KV heads. :func:`rope_sites` makes of each such chain one
``decode_matmul`` site with ``epilogue="rope"``, ``rope=(H, 0)`` (the whole output rotated):
the region is the product, the view, the transpose and the rotation's nodes (every node reached
from the transpose that only the chain reads, up to the one node they all flow into), its inputs
``x``, ``Wq`` and the two position tables, read by the kernel as ``(B, S, D)`` rows (one per row
of ``x``; a table shared over the batch, ``(1, 1, S, D)`` with ``B > 1``, is refused). The site's
check runs the region as a module on random inputs and compares it, transposed back to ``(B, S,
H * D)``, with the family's reference; which table is ``cos`` is what that check decides (the
rotation is linear in each, so random tables tell them apart). What the spelling does not
compute is refused by that check or by the family's spec: GPT-J's interleaved rotary (pairs
``2i, 2i + 1``), partial rotary (``rotary_dim < D``: tables of ``rotary_dim`` columns, or a pass
through half), a rotation of anything else than the product. The input norm before q and k folds
into a RoPE site's prologue as into any projection's (:func:`with_prologue`, given the site's
output view so that its check compares the projection's layout).

The kernel's output is the projection's layout, ``(B, S, H * D)``, and the graph reads the site's
output as ``(B, H, S, D)``: the rewrite inserts ``.view(B, S, H, D).transpose(1, 2)`` after the
kernel (:attr:`Site.output_view <kernelsmith.frontends._backend_sites.Site.output_view>`, also
:attr:`RopeSite.output_view`), the same view and transpose the graph had, so the users of the
rotated heads read the strides they read before (the site finder refuses a site where they would
differ). ``find_sites`` offers these sites before the plain projections, and only where it is told
the fused site is decided (its ``rope_decided``): a fused site with no decision gives its nodes
back, so the plain q and k projections are found as before and a database tuned before RoPE
sites existed keeps serving them (with the rotation left to Inductor). The backend object does
not pass that test yet (``kernel_decided`` builds it from its database), so it finds no RoPE
sites until it does.

Where one layer's q and k RoPE sites and v's plain projection read the same ``x``, the three
become one ``weights="qkv"`` site (one launch, one norm prologue) where that site is decided and
its slices are laid out as the graph reads them: :mod:`kernelsmith.frontends.patterns.decode_qkv`.

The backend then checks each region exactly as it checks its other sites (the region run on
random inputs through :func:`~kernelsmith.frontends.recognize.recognize`, its output compared
with the family's reference) and serves it only where a stored decision says the kernel wins.
Projections are row-independent, so what the rows hold (padding, sequences of different lengths,
a masked position) cannot make a served projection compute another row's result; attention,
where masks matter, is not touched here.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import operator
from collections.abc import Iterator

import torch
from torch import fx

from kernelsmith.frontends._backend_sites import (
    OpInput,
    Site,
    _input_meta,
    _moves_across_barrier,
    _region_inputs,
    _region_module,
    _sample,
    _value,
)
from kernelsmith.ops import UnsupportedWorkload, get_op
from kernelsmith.ops.decode_matmul import MAX_M
from kernelsmith.spec import OpSpec

log = logging.getLogger("kernelsmith.frontends.backend")  # the backend's logger: this is its site finding

OP = "decode_matmul"

_SILU = frozenset({"silu"})
_MULS = frozenset({"mul", "__mul__"})
_ADDS = frozenset({"add", "__add__"})


def _name(node: fx.Node) -> str:
    target = node.target
    return target if isinstance(target, str) else getattr(target, "__name__", str(target))


def _is_call(node: object, names: frozenset[str]) -> bool:
    if not isinstance(node, fx.Node) or node.op not in ("call_function", "call_method"):
        return False
    if node.target is operator.mul:
        return "mul" in names
    if node.target is operator.add:
        return "add" in names
    return _name(node) in names


def decode_rows(node: fx.Node) -> int | None:
    """The rows of ``x`` (its leading dims flattened) when ``node`` is ``F.linear(x, w[, b])`` with
    a 2-D weight and at most ``MAX_M`` rows, static shapes; else None."""
    if not _is_call(node, frozenset({"linear"})) or len(node.args) < 2:
        return None
    x, w = _value(node.args[0]), _value(node.args[1])
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor) or w.dim() != 2 or x.dim() < 1:
        return None
    if not all(type(s) is int for s in x.shape):  # a dynamic-shape graph: not a decode workload
        return None
    rows = math.prod(x.shape[:-1])
    return rows if 1 <= rows <= MAX_M else None


def _only_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _swiglu_region(linear: fx.Node, taken: set[fx.Node]) -> tuple[fx.Node, frozenset[fx.Node]] | None:
    """``(mul, region)`` when ``linear`` is the gate of ``silu(linear(x, w1)) * linear(x, w3)``."""
    silu = _only_user(linear)
    if silu is None or not _is_call(silu, _SILU) or silu.args[:1] != (linear,):
        return None
    mul = _only_user(silu)
    if mul is None or not _is_call(mul, _MULS) or len(mul.args) != 2 or mul.kwargs:
        return None
    up = mul.args[1] if mul.args[0] is silu else mul.args[0]
    if not isinstance(up, fx.Node) or decode_rows(up) is None or _only_user(up) is not mul:
        return None
    if up.args[0] is not linear.args[0]:
        return None  # two different x: not one pass
    region = frozenset({linear, silu, up, mul})
    return None if region & taken else (mul, region)


def _residual_region(linear: fx.Node, taken: set[fx.Node]) -> tuple[fx.Node, frozenset[fx.Node]] | None:
    """``(add, region)`` when the product's only user adds it to another tensor."""
    add = _only_user(linear)
    if add is None or add in taken or not _is_call(add, _ADDS) or len(add.args) != 2 or add.kwargs:
        return None
    other = add.args[1] if add.args[0] is linear else add.args[0]
    if not isinstance(other, fx.Node) or other is linear:
        return None
    return add, frozenset({linear, add})


def candidate_regions(gm: fx.GraphModule, taken: set[fx.Node]) -> Iterator[list[tuple[fx.Node, frozenset[fx.Node]]]]:
    """For each decode-shaped ``F.linear`` of ``gm`` in graph order, its candidate regions as
    ``(output node, nodes)``, largest first (see the module docstring). The up projection of a
    SwiGLU pair is offered on its own too, for when the pair is not a site."""
    for node in gm.graph.nodes:
        if node in taken or decode_rows(node) is None:
            continue
        candidates = [r for r in (_swiglu_region(node, taken), _residual_region(node, taken)) if r is not None]
        candidates.append((node, frozenset({node})))
        yield candidates


def region_samples(
    outside: list[fx.Node], device: torch.device, generators: dict[torch.device, torch.Generator]
) -> dict[fx.Node, torch.Tensor]:
    """Random values for a region's inputs from outside it, from the device's generator reseeded
    to 0 (so every check of a site draws the same values), for running the region and the fused
    op on the same inputs."""
    generator = generators.setdefault(device, torch.Generator(device=device))
    generator.manual_seed(0)
    return {n: _sample(_value(n), generator) for n in outside}


def prologue_norms(gm: fx.GraphModule, taken: set[fx.Node]) -> Iterator[fx.Node]:
    """The nodes that could be an RMSNorm folded into projections' prologues: each ``x`` of a
    decode-shaped ``F.linear`` whose users are all decode-shaped ``F.linear`` calls taking it as
    their ``x`` (whether it *is* an RMSNorm is the rmsnorm pattern's to say)."""
    seen: set[fx.Node] = set()
    for node in gm.graph.nodes:
        x = node.args[0] if node not in taken and decode_rows(node) is not None else None
        if not isinstance(x, fx.Node) or x in seen or x in taken:
            continue
        seen.add(x)
        if all(decode_rows(u) is not None and u.args[0] is x and x not in u.args[1:] for u in x.users):
            yield x
        else:
            log.debug("%s is read by more than decode projections: no RMSNorm prologue", x.name)


def with_prologue(
    gm: fx.GraphModule,
    site: Site,
    norm: Site,
    nodes: list[fx.Node],
    order: dict[fx.Node, int],
    generators: dict[torch.device, torch.Generator],
    output_view: tuple[int, int, int, int] | None = None,
) -> Site | str:
    """``site`` (a ``decode_matmul`` site whose ``x`` is ``norm``'s output) computing the norm in
    its prologue, checked on random inputs against the family's reference; or why not.
    ``output_view``: a RoPE site's (:class:`RopeSite`), whose region ends at the (B, H, S, D)
    heads; gamma then goes before cos and sin, as the family orders its inputs."""
    from kernelsmith.frontends.decorator import _differs_from_op

    if norm.op != "rmsnorm" or norm.status != "found":
        return f"the norm is not a servable rmsnorm ({norm.status}: {norm.reason})"
    if norm.constants.get("weight_offset", 0.0):
        return "Gemma's x * (1 + weight): the decode_matmul prologue has no weight offset"
    x, gamma = norm.inputs
    if x.reshape is not None or site.inputs[0].reshape is not None:
        return "the norm's input or the product's x is reshaped on the way"
    constants = {**site.constants, "prologue": "rmsnorm", "eps": norm.constants["eps"]}
    tables = site.inputs[-2:] if "rope" in site.constants else []  # cos and sin come last
    inputs = [x, *site.inputs[1 : len(site.inputs) - len(tables)], gamma, *tables]
    spec = decode_spec([_input_meta(i) for i in inputs], constants)
    if isinstance(spec, str):
        return spec
    region = sorted({*norm.region, *site.region}, key=order.__getitem__)
    if region[-1] is not site.output:
        return "the product comes before the end of its norm"
    if _moves_across_barrier(nodes, order[region[0]], order[site.output], region):
        return "an in-place op or a side effect lies between the norm and the product"
    outside = _region_inputs(region, order)
    if set(outside) != {i.node for i in inputs}:
        return "the norm and the product read more than the fused op's inputs"
    samples = region_samples(outside, _value(x.node).device, generators)
    bound = tuple(samples[i.node] if i.reshape is None else samples[i.node].reshape(i.reshape) for i in inputs)
    try:
        with torch.no_grad():
            produced = _region_module(gm, region, outside)(*(samples[n] for n in outside))
            if output_view is not None:  # the heads back to the projection's (B, S, H * D)
                b, s, h, d = output_view
                produced = produced.transpose(1, 2).reshape(b, s, h * d)
            problem = _differs_from_op(get_op(OP), spec, bound, produced)
    except Exception as exc:  # a region that cannot run on random inputs: not this site
        problem = f"{type(exc).__name__}: {exc}"
    if problem:
        return f"the norm and the product do not compute the fused op: {problem}"
    return dataclasses.replace(site, inputs=inputs, constants=constants, spec=spec, prologue=list(norm.region))


# ---- RoPE epilogues on Llama's separate q and k projections (module docstring) ---------------------

_VIEWS = frozenset({"view", "reshape"})
_TRANSPOSES = frozenset({"transpose"})
# What a rotation's spelling is made of: products, sums, negation, the halves, their concatenation.
_ROTATION_OPS = frozenset({"mul", "__mul__", "add", "__add__", "sub", "__sub__", "neg", "__neg__", "getitem",
                           "cat", "narrow", "chunk", "split", "stack", "flatten"})  # fmt: skip
_MAX_ROTATION = 16  # nodes: Hugging Face's spelling takes 7 (mul, two slices, neg, cat, mul, add)


@dataclasses.dataclass(frozen=True)
class RopeSite:
    """A checked ``decode_matmul`` site computing a rotated projection, and the view the rewrite
    must put after its kernel: ``output.view(output_view).transpose(1, 2)`` is the graph's
    ``(B, H, S, D)`` value."""

    site: Site
    output_view: tuple[int, int, int, int]  # (B, S, H, D)


def _rotation(
    transposed: fx.Node, shape: tuple[int, ...], order: dict[fx.Node, int]
) -> tuple[fx.Node, list[fx.Node]] | str:
    """``(output, nodes)`` of the rotation that reads ``transposed``: the first node ``out`` (in
    graph order) of ``shape`` such that the rotation ops between ``transposed`` and ``out`` hold
    every reader of ``transposed`` and every reader of each other but ``out``'s (what reads
    ``out`` is the rest of the model); or why there is none."""
    if any(not _is_call(user, _ROTATION_OPS) for user in transposed.users):
        return "the heads are read by more than a rotation"
    reached: set[fx.Node] = set()  # what the rotation ops reach from the heads, a few nodes deep
    frontier = [transposed]
    while frontier and len(reached) <= _MAX_ROTATION:
        for user in frontier.pop().users:
            if user not in reached and _is_call(user, _ROTATION_OPS):
                reached.add(user)
                frontier.append(user)
    why = "no node of the rotation is the rotated (B, H, S, D) projection"
    for out in sorted(reached, key=order.__getitem__):
        value = _value(out)
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape:
            continue
        region = {n for n in reached if n is out or _reaches(n, out, reached)}
        if set(transposed.users) - region:
            continue  # a reader of the heads comes later: not the end yet
        outside = [n for n in region if n is not out and set(n.users) - region]
        if outside:
            why = f"{outside[0].name} is read outside the rotation"
            continue
        return out, sorted(region, key=order.__getitem__)
    return why


def _reaches(node: fx.Node, target: fx.Node, within: set[fx.Node]) -> bool:
    """Whether ``target`` reads ``node`` through nodes of ``within``."""
    frontier, seen = [node], {node}
    while frontier:
        for user in frontier.pop().users:
            if user is target:
                return True
            if user in within and user not in seen:
                seen.add(user)
                frontier.append(user)
    return False


def rope_site(
    gm: fx.GraphModule,
    linear: fx.Node,
    nodes: list[fx.Node],
    order: dict[fx.Node, int],
    generators: dict[torch.device, torch.Generator],
) -> RopeSite | str:
    """The RoPE site of the decode projection ``linear`` (module docstring, "RoPE epilogues"),
    checked on random inputs against the family's reference; or why it is none."""
    from kernelsmith.frontends.decorator import _differs_from_op

    if decode_rows(linear) is None or any(a is not None for a in (*linear.args[2:], *linear.kwargs.values())):
        return "not a decode-shaped F.linear(x, w) without a bias"
    x_node, w_node = linear.args[:2]
    x = _value(x_node)  # a tensor with a 2-D weight: decode_rows says so
    if not isinstance(x_node, fx.Node) or not isinstance(w_node, fx.Node) or x.dim() != 3:
        return "x is not (B, S, K)"
    batch, seq = x.shape[0], x.shape[1]
    view = _only_user(linear)
    if view is None or not _is_call(view, _VIEWS):
        return "the product is not viewed to heads"
    viewed = _value(view)
    if not isinstance(viewed, torch.Tensor) or viewed.dim() != 4 or tuple(viewed.shape[:2]) != (batch, seq):
        return "the product is not viewed to (B, S, H, D)"
    heads, d = viewed.shape[2], viewed.shape[3]
    transpose = _only_user(view)
    if transpose is None or not _is_call(transpose, _TRANSPOSES):
        return "the heads are not transposed to (B, H, S, D)"
    if tuple(_value(transpose).shape) != (batch, heads, seq, d):
        return "the heads are not transposed to (B, H, S, D)"
    found = _rotation(transpose, (batch, heads, seq, d), order)
    if isinstance(found, str):
        return found
    out, rotation = found
    region = sorted({linear, view, transpose, *rotation}, key=order.__getitem__)
    if _moves_across_barrier(nodes, order[linear], order[out], region):
        return "an in-place op or a side effect lies between the product and its rotation"
    outside = _region_inputs(region, order)
    tables = [n for n in outside if n not in (x_node, w_node)]
    if set(outside) - set(tables) != {x_node, w_node} or len(tables) != 2:
        return f"the rotation reads {len(tables)} tensors besides x and w, not cos and sin"
    rows = (batch, seq, d)
    for table in tables:  # one (B, S, D) row per row of x, as (B, 1, S, D) or (B, S, D)
        value = _value(table)
        if not isinstance(value, torch.Tensor) or value.numel() != math.prod(rows) or (
            tuple(value.shape) not in ((batch, 1, seq, d), rows)
        ):  # fmt: skip
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else None
            return f"the position table {table.name} {shape} is not one (B, S, D) row per row of x"
    samples = region_samples(outside, x.device, generators)
    try:
        with torch.no_grad():
            produced = _region_module(gm, region, outside)(*(samples[n] for n in outside))
    except Exception as exc:  # a region that cannot run on random inputs: not this site
        return f"the region does not run: {type(exc).__name__}: {exc}"
    as_projection = produced.transpose(1, 2).reshape(batch, seq, heads * d)
    problem = "no order of the tables"
    for cos, sin in (tables, tables[::-1]):  # which one is cos: the check tells (module docstring)
        inputs = [OpInput(x_node), OpInput(w_node), OpInput(cos, rows), OpInput(sin, rows)]
        constants: dict[str, object] = {"layout": "linear", "epilogue": "rope", "bias": False, "rope": (heads, 0)}
        spec = decode_spec([_input_meta(i) for i in inputs], constants)
        if isinstance(spec, str):
            return spec
        bound = tuple(samples[i.node].reshape(rows) if i.reshape else samples[i.node] for i in inputs)
        try:
            with torch.no_grad():
                problem = _differs_from_op(get_op(OP), spec, bound, as_projection) or ""
        except Exception as exc:  # the reference refusing the inputs: not this site
            problem = f"{type(exc).__name__}: {exc}"
        if not problem:
            heads_view = (batch, seq, heads, d)
            site = Site(OP, out, region, inputs, {**constants, "rope": [heads, 0]}, spec, output_view=heads_view)
            return RopeSite(site, heads_view)
    return f"the product and its rotation do not compute RoPE's rotate_half: {problem}"


def rope_sites(gm: fx.GraphModule, taken: set[fx.Node]) -> Iterator[RopeSite | tuple[fx.Node, str]]:
    """For each decode-shaped ``F.linear`` of ``gm`` not taken, its RoPE site, or ``(the linear,
    why not)``."""
    nodes = list(gm.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    generators: dict[torch.device, torch.Generator] = {}
    for node in nodes:
        if node in taken or decode_rows(node) is None:
            continue
        found = rope_site(gm, node, nodes, order, generators)
        if isinstance(found, str):
            log.debug("%s takes no RoPE epilogue: %s", node.name, found)
            yield node, found
        elif set(found.site.region) & taken:
            yield node, "a node of the rotation belongs to another site"
        else:
            yield found


def decode_spec(inputs: list[torch.Tensor], constants: dict[str, object]) -> OpSpec | str:
    """The ``decode_matmul`` spec of a recognized ``matmul`` site (its inputs as meta tensors,
    strides kept, and the match's constants), or why it is none: the family's own reason
    (another layout, too many rows, a non-contiguous input, an unsupported dtype)."""
    try:
        return get_op(OP).spec_for(*inputs, **constants)
    except UnsupportedWorkload as exc:
        return str(exc)


__all__ = [
    "OP", "RopeSite", "candidate_regions", "decode_rows", "decode_spec", "prologue_norms", "region_samples",
    "rope_site", "rope_sites", "with_prologue",
]  # fmt: skip
