"""Decode attention sites: where the compile backend routes an SDPA call over a KV cache to
``decode_attention`` (:mod:`kernelsmith.ops.decode_attention`).

A decoding step of a Hugging Face Llama-family model with a ``StaticCache`` (and of plain modules
written the same way) captures, per layer::

    k_cache.index_copy_(2, cache_position, k_new)        # the new token's keys written first
    v_cache.index_copy_(2, cache_position, v_new)
    key = k_cache[:, :, None].expand(B, Hk, G, L, D).reshape(B, H, L, D)   # repeat_kv (G = H / Hk)
    value = ...                                           # the same for v_cache
    out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=s)

with ``mask`` a ``(B | 1, 1 | H, Sq, L)`` boolean built *in the graph* from the query positions
(transformers 5: ``q_arange = arange(Sq) + offset``, ``mask = arange(L)[None, None, None, :] <=
q_arange[None, None, :, None]``). That is exactly the family's static cache with every sequence
holding ``positions[-1] + 1`` positions: query ``i`` at position ``p_i`` sees keys ``0 .. p_i``.
So a site's inputs are ``q``, the two cache tensors (read in place, whatever ``repeat_kv`` did:
query head ``h`` reads key/value head ``h // G``, as the family does) and the lengths, derived
from the positions tensor ``P`` by :func:`lengths_from_positions` in the rewritten graph (a
device op: no host sync, so the step stays CUDA-graph capturable). Without a mask and with one new
token, every position is valid: a dynamic cache (``DynamicCache``'s ``torch.cat``-grown tensors).

How a site is found (:func:`sites`), for each SDPA call:

1. ``dropout_p`` 0 and ``is_causal`` False (torch's ``is_causal`` aligns the causal mask top-left,
   which over a cache is not decoding), 4-D ``q`` with few rows per key/value head;
2. ``key`` and ``value``: a tensor of ``q``'s heads, or ``repeat_kv`` of one (the ``getitem`` /
   ``expand`` / ``reshape`` views, which the site removes when nothing else uses them), or fewer
   heads with ``enable_gqa=True``;
3. the mask: walking back from it, the nearest integer tensor ``P`` of ``Sq`` elements that a fresh
   op computes (``add`` or ``arange``: not a view of a tensor mutated later, such as the cache's
   ``cumulative_length`` incremented in place before the attention) such that the mask depends
   on ``P`` and constants only; for ``Sq > 1``, ``P`` must be ``arange(Sq) + x`` (consecutive
   positions). The mask's nodes stay in the graph (Hugging Face computes one mask for every
   layer; Inductor drops it once no attention uses it). Where there is no such ``P``, or the
   check below fails for it, a boolean mask of shape ``(B | 1, 1, Sq | 1, L)`` is the *masked*
   layout's input as it is (broadcast by :func:`broadcast_mask`): the kernels read it and scan the
   whole cache. That is ``generate()``'s case: it prepares its 4-D mask, padding included,
   outside the compiled step and passes it in; and a padding mask or per-sequence lengths built
   in the graph;
4. **the check**: the graph's nodes from the site's inputs to the SDPA's output, run as a module
   of their own on random ``q`` and caches, must compute the family's op as well as PyTorch does
   (the same check as every other site): for a static cache on ``P = arange(Sq) + o`` at the
   first, a middle and the last offset the cache allows, the positions past each length filled
   with the family's stale keys and values (a mask that shows a stale position, hides a valid one
   or is not a causal prefix fails, whatever its spelling, and falls back to being read as a
   mask); for a masked one on a random mask.

Folding the cache writes (``write_kv``; on by default, :data:`FOLD_CACHE_WRITES`)
---------------------------------------------------------------------------------
The two ``index_copy_`` writes of the new keys and values before a static-cache site are the
family's ``write_kv`` layout (one pass stores the new rows and attends).
:mod:`~kernelsmith.frontends.patterns.decode_cache_writes` takes them into the site where the
graph proves they write the rows the mask shows (at ``P``, or at an index proved equal to it:
Hugging Face's StaticCache in its first layer only) and nothing reads the caches in between;
the folded site is served through ``kernelsmith::kernel_mutating`` and asserts on the device that
every position written is a row of the cache. Anything else keeps the read-only site above, the
writes left to Inductor. :data:`FOLD_CACHE_WRITES` (True) is the switch: set False, every
static-cache site is the read-only one (the tests of the read-only site set it so).

The same attention spelled out as two matmuls and a softmax over an additive float mask (Hugging
Face's ``attn_implementation="eager"``) is matched by
:mod:`~kernelsmith.frontends.patterns.decode_attention_eager` into the same sites, through these
helpers and this check.

Refused (the original code runs): additive float masks of an SDPA call and boolean ones of
another shape (per head: layouts the family does not know), ``is_causal=True``, several new tokens without a mask,
an input mutated before the attention, and whatever the family's ``spec_for`` refuses (head dim,
too many rows per key/value head, strides).

A position outside the cache is an error, never a wrong answer: at a read-only site the cache
write before the attention (``index_copy_``) fails, as in eager; a folded site has none left, and
checks the positions on the device instead
(:func:`~kernelsmith.frontends.patterns.decode_cache_writes.first_position`).
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from kernelsmith.frontends._backend_sites import (
    OpInput,
    Site,
    _mutates,
    _region_inputs,
    _region_module,
    _target_name,
    _value,
)
from kernelsmith.ops import UnsupportedWorkload, get_op
from kernelsmith.ops.decode_attention import STALE_KEY, STALE_VALUE
from kernelsmith.spec import OpSpec

log = logging.getLogger("kernelsmith.frontends.backend")  # sites are the backend's business

OP = "decode_attention"

_SDPA = "scaled_dot_product_attention"
_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_FRESH = frozenset({"add", "__add__", "arange"})  # ops whose result is a new tensor, never a view
_REPEAT_VIEWS = ("getitem", "expand", "reshape")  # repeat_kv, read backwards: reshape(expand(x[:, :, None]))
# Whether static-cache sites take the index_copy_ writes before them (the module docstring's
# "Folding the cache writes": decode_cache_writes), served through kernelsmith::kernel_mutating. On by default; False
# keeps every static-cache site read-only, its writes left to Inductor.
FOLD_CACHE_WRITES = True


class Refused(Exception):
    """An SDPA call that is not a decode attention site, and why (logged, never raised out)."""


@dataclass(frozen=True)
class _Operand:
    """A key or value argument: the cache tensor's node and the repeat_kv views on top of it."""

    cache: fx.Node
    views: tuple[fx.Node, ...]


def lengths_from_positions(positions: torch.Tensor, batch: int) -> torch.Tensor:
    """The static cache's ``(B,)`` int64 lengths: every sequence holds the positions up to its last
    new token's, ``positions[-1] + 1``. A device op on a device tensor (no host sync), which the
    rewritten graph computes right before the kernel."""
    return (positions.reshape(-1)[-1:] + 1).to(torch.int64).expand(batch).contiguous()


def sites(gm: fx.GraphModule, order: dict[fx.Node, int], taken: set[fx.Node],
          generators: dict[torch.device, torch.Generator]) -> list[Site]:  # fmt: skip
    """The ``decode_attention`` sites of ``gm`` in graph order (see the module docstring, and
    :mod:`~kernelsmith.frontends.patterns.decode_attention_eager` for the attention spelled out as
    matmuls and a softmax); an SDPA call or softmax that is not one is logged at debug level with
    the reason and left alone."""
    from kernelsmith.frontends.patterns import decode_attention_eager as eager  # (it imports this module)

    found: list[Site] = []
    for node in gm.graph.nodes:
        if node in taken or node.op not in ("call_function", "call_method"):
            continue
        name = _target_name(node)
        build: Callable[..., Site]
        if name == _SDPA and node.op == "call_function":
            build = _site
        elif name == eager.SOFTMAX:  # the attention spelled out: Hugging Face's eager_attention_forward
            build = eager.site
        else:
            continue
        try:
            site = build(gm, node, order, taken, generators)
        except Refused as why:
            log.debug("%s is not a decode attention site: %s", node.name, why)
            continue
        found.append(site)
        taken |= set(site.region)
    return found


def _site(gm: fx.GraphModule, sdpa: fx.Node, order: dict[fx.Node, int], taken: set[fx.Node],
          generators: dict[torch.device, torch.Generator]) -> Site:  # fmt: skip
    args = _arguments(sdpa)
    if _constant(args.get("dropout_p"), 0.0) != 0.0 or _constant(args.get("is_causal"), False) is not False:
        raise Refused("dropout or is_causal (torch's causal mask is top-left aligned: not a decode step)")
    scale = _constant(args.get("scale"), None)
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, int | float)):
        raise Refused(f"the scale {scale!r} is not a number")
    gqa = _constant(args.get("enable_gqa"), False)
    q_node = args.get("query")
    q = _value(q_node)
    if not isinstance(q_node, fx.Node) or not isinstance(q, torch.Tensor) or q.dim() != 4 or not _static(q):
        raise Refused("q is not a 4-D tensor of static shape")
    batch, heads, q_len, _ = q.shape
    key, value = (_operand(args.get(role), sdpa, heads, bool(gqa), taken) for role in ("key", "value"))
    region = [*key.views, *value.views, sdpa]
    mask = args.get("attn_mask")
    if mask is None and q_len != 1:
        raise Refused(f"no mask over {q_len} new tokens: each would see every position (not causal decoding)")
    operands = [OpInput(q_node), OpInput(key.cache), OpInput(value.cache)]
    if mask is None:
        return _checked_site(gm, sdpa, region, [], operands, "dynamic", scale, order, generators)
    try:
        positions, mask_nodes = _positions(mask, q_len, order)
        if FOLD_CACHE_WRITES:
            from kernelsmith.frontends.patterns.decode_cache_writes import write_kv_site  # (it imports this module)

            try:
                return write_kv_site(gm, sdpa, region, mask_nodes, operands, positions, scale, order, generators)
            except Refused as why:  # the read-only site, the writes left to Inductor
                log.debug("%s keeps its cache writes: %s", sdpa.name, why)
        lengths = OpInput(positions, derive=lengths_from_positions, derive_args=(batch,))
        return _checked_site(gm, sdpa, region, mask_nodes, [*operands, lengths], "static", scale, order, generators)
    except Refused as why:  # not the positions' causal prefix: the mask itself, where the kernels can read it
        read = _mask_input(mask, (batch, 1, q_len, _value(key.cache).shape[2]), why)
        return _checked_site(gm, sdpa, region, [], [*operands, read], "masked", scale, order, generators)


def assert_on_device(holds: torch.Tensor, message: str) -> None:
    """Fail with ``message`` unless every element of the boolean ``holds`` is True, without a host
    sync (the step stays CUDA-graph capturable): a device-side assert, ``torch._assert_async`` of
    ``holds.all()``, which the rewritten graph runs where it reads the values checked. On a CPU
    tensor a failure raises a RuntimeError at once; on a CUDA one it is a device-side assert,
    reported at the next synchronization (and, as every device-side assert, it leaves the CUDA
    context unusable: loud, never a wrong answer). Inductor keeps it (it has side effects)."""
    torch._assert_async(holds.all(), f"kernelsmith decode attention: {message}")


def _checked_site(gm: fx.GraphModule, sdpa: fx.Node, region: list[fx.Node], mask_nodes: list[fx.Node],
                  inputs: list[OpInput], kind: str, scale: Any, order: dict[fx.Node, int],
                  generators: dict[torch.device, torch.Generator], write_kv: bool = False,
                  equal_to: dict[fx.Node, fx.Node] | None = None) -> Site:  # fmt: skip
    """The site of layout ``kind`` on ``inputs`` (``write_kv``: the caches' writes in ``region``),
    its spec from the family and the check passed (``equal_to``: nodes the region reads that are
    proved equal to an input, sampled as that input)."""
    caches = {inputs[1].node, inputs[2].node}  # written in place before the attention, by design
    for op_input in inputs:
        node = op_input.node
        if node not in caches and any(_mutates(u) and u.args[:1] == (node,) for u in node.users):
            raise Refused(f"{node.name} is changed in place before the attention reads it")
    constants: dict[str, Any] = {"cache": kind, "scale": None if scale is None else float(scale)}
    if write_kv:
        constants["write_kv"] = True
    try:
        spec = get_op(OP).spec_for(*(_meta_of(i) for i in inputs), **constants)
    except UnsupportedWorkload as exc:
        raise Refused(str(exc)) from None
    constants["scale"] = spec.const("scale")
    nodes = sorted({*region, *mask_nodes}, key=order.__getitem__)
    _check(gm, nodes, inputs, spec, kind, generators, equal_to or {})
    q = _value(inputs[0].node)
    return Site(OP, sdpa, [n for n in nodes if n in region], inputs, constants, spec, bool(q.requires_grad))


def _arguments(sdpa: fx.Node) -> dict[str, Any]:
    if len(sdpa.args) > len(_SDPA_ARGS) or set(sdpa.kwargs) - set(_SDPA_ARGS):
        raise Refused("scaled_dot_product_attention is called with arguments the pattern cannot read")
    return {**dict(zip(_SDPA_ARGS, sdpa.args, strict=False)), **sdpa.kwargs}


def _constant(value: Any, default: Any) -> Any:
    if value is None:
        return default
    if isinstance(value, fx.Node):
        raise Refused(f"{value.name} is a tensor where a constant is expected")
    return value


def _static(value: torch.Tensor) -> bool:
    return all(type(s) is int for s in (*value.shape, *value.stride()))


def _operand(node: Any, sdpa: fx.Node, heads: int, gqa: bool, taken: set[fx.Node]) -> _Operand:
    """The cache under ``repeat_kv(cache, G)``, or the tensor itself (``G`` = 1, or ``enable_gqa``)."""
    if not isinstance(node, fx.Node) or not isinstance(_value(node), torch.Tensor):
        raise Refused("the key or value is not a tensor")
    views: list[fx.Node] = []
    current = node
    for name in reversed(_REPEAT_VIEWS):  # reshape, then expand, then getitem
        if current.op not in ("call_function", "call_method") or _target_name(current) != name:
            break
        views.append(current)
        current = current.args[0]  # type: ignore[assignment]
    if len(views) == len(_REPEAT_VIEWS):
        cache, expanded = _value(current), _value(views[1])
        if (not isinstance(cache, torch.Tensor) or cache.dim() != 4 or expanded.dim() != 5
                or tuple(expanded.shape) != (cache.shape[0], cache.shape[1], heads // cache.shape[1], *cache.shape[2:])
                or not _inserts_dim_2(views[2].args[1:])):  # fmt: skip
            raise Refused(f"{node.name} is not repeat_kv of a (B, Hk, L, D) cache")
        users_allowed = (sdpa, *views[:-1])  # reshape's user is the attention, expand's the reshape...
        if (
            any(set(v.users) != {allowed} for v, allowed in zip(views, users_allowed, strict=True))
            or set(views) & taken
        ):
            raise Refused(f"the repeat_kv views of {current.name} are used elsewhere")
        return _Operand(current, tuple(reversed(views)))
    value = _value(node)
    if value.dim() != 4 or not _static(value) or (value.shape[1] != heads and not gqa):
        raise Refused(f"{node.name} is not a (B, H, L, D) cache (or fewer heads with enable_gqa)")
    return _Operand(node, ())


def broadcast_mask(mask: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The mask as the ``(B, 1, Sq, L)`` view the masked layout reads (stride 0 where it broadcasts)."""
    return mask.expand(shape)


def _mask_input(mask: fx.Node, shape: tuple[int, ...], why: Refused) -> OpInput:
    """The boolean mask as the masked layout's input (broadcast to ``shape`` on the way), or the
    refusal ``why`` when the kernels cannot read it either."""
    value = _value(mask)
    if not isinstance(value, torch.Tensor) or value.dtype != torch.bool or value.dim() != 4 or not _static(value):
        raise why
    problem = mask_shape_problem(value, shape)
    if problem:
        raise Refused(f"{why}; and {problem}")
    if tuple(value.shape) == shape:
        return OpInput(mask)
    return OpInput(mask, derive=broadcast_mask, derive_args=(shape,))


def mask_shape_problem(value: torch.Tensor, shape: tuple[int, ...]) -> str | None:
    """Why the 4-D mask ``value`` does not broadcast as the masked layout's ``(B, 1, Sq, L)``
    ``shape`` (``(B | 1, 1, Sq | 1, L)``: one mask for every head), or None."""
    if (
        value.shape[1] != 1
        or value.shape[3] != shape[3]
        or any(n not in (1, want) for n, want in zip(value.shape, shape, strict=True))
    ):
        return f"the mask's shape {tuple(value.shape)} is not (B | 1, 1, Sq | 1, L) = {shape}"
    return None


def _inserts_dim_2(index: tuple[Any, ...]) -> bool:
    """Whether ``x[index]`` is ``x[:, :, None]`` (perhaps with more full slices or an ellipsis)."""
    if len(index) != 1 or not isinstance(index[0], tuple):
        return False
    items = list(index[0])
    while items and (items[-1] is Ellipsis or items[-1] == slice(None)):
        items.pop()
    return items == [slice(None), slice(None), None]


def _positions(mask: Any, q_len: int, order: dict[fx.Node, int]) -> tuple[fx.Node, list[fx.Node]]:
    """``(P, the mask's nodes from P on)`` for a boolean mask: see step 3 of the module docstring."""
    if not isinstance(mask, fx.Node):
        raise Refused("the mask is not a tensor")
    value = _value(mask)
    if not isinstance(value, torch.Tensor) or value.dtype != torch.bool:
        raise Refused("the mask is not boolean (an additive mask: a layout the decode kernels do not read)")
    return positions_of(mask, q_len, order)


def positions_of(mask: fx.Node, q_len: int, order: dict[fx.Node, int]) -> tuple[fx.Node, list[fx.Node]]:
    """``(P, the mask's nodes from P on)``, whatever the mask's dtype (the eager spelling's
    additive float mask is built from ``P`` too), or Refused: step 3 of the module docstring."""
    ancestors = _ancestors(mask, stop=None)
    candidates = [n for n in ancestors if _fresh_positions(n, q_len)]
    for positions in sorted(candidates, key=order.__getitem__, reverse=True):  # the nearest first
        nodes = _ancestors(mask, stop=positions)
        inputs = [n for n in nodes if n.op in ("placeholder", "get_attr")]
        if not inputs:
            if q_len > 1 and not _consecutive(positions, q_len):
                raise Refused(f"{positions.name} is not arange({q_len}) + an offset: the new tokens' positions "
                              "may not be consecutive")  # fmt: skip
            return positions, [n for n in nodes if n is not positions]
    nearest = max(candidates, key=order.__getitem__) if candidates else None  # what else the mask reads
    names = sorted({n.name for n in _ancestors(mask, stop=nearest) if n.op in ("placeholder", "get_attr")})
    raise Refused(f"the mask depends on {', '.join(names) or 'something'} besides the query positions (a "
                  "padding mask, or per-sequence lengths: only a causal prefix of the cache is a decode_attention "
                  "mask)")  # fmt: skip


def _ancestors(node: fx.Node, stop: fx.Node | None) -> list[fx.Node]:
    """``node`` and everything it is computed from, not looking past ``stop``."""
    seen: dict[fx.Node, None] = {}
    pending = [node]
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen[current] = None
        if current is not stop:
            pending.extend(current.all_input_nodes)
    return list(seen)


def _fresh_positions(node: fx.Node, q_len: int) -> bool:
    value = _value(node)
    return (node.op in ("call_function", "call_method") and _target_name(node) in _FRESH
            and isinstance(value, torch.Tensor) and not value.dtype.is_floating_point
            and value.dtype != torch.bool and value.numel() == q_len)  # fmt: skip


def _consecutive(node: fx.Node, q_len: int) -> bool:
    """``arange(q_len)`` or ``arange(q_len) + x`` (either order)."""

    def is_arange(n: Any) -> bool:
        return isinstance(n, fx.Node) and _target_name(n) == "arange" and n.args == (q_len,)

    if is_arange(node):
        return True
    return node.target in (operator.add, torch.add) and any(is_arange(a) for a in node.args[:2])


def _meta_of(op_input: OpInput) -> torch.Tensor:
    from kernelsmith.frontends._backend_sites import _input_meta

    return _input_meta(op_input)


def _check(gm: fx.GraphModule, nodes: list[fx.Node], inputs: list[OpInput], spec: OpSpec, kind: str,
           generators: dict[torch.device, torch.Generator], equal_to: dict[fx.Node, fx.Node]) -> None:  # fmt: skip
    """Step 4 of the module docstring: the graph's nodes from the inputs to the attention compute
    the family's op (a static cache: at the first, a middle and the last offset; a masked one: on
    a random mask), or the site is refused. A node of ``equal_to`` (a write index proved equal to
    the positions) is given its input's sample."""
    from kernelsmith.frontends.decorator import _differs_from_op

    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    sources = [i.node for i in inputs]
    outside = _region_inputs(nodes, order)
    if set(outside) - set(equal_to) != set(sources):
        extra = sorted(n.name for n in set(outside) - set(sources) - set(equal_to))
        raise Refused(f"the attention also reads {', '.join(extra)}")
    module = _region_module(gm, nodes, outside)
    family = get_op(OP)
    q_len, cache_len = spec.inputs[0].shape[2], spec.inputs[1].shape[2]
    device = _value(inputs[0].node).device
    generator = generators.setdefault(device, torch.Generator(device=device))
    generator.manual_seed(0)
    write_kv = bool(spec.constants.get("write_kv", False))
    offsets = dict.fromkeys((0, (cache_len - q_len) // 2, cache_len - q_len)) if kind == "static" else [0]
    for offset in offsets:
        first: dict[fx.Node, torch.Tensor] = {}  # k and v may be one tensor (one node): one sample
        tensors = [first.setdefault(i.node, _random(_value(i.node), generator)) for i in inputs[:3]]
        if write_kv:  # the new rows
            tensors += [_random(_value(i.node), generator) for i in inputs[3:5]]
        if kind == "static":
            positions = _value(inputs[-1].node)
            tensors.append((torch.arange(q_len, device=device) + offset).to(positions.dtype).reshape(positions.shape))
            # stale from the new tokens on; with write_kv the rows they go to are stale too, so
            # that a write at other rows (or none) leaves them and is caught
            stale = torch.arange(cache_len, device=device) >= offset + (0 if write_kv else q_len)
            tensors[1][:, :, stale] = STALE_KEY
            tensors[2][:, :, stale] = STALE_VALUE
        elif kind == "masked":  # random, with each row's last position seen (no row sees nothing)
            mask = _value(inputs[3].node)
            shape = tuple(mask.shape)
            last = torch.tensor([shape[3] - 1], device=device)
            visible = (torch.rand(shape, generator=generator, device=device) < 0.5).index_fill_(3, last, True)
            if mask.dtype != torch.bool:  # the eager spelling's additive mask, the family reading it converted
                from kernelsmith.frontends.patterns.decode_attention_eager import additive_mask

                visible = additive_mask(visible, mask.dtype)
            tensors.append(visible)
        by_node = dict(zip(sources, tensors, strict=True))
        bound = tuple(
            t if i.derive is None else i.derive(t, *i.derive_args) for i, t in zip(inputs, tensors, strict=True)
        )
        try:
            with torch.no_grad():
                before = tuple(t.clone() for t in bound)  # the region writes the caches (write_kv)
                produced = module(*(by_node[equal_to.get(n, n)] for n in outside))
                problem = _written_differs(family, spec, before, by_node[inputs[1].node], by_node[inputs[2].node])
                problem = problem or _differs_from_op(family, spec, before, produced)
        except Exception as exc:  # a region that cannot run on random inputs is not a site
            problem = f"{type(exc).__name__}: {exc}"
        if problem:
            where = f"at offset {offset}" if kind == "static" else "on a random mask" if kind == "masked" else "here"
            raise Refused(f"{where} the attention does not compute decode_attention: {problem}")


def _written_differs(family: Any, spec: OpSpec, before: tuple[torch.Tensor, ...], k: torch.Tensor,
                     v: torch.Tensor) -> str | None:  # fmt: skip
    """Rule 2 for the region: the caches it left are the family's update of ``before`` bit for
    bit (unchanged where the family writes nothing)."""
    want = family.reference_written(spec, before) if family.written_inputs(spec) else list(before[1:3])
    for name, got, expected in (("key", k, want[0]), ("value", v, want[1])):
        if not torch.equal(got, expected):
            return f"the {name} cache it leaves is not the family's"
    return None


def _random(value: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A standard normal tensor of ``value``'s shape, strides, dtype and device."""
    data = torch.randn(tuple(value.shape), generator=generator, device=value.device)
    return torch.empty_strided(tuple(value.shape), value.stride(), dtype=value.dtype, device=value.device).copy_(data)


__all__ = [
    "FOLD_CACHE_WRITES",
    "OP",
    "assert_on_device",
    "broadcast_mask",
    "lengths_from_positions",
    "mask_shape_problem",
    "positions_of",
    "sites",
]
