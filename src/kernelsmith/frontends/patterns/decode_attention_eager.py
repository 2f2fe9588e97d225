"""Decode attention sites in the *eager* spelling: the attention written out as two matmuls and a
softmax instead of one SDPA call. Hugging Face models run it with ``attn_implementation="eager"``
(transformers' ``eager_attention_forward``), and many older or custom models are written so::

    key_states = repeat_kv(key, n_rep); value_states = repeat_kv(value, n_rep)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    attn_weights = attn_weights + causal_mask                           # optional: an additive float mask
    attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = F.dropout(attn_weights, p=dropout, training=training)  # p 0 or eval: the identity
    attn_output = torch.matmul(attn_weights, value_states)

That is the SDPA call of :mod:`~kernelsmith.frontends.patterns.decode_attention` written out, and
a site here is a site there: the same inputs (``q``, the two caches read in place under
``repeat_kv``'s views, and the lengths or the mask), the same layouts, the same check, through
that module's helpers. The region the kernel replaces runs from the views to the second matmul;
the ``transpose(1, 2).contiguous()`` after it stays.

How a site is found (:func:`site`), from each softmax of the graph:

1. forward: the softmax, then at most one dtype cast (``.to(dtype)``) and one dropout that is the
   identity (``p == 0`` or ``training=False``, in either order), then ``matmul(weights, value)``:
   every one of them with that one user (the weights returned to the caller, as
   ``output_attentions=True`` does, are another user: refused, since the kernel never forms them);
2. backward: the softmax over the last dim of ``scores [+ mask]`` (either order), the scores
   ``matmul(q, key.transpose(2, 3))`` times a constant (``* s``, ``s *`` or ``/ s``; none is
   ``s = 1``), ``key`` and ``value`` ``repeat_kv`` of a ``(B, Hk, L, D)`` cache or a tensor of
   ``q``'s heads (the decode attention module's ``_operand``);
3. the mask: none (a dynamic cache, one new token); or, as for SDPA, built in the graph from the
   query positions ``P`` and constants only (transformers' ``eager_mask`` is ``torch.where(causal,
   0, finfo.min)`` over the boolean causal mask): the static layout, lengths ``P[-1] + 1``; or
   any other float mask of shape ``(B | 1, 1, Sq | 1, L)`` that is an input of the graph (such as
   ``generate()``'s) or ``torch.where(c, 0, finfo.min)`` in it (a padding mask): the masked layout,
   reading ``mask > finfo(mask.dtype).min / 2`` (:func:`visible_where_additive`), computed on the
   device in the rewritten graph (a mask the graph computes another way is refused: its values
   may be neither 0 nor hidden, and the check below samples the mask, not what computes it);
4. the check, the decode attention module's: the region (with the mask's nodes from ``P``, for
   the static layout) runs on random ``q`` and caches and must compute the family's op within its
   tolerance, the float32 softmax and the cast to ``q``'s dtype included (their rounding is the
   check's to judge); for the masked layout on random masks in the additive spelling
   (:func:`additive_mask`: 0 where visible, ``finfo.min`` or ``-inf`` where not) while the family
   reads them converted. A region that adds the mask in another place, scales it, or reads it
   another way fails there and is refused.

Why the conversion ``visible iff mask > finfo(dtype).min / 2`` is exact for Hugging Face's masks:
transformers writes exactly 0 where a key is visible and ``finfo(dtype).min`` (older code:
``-inf``) where it is not, nothing in between (``eager_mask``; 4.x's
``_prepare_4d_causal_attention_mask_with_cache_position`` and ``AttentionMaskConverter`` fill with
``finfo.min`` too). A hidden score becomes ``s + finfo.min``, which is at most ``finfo.min / 2``
for any score that is not itself near the float range (rounded in bf16 or fp16 it stays below the
threshold or becomes ``-inf``), and the float32 softmax subtracts the row's maximum, a visible
key's finite score: ``exp(s + finfo.min - max)`` underflows to exactly 0. So eager's weights are
exactly 0 at the hidden keys and the softmax of the visible ones elsewhere: the family's math.
What the check cannot see is the data a mask input holds at run time (the graph proves nothing
about it): a mask with other values (a soft bias such as ALiBi, or ``-1e4`` for hidden keys)
would be read as "visible" where eager weighs it. So the rewritten graph checks the values where
it reads them, on the device (:func:`visible_where_additive`: a device-side assert, no host
sync): any value other than 0 or hidden is an error, never a wrong answer. Left unchecked: a row
that hides every key is eager's mean of the values where the family gives 0 (no information
either way; it does not occur in Hugging Face's decoder masks, where the new token sees itself).

Refused (the original code runs, logged at debug level): a dropout with ``p > 0`` in training, a
scaling that is not a constant number (a tensor), a softmax over another dim, a mask added after
the softmax, any node of the region with a user outside it (the weights returned), a boolean or
per-head mask, a float mask the graph computes other than ``torch.where(c, 0, finfo.min)`` (and
not from the positions), several new tokens without a mask, and what the family's ``spec_for``
refuses. The
cache writes before the attention stay with Inductor: this spelling's sites never fold them
(``write_kv``, which :data:`~kernelsmith.frontends.patterns.decode_attention.FOLD_CACHE_WRITES`
turns on for SDPA sites, is not offered here), so a static cache here is the read-only site.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import fx

from kernelsmith.frontends._backend_sites import OpInput, Site, _target_name, _value
from kernelsmith.frontends.patterns.decode_attention import (
    Refused,
    _checked_site,
    _operand,
    _static,
    assert_on_device,
    lengths_from_positions,
    mask_shape_problem,
    positions_of,
)

SOFTMAX = "softmax"  # torch.softmax, F.softmax and Tensor.softmax: the node a site is looked for from
_MATMUL = "matmul"  # torch.matmul, Tensor.matmul and the @ operator (operator.matmul)
_ADDS = frozenset({"add", "__add__"})
_MULS = frozenset({"mul", "__mul__"})
_DIVS = frozenset({"truediv", "div", "__truediv__"})
# Views and copies that keep a mask's values (never a dtype cast: that changes finfo.min)
_VALUE_VIEWS = frozenset({"getitem", "expand", "contiguous", "clone", "reshape", "view", "unsqueeze"})


def visible_where_additive(mask: torch.Tensor, hidden_at_most: float, shape: tuple[int, ...]) -> torch.Tensor:
    """The masked layout's boolean ``(B, 1, Sq, L)`` mask (a broadcast view) of an additive one:
    visible where the value is above ``hidden_at_most`` (``finfo.min / 2``: see the module
    docstring for why that is exact for Hugging Face's masks). Device ops, which the rewritten
    graph computes right before the kernel.

    The conversion is exact only for a mask of zeros and hidden values; a mask passed in by the
    caller is data nothing in the graph describes, and a soft bias (ALiBi's slopes, a -1e4 for
    hidden keys) would be read as visible: a wrong answer. So the values are checked where they
    are read, on the device, with no host sync (the step stays CUDA-graph capturable): any other
    value fails a device-side assert (a clear error, never a wrong answer)."""
    assert_on_device((mask == 0) | (mask <= hidden_at_most),
                     "the additive attention mask holds a value other than 0 and finfo.min (a soft bias?); "
                     "this site cannot read it")  # fmt: skip
    return (mask > hidden_at_most).expand(shape)


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``visible`` (bool) in the additive spelling of ``dtype``: 0 where visible and, where not,
    ``finfo(dtype).min`` (transformers' value) at even key positions and ``-inf`` (other code's) at
    odd ones, so that the check sees both."""
    keys = torch.arange(visible.shape[-1], device=visible.device)
    hidden = torch.where(keys % 2 == 0, torch.finfo(dtype).min, -math.inf).to(dtype)
    return torch.where(visible, torch.zeros((), dtype=dtype, device=visible.device), hidden)


def site(gm: fx.GraphModule, softmax: fx.Node, order: dict[fx.Node, int], taken: set[fx.Node],
         generators: dict[torch.device, torch.Generator]) -> Site:  # fmt: skip
    """The ``decode_attention`` site whose softmax is ``softmax`` (see the module docstring), or Refused."""
    _check_softmax(softmax)
    after, output = _to_values_matmul(softmax)
    scores, mask, add = _split_mask(softmax.args[0])
    product, scale, scaling = _scores(scores)
    q_node, transposed = product.args
    q = _value(q_node)
    if not isinstance(q_node, fx.Node) or not isinstance(q, torch.Tensor) or q.dim() != 4 or not _static(q):
        raise Refused("q is not a 4-D tensor of static shape")
    batch, heads, q_len, _ = q.shape
    assert isinstance(transposed, fx.Node)  # (checked by _scores)
    key = _operand(transposed.args[0], transposed, heads, False, taken)
    value = _operand(output.args[1], output, heads, False, taken)
    region = sorted({*key.views, transposed, product, *scaling, *add, softmax, *after, *value.views, output},
                    key=order.__getitem__)  # fmt: skip
    _only_used_inside(region, output, taken)
    operands = [OpInput(q_node), OpInput(key.cache), OpInput(value.cache)]
    if mask is None:
        if q_len != 1:
            raise Refused(f"no mask over {q_len} new tokens: each would see every position (not causal decoding)")
        return _checked_site(gm, output, region, [], operands, "dynamic", scale, order, generators)
    mask_value = _value(mask)
    if not isinstance(mask_value, torch.Tensor) or not mask_value.dtype.is_floating_point:
        raise Refused(f"the mask {mask.name} added to the scores is not a float tensor")
    try:
        positions, mask_nodes = positions_of(mask, q_len, order)
        lengths = OpInput(positions, derive=lengths_from_positions, derive_args=(batch,))
        return _checked_site(gm, output, region, mask_nodes, [*operands, lengths], "static", scale, order,
                             generators)  # fmt: skip
    except Refused as why:  # not the positions' causal prefix: the mask itself, converted
        read = _additive_mask_input(mask, (batch, 1, q_len, _value(key.cache).shape[2]), why)
        return _checked_site(gm, output, region, [], [*operands, read], "masked", scale, order, generators)


def _check_softmax(softmax: fx.Node) -> None:
    """A softmax over the last of four dims, of a tensor, in float32 or the input's dtype."""
    if len(softmax.args) > 2 or set(softmax.kwargs) - {"dim", "dtype", "_stacklevel"}:
        raise Refused("the softmax is called with arguments the pattern cannot read")
    dim = softmax.args[1] if len(softmax.args) > 1 else softmax.kwargs.get("dim")
    value = _value(softmax)
    if not isinstance(value, torch.Tensor) or value.dim() != 4 or not isinstance(softmax.args[0], fx.Node):
        raise Refused("the softmax is not over 4-D attention scores")
    if isinstance(dim, bool) or not isinstance(dim, int) or dim % 4 != 3:
        raise Refused(f"the softmax is over dim {dim!r}, not the keys' (-1)")


def _to_values_matmul(softmax: fx.Node) -> tuple[list[fx.Node], fx.Node]:
    """(the cast and dropout after the softmax, the ``matmul(weights, value)``): step 1."""
    after: list[fx.Node] = []
    current = softmax
    while True:
        users = list(current.users)
        if len(users) != 1:
            raise Refused(f"the attention weights {current.name} have {len(users)} users, not one (returned to "
                          "the caller, as output_attentions=True does?)")  # fmt: skip
        user = users[0]
        name = _target_name(user)
        if name == _MATMUL and user.args[:1] == (current,) and len(user.args) == 2 and not user.kwargs:
            return after, user
        seen = {_target_name(n) for n in after}
        if name == "to" and "to" not in seen and _casts_only(user, current):
            after.append(user)
        elif name == "dropout" and "dropout" not in seen and user.args[:1] == (current,):
            _check_dropout(user)
            after.append(user)
        else:
            raise Refused(f"{user.name} ({name}) reads the attention weights {current.name} before the matmul "
                          "with the values (a mask added after the softmax?)")  # fmt: skip
        current = user


def _casts_only(node: fx.Node, source: fx.Node) -> bool:
    """``source.to(dtype)`` (positional or keyword), nothing else changed."""
    args = node.args[1:]
    dtypes = [*args, *node.kwargs.values()]
    return (node.op == "call_method" and node.args[:1] == (source,) and len(dtypes) == 1
            and set(node.kwargs) <= {"dtype"} and isinstance(dtypes[0], torch.dtype))  # fmt: skip


def _check_dropout(node: fx.Node) -> None:
    """Refused unless the dropout is the identity (``p == 0``, or not training) and not in place."""
    # F.dropout(input, p=0.5, training=True, inplace=False); torch.dropout(input, p, train)
    names = ("input", "p", "train") if node.target is torch.dropout else ("input", "p", "training", "inplace")
    if len(node.args) > len(names) or set(node.kwargs) - set(names):
        raise Refused("the dropout is called with arguments the pattern cannot read")
    given = {**dict(zip(names, node.args, strict=False)), **node.kwargs}
    p = given.get("p", 0.5)
    training = given.get("training", given.get("train", True))
    if any(isinstance(v, fx.Node) for v in (p, training, given.get("inplace"))):
        raise Refused("the dropout's p or training is a tensor, not a constant")
    if given.get("inplace"):
        raise Refused("the dropout works in place")
    if p != 0 and training:
        raise Refused(f"dropout p={p} in training: the weights are random (the kernel has no dropout)")


def _split_mask(node: Any) -> tuple[fx.Node, fx.Node | None, list[fx.Node]]:
    """``(scores, mask, [the add])`` of the softmax's input ``scores + mask`` (either order), or
    ``(scores, None, [])`` where nothing is added."""
    if not isinstance(node, fx.Node):
        raise Refused("the softmax's input is not a tensor")
    if _target_name(node) not in _ADDS or node.op not in ("call_function", "call_method"):
        return node, None, []
    if len(node.args) != 2 or node.kwargs:
        raise Refused(f"{node.name} adds with arguments the pattern cannot read (alpha?)")
    why = Refused(f"the softmax's input {node.name} is not the scores q @ k^T plus a mask tensor")
    for scores, mask in (node.args, node.args[::-1]):
        if isinstance(scores, fx.Node) and isinstance(mask, fx.Node):
            try:
                _scores(scores)
            except Refused as refused:  # the side that looks like the scores says why it is not
                if _target_name(scores) in {*_MULS, *_DIVS, _MATMUL}:
                    why = refused
                continue
            return scores, mask, [node]
    raise why


def _scores(node: fx.Node) -> tuple[fx.Node, float, list[fx.Node]]:
    """``(matmul(q, key.transpose(2, 3)), the scale, [the scaling node])`` of ``node``: the matmul
    times a number (either order), divided by one, or on its own (scale 1)."""
    name = _target_name(node)
    scaling: list[fx.Node] = []
    scale: Any = 1.0
    product: Any = node
    if name in _MULS or name in _DIVS:
        if len(node.args) != 2 or node.kwargs:
            raise Refused(f"{node.name} scales with arguments the pattern cannot read")
        a, b = node.args
        if isinstance(a, fx.Node) and isinstance(b, fx.Node):
            raise Refused(f"{node.name} scales the scores by a tensor, not a constant number")
        product, factor = (b, a) if name in _MULS and not isinstance(a, fx.Node) else (a, b)
        if isinstance(factor, bool) or not isinstance(factor, int | float):  # a SymFloat, a complex...
            raise Refused(f"the scores are scaled by {factor!r}, not a constant number")
        if name in _DIVS and factor == 0:
            raise Refused("the scores are divided by 0")
        scale, scaling = (1.0 / factor if name in _DIVS else float(factor)), [node]
    if not isinstance(product, fx.Node) or _target_name(product) != _MATMUL or len(product.args) != 2:
        raise Refused(f"the softmax is not over q @ k^T (scaled by a constant): {getattr(product, 'name', product)}")
    transposed = product.args[1]
    if (not isinstance(transposed, fx.Node) or _target_name(transposed) != "transpose"
            or len(transposed.args) != 3 or transposed.kwargs
            or not all(isinstance(d, int) for d in transposed.args[1:])
            or {d % 4 for d in transposed.args[1:]} != {2, 3}):  # type: ignore[operator]  # fmt: skip
        raise Refused(f"{product.name}'s second operand is not key.transpose(2, 3)")
    return product, scale, scaling


def _only_used_inside(region: list[fx.Node], output: fx.Node, taken: set[fx.Node]) -> None:
    """Refused unless every node of the region but its output is read only inside it (the rewrite
    erases them) and none is another site's."""
    inside = set(region)
    if inside & taken:
        raise Refused("a node of the attention belongs to another site")
    for node in region:
        outside = [u.name for u in node.users if u not in inside]
        if node is not output and outside:
            raise Refused(f"{node.name} is also read by {', '.join(outside)} (the weights or scores returned?)")


def _additive_mask_input(mask: fx.Node, shape: tuple[int, ...], why: Refused) -> OpInput:
    """The additive mask as the masked layout's boolean input (converted and broadcast to
    ``shape`` on the device), or Refused."""
    value = _value(mask)
    if value.dim() != 4 or not _static(value):
        raise Refused(f"{why}; and the mask is not a 4-D tensor of static shape")
    problem = mask_shape_problem(value, shape)
    if problem:
        raise Refused(f"{why}; and {problem}")
    hidden_at_most = torch.finfo(value.dtype).min / 2
    problem = _values_problem(mask, hidden_at_most)
    if problem:
        raise Refused(f"{why}; and {problem}")
    return OpInput(mask, derive=visible_where_additive, derive_args=(hidden_at_most, shape))


def _values_problem(mask: fx.Node, hidden_at_most: float) -> str | None:
    """Why the conversion ``mask > hidden_at_most`` is not known to read ``mask`` right, or None:
    under value-preserving views the mask is an input of the graph (the data a caller passes,
    whose values the rewritten graph checks on the device) or ``torch.where(c, 0, h)`` (either order) with ``h <=
    hidden_at_most`` a constant (``eager_mask``'s spelling: 0 or ``h``, nothing else). A mask the
    graph computes otherwise (a bias, a scaled mask) may hold values the conversion misreads,
    and the check, which samples the mask where the site reads it, could not tell."""
    node = mask
    while node.op in ("call_function", "call_method") and _target_name(node) in _VALUE_VIEWS:
        source = node.args[0]
        if not isinstance(source, fx.Node):
            break
        node = source
    if node.op in ("placeholder", "get_attr"):
        return None
    if _target_name(node) == "where" and len(node.args) == 3 and not node.kwargs:
        _, if_true, if_false = node.args
        for visible, hidden in ((if_true, if_false), (if_false, if_true)):
            if _is_zero(visible) and isinstance(hidden, int | float) and hidden <= hidden_at_most:
                return None
    return (f"the mask {mask.name} is computed in the graph ({node.name}), not an input or torch.where(c, 0, "
            "finfo.min): nothing proves its values 0 or hidden")  # fmt: skip


def _is_zero(value: Any) -> bool:
    """A constant 0, or a ``torch.zeros`` node (``eager_mask`` spells its 0 ``torch.zeros(())``)."""
    if isinstance(value, fx.Node):
        return _target_name(value) in ("zeros", "zeros_like") and value.op == "call_function"
    return isinstance(value, int | float) and not isinstance(value, bool) and value == 0


__all__ = ["SOFTMAX", "additive_mask", "site", "visible_where_additive"]
