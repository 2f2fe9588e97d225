"""Finding the sites of a captured FX graph: the regions that compute one op family.

Step 1 of the ``kernelsmith`` torch.compile backend (:mod:`kernelsmith.frontends.backend`): for
each candidate output node the region that could compute it grows backwards over cheap tensor ops
whose users are all inside it; the regions, the largest first, run once through the recognizer
behind the decorator, and the first that matches one family is a :class:`Site`. A residual add
feeding an RMSNorm is folded in (``add_rmsnorm``), and decode projections
(:mod:`kernelsmith.frontends._backend_decode_sites`) and fused linear + cross-entropy sites are
found on request. The backend then resolves and rewrites them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from kernelsmith import dispatch
from kernelsmith.frontends import torch_op
from kernelsmith.ops import UnsupportedWorkload, get_op
from kernelsmith.spec import OpSpec

log = logging.getLogger("kernelsmith.frontends.backend")  # this code's logger in backend.py


# Op families the backend looks for; add_rmsnorm is an RMSNorm site with its residual add folded in.
FAMILIES = ("rmsnorm", "add_rmsnorm", "layernorm", "softmax", "gelu", "gelu_tanh", "swiglu", "geglu", "cross_entropy",
            "linear_cross_entropy")
# Families matched on request only (``decode=True``, or named in ``families``): decode-shaped
# projections (kernelsmith.frontends.patterns.decode) and attention over a KV cache
# (kernelsmith.frontends.patterns.decode_attention). Off by default: every small F.linear of any
# graph would otherwise become a site, and a decode kernel pays only where the step runs as a graph.
DECODE_FAMILIES = ("decode_matmul", "decode_attention")
KNOWN_FAMILIES = FAMILIES + DECODE_FAMILIES
# Calls that are never inside an op family's region: they are its inputs.
_HEAVY = frozenset({
    "linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm", "einsum", "embedding", "embedding_bag",
    "scaled_dot_product_attention", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "multi_head_attention_forward", "lstm", "gru",
})
# A region worth a recognition run contains at least one of these (by function or method name).
_CHARACTERISTIC = frozenset({
    "rsqrt", "sqrt", "pow", "rms_norm", "layer_norm", "var", "var_mean", "mean", "softmax", "log_softmax", "exp",
    "gelu", "erf", "tanh", "silu", "sigmoid", "cross_entropy", "nll_loss",
})
_ADDS = frozenset({"add", "__add__", "iadd"})
MAX_REGION = 40  # nodes: more than any op family's formulation takes
# ---------------------------------------------------------------------------------------------
# Sites
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpInput:
    """One input of a site's op: a graph node, reshaped on the way when ``reshape`` is set, or
    computed from it by ``derive(value, *derive_args)`` (a function of device ops, which the
    rewritten graph calls right before the kernel: decode attention's lengths from the positions)."""

    node: fx.Node
    reshape: tuple[int, ...] | None = None
    derive: Callable[..., torch.Tensor] | None = None
    derive_args: tuple[Any, ...] = ()


@dataclass(frozen=True)
class OutputSlice:
    """One of the several graph values a site replaces (``Site.slices``): ``node``'s value is
    columns [start, stop) of the kernel's ``(..., N)`` output, viewed as ``view`` (B, S, H, D) and
    transposed (1, 2) when one is given (a rotated projection's heads), as it is otherwise."""

    node: fx.Node
    start: int
    stop: int
    view: tuple[int, int, int, int] | None = None


@dataclass
class Site:
    """A region of the graph computing one op family, and what became of it.

    ``status``: ``"found"`` (matched, not resolved yet), ``"replaced"``, ``"not tuned"``,
    ``"baseline wins"``, ``"unsupported"``, ``"check failed"``, ``"no database"`` (the cache is
    broken), ``"no backward"``, ``"slower in context"``. ``speedup`` is the stored decision's
    (vs eager), ``backward_speedup`` its backward family's in a training graph.
    """

    op: str
    output: fx.Node
    region: list[fx.Node]  # graph order, the output last
    inputs: list[OpInput]
    constants: dict[str, Any]
    spec: OpSpec
    needs_grad: bool = False
    residual_add: fx.Node | None = None  # add_rmsnorm: the sum node the op replaces too
    # decode_matmul with prologue="rmsnorm": the norm's nodes, recomputed by the op and erased by
    # the rewrite once no user is left (kernelsmith.frontends.patterns.decode, "RMSNorm prologues")
    prologue: list[fx.Node] = field(default_factory=list)
    # decode_matmul with epilogue="rope" on one of Llama's q or k projections: (B, S, H, D). The
    # kernel writes the projection's (B, S, H * D) rows and the graph reads the rotated heads as
    # (B, H, S, D), so the rewrite puts ``.view(B, S, H, D).transpose(1, 2)`` after the kernel
    # (kernelsmith.frontends.patterns.decode, "RoPE epilogues"); None for every other site
    output_view: tuple[int, int, int, int] | None = None
    # decode_matmul with weights="qkv": the q heads, k heads and v projection it replaces, each a
    # slice of the kernel's row (kernelsmith.frontends.patterns.decode_qkv); ``output`` is then the
    # region's last node, where the kernel goes. Empty for every other site (one output).
    slices: list[OutputSlice] = field(default_factory=list)
    status: str = "found"
    reason: str = ""
    speedup: float | None = None
    backward_speedup: float | None = None
    runners: list[tuple[str, list[torch.Tensor], dispatch.KernelRunner]] = field(default_factory=list, repr=False)
    decisions: str = ""  # a dynamic graph's site: the winners its op call carries, one chosen per call
    # a static site called through kernelsmith::triton_kernel (Inductor sees its kernel): its one decision
    triton_decision: str = ""
    # symbolic scalar inputs of the region (a float argument such as ``eps`` under ``dynamic=True``,
    # which Dynamo passes as a tensor and reads back with ``.item()``) whose example values the
    # site's constants were read at: the backend guards each on that value when it replaces the site
    specialized: list[fx.Node] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """A JSON-ready line for reports."""
        return {
            "op": self.op,
            "workload": self.spec.describe(),
            "shapes": [list(t.shape) for t in self.spec.inputs],
            "status": self.status,
            "reason": self.reason,
            "speedup": self.speedup,
            "backward_speedup": self.backward_speedup,
            "training": self.needs_grad,
            "nodes": [n.name for n in self.region],
        }


def _value(node: Any) -> Any:
    if not isinstance(node, fx.Node):
        return None
    return node.meta.get("example_value", node.meta.get("val"))


def _static_tensor(value: Any) -> bool:
    """A tensor whose sizes and strides are known: ints, or (in a dynamic graph) SymInts with a
    hint, the example value a site is recognized and its workload described at."""
    if not isinstance(value, torch.Tensor):
        return False
    try:
        for size in (*value.shape, *value.stride()):
            torch_op.size_hint(size)
    except RuntimeError:  # an unbacked size (data-dependent): nothing to sample it at
        return False
    return True


def _scalar_hint(value: Any) -> int | float | bool | None:
    """A symbolic scalar's example value (its hint), or None: not a symbolic scalar, or an
    unbacked one (data-dependent: no example value to read a constant at)."""
    if not isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        return None
    hint = value.node.hint
    return hint if isinstance(hint, int | float | bool) else None


def _size_symbols(tensors: Iterable[torch.Tensor]) -> set[Any]:
    """The symbols the sizes and strides of ``tensors`` are expressions of (sympy symbols)."""
    return {
        symbol
        for t in tensors
        for size in (*t.shape, *t.stride())
        if isinstance(size, torch.SymInt)
        for symbol in size.node.expr.free_symbols
    }


def _unbacked(size: Any) -> bool:
    try:
        torch_op.size_hint(size)
    except RuntimeError:
        return True
    return False


def _unusable_input(value: Any) -> str | None:
    """Why a value (a region's input, a characteristic op's output) that is neither a tensor with
    known sizes nor a symbolic scalar with an example value keeps a site from being found, when
    that is a dynamic-shape reason worth telling the user (None otherwise: a non-tensor value is
    simply not an op's input)."""
    if isinstance(value, torch.Tensor):  # not _static_tensor: a size or stride has no hint
        sizes = [str(s) for s in (*value.shape, *value.stride()) if _unbacked(s)]
        return f"a data-dependent (unbacked) size ({', '.join(dict.fromkeys(sizes))})"
    if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        return f"a data-dependent scalar ({value})"
    return None


def _dynamic(value: Any) -> bool:
    """A tensor with a symbolic size or stride: its site's kernel is chosen per call."""
    return isinstance(value, torch.Tensor) and torch_op.has_symbolic_size(value)


def _target_name(node: fx.Node) -> str:
    target = node.target
    return target if isinstance(target, str) else getattr(target, "__name__", str(target))


def _mutates(node: fx.Node) -> bool:
    if node.op not in ("call_function", "call_method"):
        return False
    name = _target_name(node)
    return (
        (name.endswith("_") and not name.endswith("__"))
        or name == "setitem"
        or node.kwargs.get("out") is not None
        or node.kwargs.get("inplace") is True
    )


def _barrier(node: fx.Node) -> bool:
    """An in-place op, or a call with side effects (a grad-mode switch returns None): work must
    not move across it."""
    if node.op not in ("call_function", "call_method"):
        return False
    return _mutates(node) or not _is_tensors(_value(node))


def _is_tensors(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    return isinstance(value, tuple | list) and bool(value) and all(isinstance(v, torch.Tensor) for v in value)


def _absorbable(node: fx.Node) -> bool:
    """A cheap tensor op a region may contain."""
    if node.op not in ("call_function", "call_method") or _target_name(node) in _HEAVY or _mutates(node):
        return False
    value = _value(node)
    if isinstance(value, tuple | list):
        return bool(value) and all(_static_tensor(v) for v in value)
    return _static_tensor(value)


def _levels(out: fx.Node, taken: set[fx.Node]) -> list[frozenset[fx.Node]]:
    """The regions ending at ``out``, smallest first: each step adds every producer whose users
    are all in the region already."""
    region = {out}
    levels = [frozenset(region)]
    while True:
        added = {
            a
            for n in region
            for a in n.all_input_nodes
            if a not in region and a not in taken and _absorbable(a) and all(u in region for u in a.users)
        }
        if not added or len(region) + len(added) > MAX_REGION:
            return levels
        region |= added
        levels.append(frozenset(region))


def _region_inputs(region: Iterable[fx.Node], order: dict[fx.Node, int]) -> list[fx.Node]:
    inputs: dict[fx.Node, None] = {}
    for node in sorted(region, key=order.__getitem__):
        for a in node.all_input_nodes:
            if a not in region:
                inputs.setdefault(a, None)
    return list(inputs)


def _region_module(
    gm: fx.GraphModule, nodes: list[fx.Node], inputs: list[fx.Node], fixed: dict[fx.Node, Any] | None = None
) -> fx.GraphModule:
    """The region as a module of its own, taking its inputs positionally; the inputs in ``fixed``
    are not arguments but written into the module as those constant values."""
    graph = fx.Graph()
    env: dict[fx.Node, Any] = dict(fixed or {})
    for i, node in enumerate(inputs):
        env[node] = graph.placeholder(f"input_{i}")
    for node in nodes:
        env[node] = graph.node_copy(node, env.__getitem__)
    graph.output(env[nodes[-1]])
    return fx.GraphModule(gm, graph)


def _sample(value: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A random tensor of ``value``'s shape, dtype and device (integers are zeros: valid indices)."""
    shape, device = tuple(torch_op.size_hint(s) for s in value.shape), value.device
    if value.dtype.is_floating_point:
        return torch.randn(shape, generator=generator, device=device).to(value.dtype)
    if value.dtype == torch.bool:
        return torch.ones(shape, dtype=torch.bool, device=device)
    return torch.zeros(shape, dtype=value.dtype, device=device)


def _meta(value: torch.Tensor) -> torch.Tensor:
    return torch_op.concrete_meta(value)


def _input_meta(op_input: OpInput) -> torch.Tensor:
    meta = _meta(_value(op_input.node))
    if op_input.derive is not None:
        return op_input.derive(meta, *op_input.derive_args)
    return meta if op_input.reshape is None else meta.reshape(op_input.reshape)


def _moves_across_barrier(nodes: list[fx.Node], start: int, stop: int, skip: Iterable[fx.Node]) -> bool:
    """Whether a node strictly between positions ``start`` and ``stop`` (not in ``skip``) is a barrier."""
    excluded = set(skip)
    return any(_barrier(n) for n in nodes[start + 1 : stop] if n not in excluded)


def find_sites(
    gm: fx.GraphModule,
    families: Iterable[str] = FAMILIES,
    fuse_residual: bool = True,
    notes: list[str] | None = None,
    rope_decided: Callable[[Site], bool] | None = None,
) -> list[Site]:
    """The regions of ``gm`` that compute one of ``families``, in graph order (see the module
    docstring). Nothing here raises for a region it cannot handle: it is simply not a site; where
    a candidate region is turned down for a dynamic-shape reason (a data-dependent size) the
    reason is logged at info and appended to ``notes``, for the backend's "nothing replaced" line.

    ``rope_decided`` (decode sites only): whether a q or k projection with its RoPE rotation, one
    ``decode_matmul`` site with ``epilogue="rope"``, has a decision to be served by (the
    backend's resolver asks its database: ``_Resolver.kernel_decided``). Such a site takes the
    nodes the plain projection would take, so one it turns down gives them back: the plain
    projection is found as before, and a database tuned before RoPE sites existed serves what it
    served. None: no RoPE sites."""
    wanted = set(families)
    if fuse_residual and "add_rmsnorm" in wanted:
        wanted.add("rmsnorm")  # an add_rmsnorm site is an RMSNorm site with its add folded in
    nodes = list(gm.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    taken: set[fx.Node] = set()
    sites: list[Site] = []
    generators: dict[torch.device, torch.Generator] = {}
    if "decode_matmul" in wanted:
        # First: at decode shapes the projections are the step, and their fused epilogues save launches.
        from kernelsmith.frontends._backend_decode_sites import decode_sites

        sites += decode_sites(gm, nodes, order, taken, generators, rope_decided)
    if "decode_attention" in wanted:
        from kernelsmith.frontends.patterns import decode_attention

        sites += decode_attention.sites(gm, order, taken, generators)
    if "linear_cross_entropy" in wanted:  # before cross_entropy, which would take the loss without its head
        sites += _linear_cross_entropy_sites(gm, nodes, order, taken, generators)
    for out in reversed(nodes):
        if out in taken or not _absorbable(out) or not isinstance(_value(out), torch.Tensor):
            _note_unbacked_output(out, notes)
            continue
        levels = _levels(out, taken)
        if not any(_target_name(n) in _CHARACTERISTIC for n in levels[-1]):
            continue
        for region in reversed(levels):
            if not any(_target_name(n) in _CHARACTERISTIC for n in region):
                break
            site = _recognize_region(gm, out, region, nodes, order, wanted, generators, notes)
            if site is not None:
                sites.append(site)
                taken |= region
                break
    if fuse_residual and "add_rmsnorm" in wanted:
        for site in sites:
            _fold_residual_add(site, taken, nodes, order)
    asked = set(families)
    return sorted((s for s in sites if s.op in asked), key=lambda s: order[s.output])


def _note_unbacked_output(out: fx.Node, notes: list[str] | None) -> None:
    """Say why a characteristic op (a softmax, a norm's rsqrt) whose output has a data-dependent
    size is no site's output: there is no example size to recognize it, or describe its workload, at."""
    if notes is None or out.op not in ("call_function", "call_method") or _target_name(out) not in _CHARACTERISTIC:
        return
    value = _value(out)
    if not isinstance(value, torch.Tensor) or _static_tensor(value):
        return
    note = f"{_target_name(out)} at {out.name} is not served: {_unusable_input(value)}"
    log.info("%s", note)
    notes.append(note)


def _recognize_region(
    gm: fx.GraphModule,
    out: fx.Node,
    region: frozenset[fx.Node],
    graph_nodes: list[fx.Node],
    order: dict[fx.Node, int],
    wanted: set[str],
    generators: dict[torch.device, torch.Generator],
    notes: list[str] | None = None,
) -> Site | None:
    from kernelsmith.frontends.decorator import _differs_from_op
    from kernelsmith.frontends.recognize import recognize

    inputs = _region_inputs(region, order)
    values = [_value(n) for n in inputs]
    # A symbolic scalar input (a float argument under dynamic=True) is sampled at its example
    # value: the family's constants (eps) are read at it, and the backend guards the symbol on it
    # when the site is replaced, so another value recompiles instead of reusing a wrong constant.
    # It is written into the region's module as a constant, as a plain float argument would be:
    # the recognizer reads an op's constants from the captured code, not from its arguments.
    # Never a size of a tensor (a view's s0): guarding it would make the batch static again.
    sizes = _size_symbols(v for v in values if isinstance(v, torch.Tensor))
    fixed = {
        n: _scalar_hint(v)
        for n, v in zip(inputs, values, strict=True)
        if _scalar_hint(v) is not None and not (v.node.expr.free_symbols & sizes)
    }
    specialized = list(fixed)
    inputs = [n for n in inputs if n not in fixed]
    values = [_value(n) for n in inputs]
    for node, value in zip(inputs, values, strict=True):
        if _static_tensor(value):
            continue
        why = _unusable_input(value)
        if why is not None and notes is not None:
            note = f"the region ending at {out.name} is not recognized: its input {node.name} has {why}"
            if note not in notes:  # each level of the same output would say it again
                log.info("%s", note)
                notes.append(note)
        return None
    nodes = sorted(region, key=order.__getitem__)
    # The op would run at the output's place: nothing may change state in between. A symbolic
    # scalar input read there (``eps.item()``) is no side effect, only a non-tensor value.
    if _moves_across_barrier(graph_nodes, order[nodes[0]], order[out], [*region, *specialized]):
        return None
    try:
        module = _region_module(gm, nodes, inputs, fixed)
        device = values[0].device if values else _value(out).device
        generator = generators.setdefault(device, torch.Generator(device=device))
        generator.manual_seed(0)
        samples = tuple(_sample(v, generator) for v in values)
        with torch.no_grad():
            recognition = recognize(module, samples)
        match = recognition.match
        if match is None or match.op not in wanted:
            return None
        if any(ref.kind != "arg" for ref in match.inputs):
            return None
        expected = _value(out)
        produced = recognition.output
        expected_shape = tuple(torch_op.size_hint(s) for s in expected.shape)  # no guard on a symbolic size
        if not isinstance(produced, torch.Tensor) or (tuple(produced.shape), produced.dtype) != (
            expected_shape,
            expected.dtype,
        ):
            return None  # run outside its context (autocast, say), the region computes something else
        family = get_op(match.op)
        bound = match.bind(samples, {}, check=False)
        with torch.no_grad():
            if _differs_from_op(family, family.spec_for(*bound, **match.constants), bound, produced):
                return None
    except Exception as exc:  # a region that cannot run on random inputs, or is not the op: not a site
        log.debug("region ending at %s: %s: %s", out.name, type(exc).__name__, exc)
        return None
    op_inputs = [OpInput(inputs[ref.index], ref.reshape) for ref in match.inputs]  # type: ignore[index]
    metas = [_input_meta(i) for i in op_inputs]
    needs_grad = bool(getattr(expected, "requires_grad", False))
    site = Site(match.op, out, nodes, op_inputs, dict(match.constants), OpSpec(match.op, (), {}), needs_grad)
    site.specialized = specialized
    try:
        site.spec = family.spec_for(*metas, **match.constants)
    except UnsupportedWorkload as exc:
        site.status, site.reason = "unsupported", str(exc)
        site.spec = OpSpec(match.op, (), dict(match.constants))
    log.debug("site %s at %s (%d nodes)", match.op, out.name, len(nodes))
    return site


def _layout_problem(produced: Any, expected: Any) -> str:
    """Why ``produced`` (what a site's kernel gives, viewed as the rewrite views it) is not laid
    out as ``expected`` (the value of the node it replaces): its shape, dtype, or the stride of a
    dim longer than 1 (a size-1 dim is never stepped along, so its stride means nothing: PyTorch's
    contiguity and ``view`` ignore it too); "" when it is, or when either is no tensor (a graph
    with no example values: nothing to compare)."""
    if not isinstance(produced, torch.Tensor) or not isinstance(expected, torch.Tensor):
        return ""

    def layout(t: torch.Tensor) -> tuple[Any, ...]:
        strides = tuple(stride if size != 1 else None for size, stride in zip(t.shape, t.stride(), strict=True))
        return tuple(t.shape), strides, t.dtype

    got, want = layout(produced), layout(expected)
    return "" if got == want else f"the kernel's output viewed is {got}, the graph reads {want}"


def _linear_cross_entropy_sites(
    gm: fx.GraphModule,
    nodes: list[fx.Node],
    order: dict[fx.Node, int],
    taken: set[fx.Node],
    generators: dict[torch.device, torch.Generator],
) -> list[Site]:
    """``linear_cross_entropy`` sites: each LM head's product through its loss, checked as one
    region (:mod:`kernelsmith.frontends.patterns.linear_cross_entropy`); where the logits are also
    used elsewhere (a model output) the product stays and the site replaces only the loss."""
    from kernelsmith.frontends.patterns import linear_cross_entropy as lce

    found: list[Site] = []
    for out, chain in lce.candidate_regions(gm, taken):
        site = _recognize_region(gm, out, frozenset(chain), nodes, order, {lce.OP}, generators)
        if site is None:
            continue
        site.region = lce.kept_nodes(chain)
        found.append(site)
        taken |= set(chain)
    return found


def _fold_residual_add(site: Site, taken: set[fx.Node], nodes: list[fx.Node], order: dict[fx.Node, int]) -> None:
    """An RMSNorm of ``h = a + b`` becomes ``add_rmsnorm(b, a, weight)``: (rmsnorm(h), h)."""
    if site.op != "rmsnorm" or site.status != "found":
        return
    x, weight = site.inputs
    add = x.node
    if x.reshape is not None or add in taken or add.op not in ("call_function", "call_method"):
        return
    if _target_name(add) not in _ADDS or len(add.args) != 2 or add.kwargs:
        return
    a, b = add.args
    value = _value(add)
    if not all(isinstance(t, fx.Node) for t in (a, b)) or not _static_tensor(value):
        return
    a_value, b_value = _value(a), _value(b)
    for t in (a_value, b_value):
        if not _static_tensor(t) or t.shape != value.shape or t.dtype != value.dtype:
            return
    assert isinstance(a, fx.Node) and isinstance(b, fx.Node)
    # The kernel runs after its last input; every other user of the sum must come after that.
    start = max(order[a], order[b], order[weight.node])
    others = [u for u in add.users if u not in site.region]
    if any(order[u] <= start for u in others):
        return
    if _moves_across_barrier(nodes, start, order[site.output], [*site.region, add]):
        return
    family = get_op("add_rmsnorm")
    metas = [_meta(b_value), _meta(a_value), _input_meta(weight)]
    try:
        spec = family.spec_for(*metas, **site.constants)
    except UnsupportedWorkload as exc:
        log.debug("residual add %s not folded: %s", add.name, exc)
        return
    site.op, site.spec, site.residual_add = "add_rmsnorm", spec, add
    site.inputs = [OpInput(b), OpInput(a), weight]  # add_rmsnorm computes h = residual + x: (x, residual) = (b, a)
    site.needs_grad = site.needs_grad or bool(getattr(value, "requires_grad", False))
    taken.add(add)


