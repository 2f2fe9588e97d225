"""Folding a static-cache decode attention site's cache writes into it (``write_kv``): finding the
``index_copy_`` writes of the new keys and values, proving that they write at the mask's
positions, and checking on the device that every position written is a row of the cache.

:mod:`~kernelsmith.frontends.patterns.decode_attention` finds the site (the SDPA call, the caches
under ``repeat_kv``, the positions ``P`` the mask is built from; its module docstring, steps 1 to
4) and, for a static cache with
:data:`~kernelsmith.frontends.patterns.decode_attention.FOLD_CACHE_WRITES` on, asks
:func:`write_kv_site` here for the folded site first. A refusal here leaves the read-only site
there, the writes left to Inductor. The check a folded site passes is that module's (step 4),
with the writes in the region.

Folding the cache writes
------------------------
The two ``index_copy_`` writes before a static-cache site are the family's ``write_kv`` layout
(one pass stores the new rows and attends: the rows are not written by one kernel and read back
by the next). :func:`write_kv_site` takes them into the site when

- each cache has exactly one in-place writer before the attention, ``cache.index_copy_(2, I,
  new)`` (or dim -2) whose result nothing uses, at ``I = P``, the positions node the mask comes
  from, or at an index the graph proves equal to ``P`` (so the rows written are the rows the mask
  shows, the ones the kernel writes): :func:`_equal_values_problem`, below;
- nothing else reads or writes the cache, the new rows or ``P`` between the write and the
  attention (the kernel runs where the attention was: a reader in between would see the old rows);
- the family's ``spec_for`` accepts ``(q, k_cache, v_cache, k_new, v_new, P[0])``: new rows of the
  caches' dtype and shape ``(B, Hk, Sq, D)``, a static cache (``Sq > 1`` needs ``P`` consecutive,
  which decode_attention's step 3 already checked).

Its check runs the writes, the views and the attention as a module on random caches and rows
(the positions at or past each offset stale) and requires both the output and the caches it left
to be the family's (:meth:`~kernelsmith.ops.decode_attention.DecodeAttention.reference_written`,
bit for bit). Anything else keeps the read-only site, the writes left to Inductor.

*An index other than the positions node.* ``I`` and ``P`` are proved equal when both are fresh
integer tensors (an ``add`` or ``arange``, never a view, which could change with its base) that
compute the same expression of the same graph inputs: ``arange`` with equal arguments, ``add``
(either order, no ``alpha``) and a device move (``.to(device)``, values kept), over the same
placeholders and constants; and no node between the first and the last op of the two
expressions writes anything in place (nor calls an op whose schema writes), so every input holds
one value at all its reads. Equal expressions of equal values are equal. ``I``'s only readers
must be the two writes (it keeps its value until they read it). Anything else (another op, a dtype
cast, another input, an in-place op in between) is refused: nothing proves the two equal without
reading both on the host. The check samples ``I`` as ``P`` (it tests the fold, not the proof),
and the serve checks compare the kernel's caches with ``index_copy_`` at ``P`` bit for bit: the
proof is what makes that the graph's write.

*Hugging Face's StaticCache* (transformers 5). Each layer's ``StaticLayer`` keeps its own
``cumulative_length`` (a 0-d int64 buffer, a separate input of the graph), and its ``update``
computes ``cache_position = arange(Sq) + cumulative_length``, adds ``Sq`` to the counter in place,
then writes both caches at ``cache_position``. The model's positions, which the mask is built
from, are ``arange(Sq) + get_seq_length()``, and ``get_seq_length()`` is layer 0's counter, read at
the start of the step. So:

- in layer 0, ``cache_position`` and the mask's ``q_arange`` are ``arange(Sq) + counter_0`` (the
  latter through a ``.to(device)``), read before the counter's ``add_`` with no in-place op in
  between: proved equal, the writes fold;
- in layer ``i > 0``, ``cache_position`` is ``arange(Sq) + counter_i``, another tensor. It equals
  ``P`` only while every layer's counter equals layer 0's at the step's start, which holds because
  every ``update`` adds the same ``Sq``: an invariant the cache object keeps across calls, not
  something the graph states (it takes the counters as separate inputs, and a caller can set one
  apart: ``layer.cumulative_length.fill_(n)``, a cache filled layer by layer). With the counters
  apart, eager writes layer ``i`` at ``counter_i ..`` and masks from ``counter_0``, while
  ``write_kv`` has one position for both: folded, the step would write other rows and attend
  other keys, and no check would see it (the site's check and the serve checks both work from
  ``P``). So these layers are refused, logged at debug level ("keeps its cache writes: ... nothing
  in the graph proves them equal"), and keep the read-only site with their ``index_copy_`` in the
  graph. Folding them would take a run-time proof, such as a device-side assert that
  ``cache_position`` equals ``P`` before the kernel; that would turn eager's result for counters
  set apart into an error, and is not done.

A folded site is served through ``kernelsmith::kernel_mutating``
(:mod:`kernelsmith.frontends.torch_op`), whose schema declares the caches written
(``kernelsmith::kernel`` declares no mutation and refuses a family that writes its inputs): the
rewrite calls it with the caches as its written inputs where the attention was and erases the
two ``index_copy_`` nodes; functionalization makes it ``auto_functionalized`` and Inductor
re-inplaces it, so the kernel writes the module's cache buffers themselves (no clone, no copy
back). Its serve checks compare the caches it leaves with the family's update, bit for bit.

A position outside the cache is an error, never a wrong answer. At a read-only site the cache
write before the attention (``index_copy_``) fails, as in eager. A folded site has no
``index_copy_`` left, and its kernel, which never reads or writes past the cache, would write
nothing and return NaN (a one-layer model's logits, silently); so the rewritten graph derives the
kernel's first position through :func:`first_position` with the cache's length, which asserts on
the device that every position written is in ``[0, L)``
(:func:`~kernelsmith.frontends.patterns.decode_attention.assert_on_device`: no host sync, the step
stays capturable; on a GPU a failure is a device-side assert). Its cost is one reduction of ``Sq``
integers per folded site per step (a tiny kernel; on CPU, Inductor fuses it with the positions'
own ops).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

from kernelsmith.frontends._backend_sites import OpInput, Site, _mutates, _target_name, _value
from kernelsmith.frontends.patterns.decode_attention import (
    Refused,
    _checked_site,
    _fresh_positions,
    assert_on_device,
)


def first_position(positions: torch.Tensor, cache_length: int | None = None) -> torch.Tensor:
    """``write_kv``'s ``(1,)`` int64 cache position: the first new token's, ``positions[0]`` (the
    positions are consecutive). A device op, as
    :func:`~kernelsmith.frontends.patterns.decode_attention.lengths_from_positions`.

    With ``cache_length`` (the folded site always gives it; without it nothing is checked) every
    position must be a row of the cache, ``0 <= p < cache_length``, checked on the device
    (:func:`assert_on_device`). Eager's ``index_copy_`` raises for a position outside the cache;
    the folded site has no ``index_copy_`` left, and the kernel, which never reads or writes past
    the cache, would write nothing and return NaN: a wrong answer where eager fails. Its cost: one
    reduction of ``Sq`` integers per folded site per step (a tiny kernel, which Inductor may fuse
    with the positions' ops)."""
    if cache_length is not None:
        assert_on_device((positions >= 0) & (positions < cache_length),
                         f"a new token's position is outside the static cache (0 .. {cache_length - 1}): "
                         "its keys and values cannot be written (eager's cache write fails there too)")  # fmt: skip
    return positions.reshape(-1)[:1].to(torch.int64)


def write_kv_site(gm: fx.GraphModule, sdpa: fx.Node, region: list[fx.Node], mask_nodes: list[fx.Node],
                  operands: list[OpInput], positions: fx.Node, scale: Any, order: dict[fx.Node, int],
                  generators: dict[torch.device, torch.Generator]) -> Site:  # fmt: skip
    """The static-cache site with the caches' ``index_copy_`` writes taken in (``write_kv``): see
    the module docstring."""
    k_cache, v_cache = operands[1].node, operands[2].node
    if k_cache is v_cache:
        raise Refused("the keys and values are one tensor")
    writes = [_cache_write(cache, sdpa, positions, order) for cache in (k_cache, v_cache)]
    news = [w.args[3] for w in writes]
    assert all(isinstance(n, fx.Node) for n in news)  # (checked by _cache_write)
    # An index proved equal to the positions (not the node itself) is read as the positions by
    # the check; it must keep that value until the writes read it, so nothing else may see it
    # (no view of it, no in-place op on it).
    equal_to: dict[fx.Node, fx.Node] = {}
    for write in writes:
        index = _write_args(write)[2]
        if index is not positions:
            if set(index.users) - set(writes):
                raise Refused(f"{index.name}, where {write.name} writes, is also read by "
                              f"{', '.join(sorted(u.name for u in set(index.users) - set(writes)))}")  # fmt: skip
            equal_to[index] = positions
    first, last = min(order[w] for w in writes), order[sdpa]
    allowed = {*writes, *region, *mask_nodes}
    for node in (k_cache, v_cache, positions, *news):  # nothing between the writes and the kernel
        between = [u for u in node.users if first < order[u] < last and u not in allowed]  # type: ignore[union-attr]
        if between:
            raise Refused(f"{between[0].name} uses {node.name} between the cache write and the attention")  # type: ignore[union-attr]
    cache_length = _value(k_cache).shape[2]  # every position written must be a row of the cache
    if type(cache_length) is not int:
        raise Refused(f"the cache's length {cache_length} is not static")
    inputs = [*operands, *(OpInput(n) for n in news),  # type: ignore[arg-type]
              OpInput(positions, derive=first_position, derive_args=(cache_length,))]  # fmt: skip
    site = _checked_site(gm, sdpa, sorted({*writes, *region}, key=order.__getitem__), mask_nodes, inputs,
                         "static", scale, order, generators, write_kv=True, equal_to=equal_to)  # fmt: skip
    return site


def _write_args(write: fx.Node) -> tuple[Any, ...]:
    """``index_copy_``'s ``(cache, dim, index, new)``, positional or keyword."""
    return (*write.args, *write.kwargs.values())


def _cache_write(cache: fx.Node, sdpa: fx.Node, positions: fx.Node, order: dict[fx.Node, int]) -> fx.Node:
    """The one ``cache.index_copy_(2, positions, new)`` before ``sdpa`` (its result unused), or Refused."""
    writers = [u for u in cache.users if _mutates(u) and order[u] < order[sdpa]]
    if len(writers) != 1:
        raise Refused(f"{cache.name} has {len(writers)} in-place writers before the attention, not one")
    write = writers[0]
    args = _write_args(write)
    if _target_name(write) != "index_copy_" or len(args) != 4 or args[0] is not cache:
        raise Refused(f"{cache.name} is written by {write.name} ({_target_name(write)}), not index_copy_(2, P, new)")
    _, dim, index, new = args
    if dim not in (2, -2):
        raise Refused(f"{write.name} writes {cache.name} along dim {dim}, not the length (2)")
    if index is not positions:
        problem = _equal_values_problem(index, positions, order)
        if problem:
            raise Refused(f"{write.name} writes at {getattr(index, 'name', index)}, not at the positions the mask "
                          f"comes from ({positions.name}): {problem}")  # fmt: skip
    if not isinstance(new, fx.Node) or not isinstance(_value(new), torch.Tensor):
        raise Refused(f"{write.name} writes no tensor")
    if _value(new).dtype != _value(cache).dtype:
        raise Refused(f"{write.name} writes {_value(new).dtype} rows into a {_value(cache).dtype} cache")
    if write.users:
        raise Refused(f"{write.name}'s result is used")
    return write


# The ops a write index and the positions may be computed with for the two to be proved equal:
# deterministic, of their arguments' values only, and returning a new tensor (not a view that a
# later in-place op could change). ``to`` is accepted as a device move only (its values kept).
_VALUE_FUNCTIONS = (torch.arange, operator.add, torch.add)
_VALUE_METHODS = frozenset({"add", "__add__", "to"})


def _equal_values_problem(index: Any, positions: fx.Node, order: dict[fx.Node, int]) -> str | None:
    """Why the graph does not prove that ``index`` holds the values of ``positions``, or None.

    The proof: both are the same expression (:func:`_expression`: ``arange``, ``add`` in either
    order, a device move) of the same graph inputs, and no node between the first and the last
    op of the two expressions writes anything in place, so each input holds one value for every
    read of it. Equal expressions of equal values are equal values. Hugging Face's StaticCache
    meets it in its first layer only: see the module docstring's "Hugging Face's StaticCache"."""
    if not isinstance(index, fx.Node) or not _fresh_positions(index, _value(positions).numel()):
        # (a view could change with its base after it is computed: only a fresh tensor keeps it)
        return "the index is not a fresh integer tensor of the positions' size (add or arange)"
    index_ops: list[fx.Node] = []
    positions_ops: list[fx.Node] = []
    try:
        same = _expression(index, index_ops) == _expression(positions, positions_ops)
    except Refused as why:
        return f"nothing proves the two equal ({why})"
    if not same:

        def inputs_of(ops: list[fx.Node]) -> str:
            names = sorted({a.name for n in ops for a in n.all_input_nodes if a.op in ("placeholder", "get_attr")})
            return ", ".join(names) or "constants only"

        return (f"{index.name} is not the same expression of the same tensors (it reads {inputs_of(index_ops)}, "
                f"the positions {inputs_of(positions_ops)}): nothing in the graph proves them equal")  # fmt: skip
    computed = [order[n] for n in (*index_ops, *positions_ops)]
    first, last = min(computed), max(computed)
    for node in positions.graph.nodes:
        if first < order[node] < last and _writes_in_place(node):
            return (f"{node.name} writes in place between the reads of the tensors {index.name} and "
                    f"{positions.name} are computed from")  # fmt: skip
    return None


def _writes_in_place(node: fx.Node) -> bool:
    """An in-place op (``_mutates``: a trailing ``_``, ``setitem``, ``out=``), or a call of an op
    whose schema writes an argument (a custom op, ``kernelsmith::kernel_mutating``)."""
    if _mutates(node):
        return True
    target = node.target
    if isinstance(target, torch._ops.OpOverloadPacket):
        return any(getattr(target, name)._schema.is_mutable for name in target.overloads())
    return isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable


def _expression(node: Any, ops: list[fx.Node]) -> Any:
    """A value that is equal for two nodes computing the same expression of the same graph
    inputs (placeholders and attributes, each standing for the value it holds when read) and
    constants; each op node met is appended to ``ops``. Refused where a node computes its value
    otherwise (another op, an in-place or ``out=`` variant, a dtype cast)."""
    if not isinstance(node, fx.Node):
        if isinstance(node, tuple | list):
            return (type(node).__name__, *(_expression(a, ops) for a in node))
        if node is None or isinstance(node, bool | int | float | str | torch.device | torch.dtype):
            return ("constant", type(node).__name__, node)
        raise Refused(f"an argument {node!r} the proof does not read")
    if node.op in ("placeholder", "get_attr"):
        return ("input", node)
    known = (node.op == "call_function" and node.target in _VALUE_FUNCTIONS) or (
        node.op == "call_method" and node.target in _VALUE_METHODS
    )
    if not known or "out" in node.kwargs:
        raise Refused(f"{node.name} is computed by {_target_name(node)}")
    ops.append(node)
    name = _target_name(node)
    if name == "to":  # x.to(device): another tensor of the same values
        source, moved = node.args[0], [*node.args[1:], *node.kwargs.values()]
        value, before = _value(node), _value(source)
        if (len(moved) != 1 or set(node.kwargs) - {"device"} or not isinstance(moved[0], str | torch.device)
                or not isinstance(value, torch.Tensor) or not isinstance(before, torch.Tensor)
                or value.dtype != before.dtype):  # fmt: skip
            raise Refused(f"{node.name} is not a device move of one tensor")
        return _expression(source, ops)
    arguments = [_expression(a, ops) for a in node.args]
    keywords = sorted((key, _expression(v, ops)) for key, v in node.kwargs.items())
    if name in ("add", "__add__") and not keywords:  # a + b is b + a (with no alpha)
        arguments.sort(key=repr)
        name = "add"
    return (name, tuple(arguments), tuple(keywords))


__all__ = ["first_position", "write_kv_site"]
