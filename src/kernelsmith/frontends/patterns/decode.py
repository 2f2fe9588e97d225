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

Two fusions of the family are not matched here. Gemma's norm would need a ``weight_offset`` in
the prologue (the rmsnorm family has one, the decode kernels do not). RoPE in the epilogue
(``epilogue="rope"``, ``rope=(heads, kv_heads)``) rotates a *fused* QKV output of ``(heads + 2
kv_heads) x D`` columns (Phi-3's ``qkv_proj``); Llama's separate q and k projections are no such
output (``kv_heads`` must be positive and the columns must split so), and matching Phi-3's split,
views and ``apply_rotary_pos_emb`` would take a site whose kernel replaces the product and whose
rotated q and k are then read through the graph's own slices: not built yet.

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
) -> Site | str:
    """``site`` (a ``decode_matmul`` site whose ``x`` is ``norm``'s output) computing the norm in
    its prologue, checked on random inputs against the family's reference; or why not."""
    from kernelsmith.frontends.decorator import _differs_from_op

    if norm.op != "rmsnorm" or norm.status != "found":
        return f"the norm is not a servable rmsnorm ({norm.status}: {norm.reason})"
    if norm.constants.get("weight_offset", 0.0):
        return "Gemma's x * (1 + weight): the decode_matmul prologue has no weight offset"
    x, gamma = norm.inputs
    if x.reshape is not None or site.inputs[0].reshape is not None:
        return "the norm's input or the product's x is reshaped on the way"
    constants = {**site.constants, "prologue": "rmsnorm", "eps": norm.constants["eps"]}
    inputs = [x, *site.inputs[1:], gamma]
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
    device = _value(x.node).device
    generator = generators.setdefault(device, torch.Generator(device=device))
    generator.manual_seed(0)
    samples = {n: _sample(_value(n), generator) for n in outside}
    bound = tuple(samples[i.node] if i.reshape is None else samples[i.node].reshape(i.reshape) for i in inputs)
    try:
        with torch.no_grad():
            produced = _region_module(gm, region, outside)(*(samples[n] for n in outside))
            problem = _differs_from_op(get_op(OP), spec, bound, produced)
    except Exception as exc:  # a region that cannot run on random inputs: not this site
        problem = f"{type(exc).__name__}: {exc}"
    if problem:
        return f"the norm and the product do not compute the fused op: {problem}"
    return dataclasses.replace(site, inputs=inputs, constants=constants, spec=spec, prologue=list(norm.region))


def decode_spec(inputs: list[torch.Tensor], constants: dict[str, object]) -> OpSpec | str:
    """The ``decode_matmul`` spec of a recognized ``matmul`` site (its inputs as meta tensors,
    strides kept, and the match's constants), or why it is none: the family's own reason
    (another layout, too many rows, a non-contiguous input, an unsupported dtype)."""
    try:
        return get_op(OP).spec_for(*inputs, **constants)
    except UnsupportedWorkload as exc:
        return str(exc)


__all__ = ["OP", "candidate_regions", "decode_rows", "decode_spec", "prologue_norms", "with_prologue"]
