"""``torch.compile(model, backend="kernelsmith")``: tuned kernels where they win, Inductor for the rest.

>>> compiled = torch.compile(model, backend="kernelsmith")                       # doctest: +SKIP
>>> compiled = torch.compile(model, backend="kernelsmith", options={"tune": True, "budget": 30})  # doctest: +SKIP
>>> compiled = torch.compile(model, backend=kernelsmith.backend(db="runs.db"))  # doctest: +SKIP

Dynamo hands the backend each captured FX graph (torch-level calls: ``x.pow(2)``, ``torch.rsqrt``,
``F.silu``, ``operator.mul``...) with its real example inputs. The backend

1. **finds sites**: regions of the graph that compute one op family (:func:`find_sites`);
2. **keeps the winners**: a site is replaced only where the database holds a ``"kernel"``
   decision for its workload's bucket on this fingerprint (or, with ``tune=True``, where tuning
   it now produces one), the stored kernel builds and its output on fresh inputs is as close to
   the float64 reference as PyTorch's own (the same check as ``@kernelsmith.optimize``), and, in
   a training graph, the family's backward kernel has won too;
3. **rewrites** a copy of the graph: each kept site becomes one ``torch.ops.kernelsmith.kernel``
   call (:mod:`kernelsmith.dispatch`), whose launcher is installed for the exact call, so the
   compiled graph never queries the database; a graph with nothing to replace is the very
   graph Dynamo gave. In a static inference graph with compiled Triton kernels (a GPU) the call
   is ``kernelsmith::triton_kernel`` instead, a ``torch.library.triton_op`` carrying its winner,
   whose kernel Inductor compiles into its own code (:mod:`kernelsmith.frontends.triton_ops`);
4. hands the graph to **Inductor** (``compile_fx``), which fuses and compiles everything else as
   usual; ``mode="max-autotune"`` and Inductor options in ``options`` pass through.

Finding sites reuses the recognizer behind the decorator, so every formulation it knows (Hugging
Face's RMSNorm with its upcast, ``gelu_new`` written out, ``nn.LayerNorm``, ``F.silu(a) * b``,
...) is known here too, with no second set of per-family FX patterns to keep in step. For each
candidate output node, walking the graph backwards, the region that could compute it grows step
by step: a producer joins when every one of its users is already in the region (so no internal
value escapes and the region can be replaced by one call) and it is a cheap tensor op (not a
matmul, convolution, embedding or attention: those are the region's inputs). The regions, the
largest first, are turned into small FX modules and run once through
:func:`~kernelsmith.frontends.recognize.recognize` on random inputs of the graph's shapes (a
private generator: the user's RNG state is untouched); the first that matches one family is the
site, and its nodes are taken. The largest region first is what makes an RMSNorm match whole and
keeps a softmax behind its scaling and mask from failing for good (the smaller region, the
softmax alone, matches). A residual ``h = a + b`` feeding an RMSNorm is then folded in:
``add_rmsnorm`` computes both ``rmsnorm(h)`` and ``h``, which the graph's other users of the sum
receive.

Families matched: ``rmsnorm``, ``add_rmsnorm`` (residual add + RMSNorm), ``layernorm``,
``softmax``, ``gelu``, ``gelu_tanh``, ``swiglu`` and ``geglu`` (``act(a) * b``, two tensors or
the halves of one), ``cross_entropy``, ``linear_cross_entropy`` (an LM head's product and its loss,
Hugging Face's included: :mod:`kernelsmith.frontends.patterns.linear_cross_entropy`); with
``decode=True``, ``decode_matmul``: each ``F.linear``
of at most 64 rows, with its residual add or SwiGLU partner
(:mod:`kernelsmith.frontends.patterns.decode`). Not (yet): bias + activation after a linear (no such op
family), add + LayerNorm, RoPE written as a function, the reductions (Inductor handles those well).

"Never slower than Inductor alone". A decision's speedup was measured against the eager PyTorch
baseline, not against what Inductor would have fused around the op; a replacement can cost a
fusion (the kernel reads a tensor Inductor would have kept in registers) and adds a custom op
call's host time. So the backend checks in context (``compare``, on by default for CUDA graphs):
the graph is compiled with every replacement and without any, and both are timed on the example
inputs the way the step will run (``timing``: as replayed CUDA graphs when it is compiled for
``kernelsmith.cuda_graph``, where the custom op's host time vanishes and only the GPU's counts; see
:func:`kernelsmith.whole_model.decode.in_context_timer`); the rewritten graph is kept only when
faster. When it is not and several op families
were replaced, each family's replacements alone get the same test, and the fastest graph that
beats Inductor alone is kept (else Inductor alone). Per-site selection (2^sites graphs) is not
attempted. Training graphs are not timed (their replacements are kept); in interpreter mode
(CPU) there is no comparison, since interpreter times are not performance.

Training. In a graph that needs gradients a site is replaced only when its family has a backward
family (``rmsnorm_backward``, ``add_rmsnorm_backward``, ``layernorm_backward``,
``swiglu_backward``, ``geglu_backward``, ``cross_entropy_backward``) whose kernel also won.
AOTAutograd traces the custom op through the autograd formula registered here: the backward is
``kernelsmith::kernel(<backward family>, ...)`` where a backward kernel serves the call, else the
backward family's PyTorch reference, called directly (it differentiates with autograd, which
does not run inside a custom op's body).

Dynamic shapes. In a graph with symbolic sizes (``dynamic=True``, ``mark_dynamic``, the
automatic dynamic graph of a second shape) sites are found at the sizes' example values; each
kept site's op call carries every stored winner of its family with its constants and dtypes, and
each call's concrete shape picks its bucket's (else the database's, else the PyTorch reference):
one graph for every shape, with no launcher installed for one of them.

Limits. Inputs must be
contiguous (the kernels' contract); a site whose region has an in-place op or a grad-mode switch
between its first node and its output is left alone; installed launchers live in this process.
"""

from __future__ import annotations

import functools
import logging
import operator
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from kernelsmith import dispatch
from kernelsmith.db import DatabaseError, DecisionRecord, open_database, warn_unusable_database
from kernelsmith.evaluate.errors import check_close
from kernelsmith.frontends import torch_op, triton_ops
from kernelsmith.ops import OpFamily, UnsupportedWorkload, get_op
from kernelsmith.spec import OpSpec

log = logging.getLogger(__name__)

# Op families the backend looks for; add_rmsnorm is an RMSNorm site with its residual add folded in.
FAMILIES = ("rmsnorm", "add_rmsnorm", "layernorm", "softmax", "gelu", "gelu_tanh", "swiglu", "geglu", "cross_entropy",
            "linear_cross_entropy")
# Families matched on request only (``decode=True``, or named in ``families``): decode-shaped
# projections (kernelsmith.frontends.patterns.decode). Off by default: every small F.linear of any
# graph would otherwise become a site, and a decode kernel pays only where the step runs as a graph.
DECODE_FAMILIES = ("decode_matmul",)
KNOWN_FAMILIES = FAMILIES + DECODE_FAMILIES
# Keys of torch.compile's ``options`` the backend takes; every other key is an Inductor option.
BACKEND_OPTIONS = frozenset({"tune", "budget", "strategy", "db", "families", "compare", "fuse_residual", "decode",
                             "timing"})

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
_KERNEL = torch.ops.kernelsmith.kernel.default


# ---------------------------------------------------------------------------------------------
# Sites
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpInput:
    """One input of a site's op: a graph node, reshaped on the way when ``reshape`` is set."""

    node: fx.Node
    reshape: tuple[int, ...] | None = None


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
    status: str = "found"
    reason: str = ""
    speedup: float | None = None
    backward_speedup: float | None = None
    runners: list[tuple[str, list[torch.Tensor], dispatch.KernelRunner]] = field(default_factory=list, repr=False)
    decisions: str = ""  # a dynamic graph's site: the winners its op call carries, one chosen per call
    # a static site called through kernelsmith::triton_kernel (Inductor sees its kernel): its one decision
    triton_decision: str = ""

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


def _region_module(gm: fx.GraphModule, nodes: list[fx.Node], inputs: list[fx.Node]) -> fx.GraphModule:
    """The region as a module of its own, taking its inputs positionally."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
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
    return meta if op_input.reshape is None else meta.reshape(op_input.reshape)


def _moves_across_barrier(nodes: list[fx.Node], start: int, stop: int, skip: Iterable[fx.Node]) -> bool:
    """Whether a node strictly between positions ``start`` and ``stop`` (not in ``skip``) is a barrier."""
    excluded = set(skip)
    return any(_barrier(n) for n in nodes[start + 1 : stop] if n not in excluded)


def find_sites(gm: fx.GraphModule, families: Iterable[str] = FAMILIES, fuse_residual: bool = True) -> list[Site]:
    """The regions of ``gm`` that compute one of ``families``, in graph order (see the module
    docstring). Nothing here raises for a region it cannot handle: it is simply not a site."""
    wanted = set(families)
    if fuse_residual and "add_rmsnorm" in wanted:
        wanted.add("rmsnorm")  # an add_rmsnorm site is an RMSNorm site with its add folded in
    nodes = list(gm.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    taken: set[fx.Node] = set()
    sites: list[Site] = []
    generators: dict[torch.device, torch.Generator] = {}
    if "decode_matmul" in wanted:  # first: at decode shapes the projections are the step, and their
        sites += _decode_sites(gm, nodes, order, taken, generators)  # fused epilogues save launches
    if "linear_cross_entropy" in wanted:  # before cross_entropy, which would take the loss without its head
        sites += _linear_cross_entropy_sites(gm, nodes, order, taken, generators)
    for out in reversed(nodes):
        if out in taken or not _absorbable(out) or not isinstance(_value(out), torch.Tensor):
            continue
        levels = _levels(out, taken)
        if not any(_target_name(n) in _CHARACTERISTIC for n in levels[-1]):
            continue
        for region in reversed(levels):
            if not any(_target_name(n) in _CHARACTERISTIC for n in region):
                break
            site = _recognize_region(gm, out, region, nodes, order, wanted, generators)
            if site is not None:
                sites.append(site)
                taken |= region
                break
    if fuse_residual and "add_rmsnorm" in wanted:
        for site in sites:
            _fold_residual_add(site, taken, nodes, order)
    asked = set(families)
    return sorted((s for s in sites if s.op in asked), key=lambda s: order[s.output])


def _recognize_region(
    gm: fx.GraphModule,
    out: fx.Node,
    region: frozenset[fx.Node],
    graph_nodes: list[fx.Node],
    order: dict[fx.Node, int],
    wanted: set[str],
    generators: dict[torch.device, torch.Generator],
) -> Site | None:
    from kernelsmith.frontends.decorator import _differs_from_op
    from kernelsmith.frontends.recognize import recognize

    inputs = _region_inputs(region, order)
    values = [_value(n) for n in inputs]
    if not all(_static_tensor(v) for v in values):
        return None
    nodes = sorted(region, key=order.__getitem__)
    if _moves_across_barrier(graph_nodes, order[nodes[0]], order[out], region):
        return None  # the op would run at the output's place: nothing may change state in between
    try:
        module = _region_module(gm, nodes, inputs)
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
    try:
        site.spec = family.spec_for(*metas, **match.constants)
    except UnsupportedWorkload as exc:
        site.status, site.reason = "unsupported", str(exc)
        site.spec = OpSpec(match.op, (), dict(match.constants))
    log.debug("site %s at %s (%d nodes)", match.op, out.name, len(nodes))
    return site


def _decode_sites(
    gm: fx.GraphModule,
    nodes: list[fx.Node],
    order: dict[fx.Node, int],
    taken: set[fx.Node],
    generators: dict[torch.device, torch.Generator],
) -> list[Site]:
    """``decode_matmul`` sites: the matmul pattern's match on a region around each decode-shaped
    ``F.linear`` (largest region first), routed to the decode family when its shape is one
    (:mod:`kernelsmith.frontends.patterns.decode`)."""
    from kernelsmith.frontends.patterns import decode

    found: list[Site] = []
    for candidates in decode.candidate_regions(gm, taken):
        for out, region in candidates:
            site = _recognize_region(gm, out, region, nodes, order, {"matmul"}, generators)
            if site is None:
                continue
            routed = decode.decode_spec([_input_meta(i) for i in site.inputs], site.constants)
            if isinstance(routed, str):  # not a decode workload: Inductor's and cuBLAS's
                log.debug("%s is not a decode projection: %s", out.name, routed)
                break
            site.op, site.spec = decode.OP, routed
            found.append(site)
            taken |= region
            break
    return found


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


# ---------------------------------------------------------------------------------------------
# Which sites to replace: stored (or freshly tuned) winners, checked on fresh inputs
# ---------------------------------------------------------------------------------------------


@dataclass
class _Resolver:
    db: Any
    tune: bool
    budget: int
    strategy: str
    # (family, workload, mode, device) -> the checked runner and its decision, or (status, reason):
    # a model's layers repeat their workloads, which are looked up, tuned and checked once.
    _done: dict[tuple[str, str, str, str], Any] = field(default_factory=dict)

    def resolve(self, site: Site, mode: str | None) -> None:
        """Set ``site.status`` (and its runners when it is to be replaced)."""
        if site.status != "found":
            return
        if mode is None:
            site.status = "unsupported"
            site.reason = "not CUDA tensors (set KERNELSMITH_INTERPRET=1 to run kernels on the CPU)"
            return
        family = get_op(site.op)
        device = _value(site.output).device
        if any(_dynamic(_value(i.node)) for i in site.inputs):
            self._resolve_dynamic(site, family, mode, device)
            return
        forward = self._runner(site, family, site.spec, mode, device)
        if forward is None:
            return
        site.speedup = forward[1].metrics.get("speedup")
        runners = [(site.op, [_input_meta(i) for i in site.inputs], forward[0])]
        if site.needs_grad:
            if family.backward is None:
                site.status, site.reason = "no backward", f"{site.op} has no backward kernel family"
                return
            backward_family = get_op(family.backward)
            try:
                backward_inputs = _backward_metas(family, site)
                backward_spec = backward_family.spec_for(*backward_inputs, **site.constants)
            except UnsupportedWorkload as exc:
                site.status, site.reason = "no backward", str(exc)
                return
            backward = self._runner(site, backward_family, backward_spec, mode, device)
            if backward is None:
                site.reason = f"backward: {site.reason}"
                return
            site.backward_speedup = backward[1].metrics.get("speedup")
            runners.append((backward_family.name, list(backward_inputs), backward[0]))
        site.status, site.runners = "replaced", runners
        site.triton_decision = triton_ops.site_decision(
            site.op, runners[0][1], dispatch.constants_json(site.constants), forward[1], mode, device,
            static=True, training=site.needs_grad)

    def _resolve_dynamic(self, site: Site, family: OpFamily, mode: str, device: torch.device) -> None:
        """A site of a graph with symbolic sizes: its op call carries every stored winner of its
        family with its constants and dtypes (and, in training, its backward family's), and the
        concrete shape of each call picks one (``kernelsmith::kernel``'s ``decisions``). With
        ``tune``, the workload of the graph's example shape is tuned (and checked) first."""
        if any(i.reshape is not None for i in site.inputs):
            site.status, site.reason = "unsupported", "an input is reshaped, in a graph with symbolic sizes"
            return
        if family.backward is None and site.needs_grad:
            site.status, site.reason = "no backward", f"{site.op} has no backward kernel family"
            return
        if self.tune:
            self._runner(site, family, site.spec, mode, device)  # tunes the example shape's bucket
        try:
            with open_database(self.db) as db:
                records = dispatch.carried_winners(db, family, site.spec, mode)
                if records and site.needs_grad and family.backward is not None:
                    backward = get_op(family.backward)
                    records += dispatch.carried_winners(db, backward, site.spec, mode, compare_dtypes=False)
        except DatabaseError as exc:
            warn_unusable_database(exc)
            site.status, site.reason = "no database", f"the database cannot be used: {exc}"
            return
        if not records:
            site.status = "not tuned"
            site.reason = (f"no stored {site.op} winner with these constants and dtypes (tune it, or pass "
                           "options={'tune': True})")
            return
        site.status, site.reason = "replaced", f"{len(records)} winner(s) carried, one chosen per call's shape"
        site.decisions = dispatch.encode_decisions(records, mode)

    def _runner(
        self, site: Site, family: OpFamily, spec: OpSpec, mode: str, device: torch.device
    ) -> tuple[dispatch.KernelRunner, DecisionRecord] | None:
        key = (family.name, spec.workload_hash, mode, str(device))
        if key not in self._done:
            self._done[key] = self._resolve_workload(family, spec, mode, device)
        found = self._done[key]
        if isinstance(found[0], str):
            site.status, site.reason = found
            return None
        return found  # type: ignore[no-any-return]

    def _resolve_workload(
        self, family: OpFamily, spec: OpSpec, mode: str, device: torch.device
    ) -> tuple[dispatch.KernelRunner, DecisionRecord] | tuple[str, str]:
        bucket = family.bucket(spec)
        try:
            decision = self._decision(bucket, mode)
            if decision is None and self.tune:
                from kernelsmith.tuner import tune_spec

                log.info("tuning %s (budget %d)", bucket.describe(), self.budget)
                tune_spec(bucket, budget=self.budget, strategy=self.strategy, db=self.db, mode=mode)
                decision = self._decision(bucket, mode)
        except DatabaseError as exc:  # a broken cache is not a broken program: one warning, Inductor's code
            warn_unusable_database(exc)
            return "no database", f"the database cannot be used: {exc}"
        if decision is None:
            hint = "tune it, or pass options={'tune': True}"
            return "not tuned", f"no stored decision for {bucket.describe()} ({hint})"
        if decision.winner != "kernel":
            return "baseline wins", f"the baseline wins for {bucket.describe()}"
        try:
            runner = dispatch.build_runner(family, spec, decision, db=self.db)
            inputs = family.make_inputs(spec, seed=20240611, device=device)
            trial = runner(inputs)
            problem = None
            for out, ref64, lowp in zip(
                trial, family.reference_fp64(spec, inputs), family.reference(spec, inputs), strict=True
            ):
                problem = problem or check_close(out, ref64, lowp, family.tolerance)
        except Exception as exc:  # a stored kernel that fails here must never break compilation
            problem = f"{type(exc).__name__}: {exc}"
        if problem:
            return "check failed", f"stored kernel for {bucket.describe()} not used: {problem}"
        return runner, decision

    def _decision(self, bucket: OpSpec, mode: str) -> DecisionRecord | None:
        with open_database(self.db) as db:
            return dispatch.stored_decision(db, mode, bucket)


def _backward_metas(family: OpFamily, site: Site) -> tuple[torch.Tensor, ...]:
    """The backward family's inputs as the autograd formula builds them, as meta tensors."""
    inputs = [_input_meta(i) for i in site.inputs]
    outputs = [torch.empty(t.shape, dtype=t.torch_dtype, device="meta") for t in family.output_specs(site.spec)]
    grads = [torch.empty_like(o, memory_format=torch.contiguous_format) for o in outputs]
    return tuple(family.backward_inputs(grads, inputs, outputs))


def _install(op: str, inputs: Sequence[torch.Tensor], constants: str, runner: dispatch.KernelRunner,
             device: torch.device, db: Any = None) -> None:
    """Serve ``runner`` to ``kernelsmith::kernel`` calls with exactly these inputs in this process,
    with serve checks against the op's reference (a failure is recorded in ``db``).

    A call that misses (other strides) resolves from the default database as usual.
    """
    dispatch.install_runner(op, inputs, constants, runner, device, db)


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
    graph.lint()
    return fx.GraphModule(gm, graph, class_name=type(gm).__name__)


def _fake_mode(gm: fx.GraphModule) -> Any:
    for node in gm.graph.nodes:
        mode = getattr(_value(node), "fake_mode", None)
        if mode is not None:
            return mode
    return None


def _rewrite_site(graph: fx.Graph, site: Site, val_map: dict[fx.Node, fx.Node], fake_mode: Any) -> None:
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
        args: list[fx.Node] = []
        for op_input in site.inputs:
            node = val_map[op_input.node]
            if op_input.reshape is not None:
                source, shape = _value(node), op_input.reshape
                node = graph.call_method("reshape", (node, shape))
                _set_value(node, fake_mode, functools.partial(torch.reshape, source, shape))
            args.append(node)
        # Inductor compiles kernelsmith::triton_kernel's kernel itself; kernelsmith::kernel stays a call.
        target, decisions = (triton_ops.OP, site.triton_decision) if site.triton_decision else (_KERNEL, site.decisions)
        kernel = graph.call_function(target, (site.op, args, constants, decisions))
        results = [graph.call_function(operator.getitem, (kernel, i)) for i in range(2 if add is not None else 1)]
    for node in (kernel, *results):
        for key in ("stack_trace", "nn_module_stack", "source_fn_stack"):
            if key in out.meta:
                node.meta[key] = out.meta[key]
    _set_value(kernel, fake_mode, lambda: target(site.op, [_value(a) for a in args], constants, decisions))
    for i, node in enumerate(results):
        if kernel.meta.get("example_value") is not None:
            node.meta["example_value"] = kernel.meta["example_value"][i]
    out.replace_all_uses_with(results[0])
    val_map[site.output] = results[0]  # a later site may take this value as an input
    for node in reversed(region):
        graph.erase_node(node)
    if add is not None:
        assert site.residual_add is not None
        add.replace_all_uses_with(results[1])
        val_map[site.residual_add] = results[1]
        graph.erase_node(add)


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


# ---------------------------------------------------------------------------------------------
# The backend
# ---------------------------------------------------------------------------------------------


_warned_nothing_replaced = False  # the warning below is given once per process


def _warn_nothing_replaced(sites: Sequence[Site]) -> None:
    """Say once, as a warning, that a graph with sites kernelsmith recognizes runs on Inductor
    alone, and why: most often nothing is tuned for these shapes on this machine yet, and a user
    who wrote ``backend="kernelsmith"`` would otherwise never learn that it did nothing. (A graph
    with no recognized site is only logged, at info: graph breaks make many such small graphs.)"""
    global _warned_nothing_replaced
    if not sites:
        log.info("no op kernelsmith recognizes in this graph: Inductor compiles it alone")
        return
    if _warned_nothing_replaced or all(site.status == "no database" for site in sites):
        return  # a broken database has had its own warning (kernelsmith.db.warn_unusable_database)
    _warned_nothing_replaced = True
    statuses = Counter(site.status for site in sites)
    found = ", ".join(f"{n} {status}" for status, n in sorted(statuses.items()))
    families = ", ".join(dict.fromkeys(site.op for site in sites))
    reasons = {site.status: site.reason for site in reversed(sites) if site.reason}  # the first of each
    why = "; ".join(f"{status}: {reason}" for status, reason in sorted(reasons.items()) if status != "not tuned")
    if statuses.get("not tuned"):
        why = "; ".join(filter(None, [
            "nothing is tuned for these shapes on this machine: run `kernelsmith optimize` (or "
            "kernelsmith.optimize_model) first, or pass options={'tune': True} to tune while compiling", why,
        ]))  # fmt: skip
    log.warning(
        "the kernelsmith backend replaced nothing in this graph, which runs on Inductor alone: %d %s (%s) found, "
        "%s%s (KERNELSMITH_LOG=info shows each site's reason)",
        len(sites), "site" if len(sites) == 1 else "sites", families, found, f"; {why}" if why else "",
    )


class KernelsmithBackend:
    """A ``torch.compile`` backend; ``torch.compile(model, backend=KernelsmithBackend(...))``.

    ``tune`` tunes sites with no stored decision (``budget`` evaluations each, ``strategy``);
    ``db`` is the database (path, URL or :class:`~kernelsmith.db.Database`; default
    ``$KERNELSMITH_DB`` or the per-user cache); ``families`` limits the op families replaced;
    ``compare`` keeps a rewritten graph only when it times faster than Inductor alone (None, the
    default: on for CUDA graphs, off in interpreter mode);
    ``fuse_residual`` folds residual adds into RMSNorms; ``inductor_options`` are Inductor
    config patches and ``mode`` an Inductor mode (``"max-autotune"``). ``discover=True`` only
    records the sites and runs the graph eagerly (what :func:`kernelsmith.optimize_model` uses to
    list a model's workloads). ``decode`` also matches decode-shaped projections
    (``decode_matmul``); ``timing`` is how the in-context comparison times graphs: ``"graph"`` as
    replayed CUDA graphs, ``"calls"`` call by call, ``"auto"`` the way the step will run
    (:func:`kernelsmith.whole_model.decode.in_context_timer`). Every site of every graph compiled
    is appended to :attr:`sites`.
    """

    def __init__(
        self,
        *,
        tune: bool = False,
        budget: int = 20,
        strategy: str = "auto",
        db: Any = None,
        families: Iterable[str] | None = None,
        compare: bool | None = None,
        fuse_residual: bool = True,
        inductor_options: dict[str, Any] | None = None,
        mode: str | None = None,
        discover: bool = False,
        decode: bool = False,
        timing: str = "auto",
    ) -> None:
        self.families = tuple(families) if families is not None else FAMILIES
        if decode:
            self.families = tuple(dict.fromkeys((*self.families, *DECODE_FAMILIES)))
        unknown = sorted(set(self.families) - set(KNOWN_FAMILIES))
        if unknown:
            known = ", ".join(KNOWN_FAMILIES)
            raise ValueError(f"the kernelsmith backend does not match {unknown} (it matches: {known})")
        self.timing = timing
        self.resolver = _Resolver(db, tune, budget, strategy)
        self.compare, self.fuse_residual, self.discover = compare, fuse_residual, discover
        self.inductor_options = dict(inductor_options or {})
        self.mode = mode
        self.sites: list[Site] = []

    def __call__(
        self, gm: fx.GraphModule, example_inputs: Sequence[Any], mode: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> Callable[..., Any]:
        if options or mode:  # per-call options, as torch.compile(..., mode=..., options={...}) passes them
            this = self.with_options(mode=mode, **(options or {}))
            this.sites = self.sites
            return this._compile(gm, example_inputs)
        return self._compile(gm, example_inputs)

    def __deepcopy__(self, memo: dict[int, Any]) -> KernelsmithBackend:
        """The backend itself: a copy would lose the sites it reports and the decisions it caches
        (transformers' ``CompileConfig`` deep-copies its backend before ``torch.compile``)."""
        return self

    def _compile(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        graph_sites = self._sites(gm)
        self.sites.extend(graph_sites)
        if self.discover:
            return gm.forward
        replaced = [s for s in graph_sites if s.status == "replaced"]
        for site in graph_sites:
            why = f" ({site.reason})" if site.reason else ""
            log.info("%s %s: %s%s", site.op, site.spec.describe(), site.status, why)
        if not replaced:
            _warn_nothing_replaced(graph_sites)
            return self._inductor(gm, example_inputs)
        for site in replaced:
            device = _value(site.output).device
            for op, inputs, runner in site.runners:
                _install(op, inputs, dispatch.constants_json(site.constants), runner, device, self.resolver.db)
        rewritten = rewrite(gm, replaced)
        compare = self.compare
        if compare is None:  # on for CUDA graphs; interpreter times are not performance
            compare = any(isinstance(t, torch.Tensor) and t.device.type == "cuda" for t in example_inputs)
        if not compare:
            return self._inductor(rewritten, example_inputs)
        return self._faster(gm, rewritten, example_inputs, replaced)

    def with_options(self, mode: str | None = None, **options: Any) -> KernelsmithBackend:
        """A backend like this one with ``options`` (backend keys and Inductor options) applied."""
        ours = {k: options.pop(k) for k in list(options) if k in BACKEND_OPTIONS}
        resolver = self.resolver
        return KernelsmithBackend(
            tune=bool(ours.get("tune", resolver.tune)),
            budget=int(ours.get("budget", resolver.budget)),
            strategy=str(ours.get("strategy", resolver.strategy)),
            db=ours.get("db", resolver.db),
            families=ours.get("families", self.families),
            compare=ours.get("compare", self.compare),
            fuse_residual=bool(ours.get("fuse_residual", self.fuse_residual)),
            inductor_options={**self.inductor_options, **options},
            mode=mode or self.mode,
            discover=self.discover,
            decode=bool(ours.get("decode", False)),
            timing=str(ours.get("timing", self.timing)),
        )

    def _sites(self, gm: fx.GraphModule) -> list[Site]:
        try:
            sites = find_sites(gm, self.families, self.fuse_residual)
        except Exception:  # matching is an optimization: it must never break compilation
            log.warning("kernelsmith could not match patterns in a graph; compiling it unchanged", exc_info=True)
            return []
        if self.discover:
            return sites
        for site in sites:
            values = [_value(i.node) for i in site.inputs]
            try:
                self.resolver.resolve(site, dispatch.mode_for(values))
            except Exception as exc:  # a database or tuning failure leaves the op to Inductor
                log.warning("%s %s not replaced: %s", site.op, site.spec.describe(), exc)
                site.status, site.reason = "check failed", f"{type(exc).__name__}: {exc}"
        return sites

    def _inductor(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        from torch._inductor import compile_fx as inductor

        patches = dict(self.inductor_options)
        if self.mode:
            from torch._inductor import list_mode_options

            patches = {**list_mode_options(self.mode), **patches}
        compiled = inductor.compile_fx(gm, example_inputs, config_patches=patches or None)
        return compiled  # type: ignore[return-value]  # a callable when called with a GraphModule

    def _faster(
        self, original: fx.GraphModule, rewritten: fx.GraphModule, example_inputs: Sequence[Any], replaced: list[Site]
    ) -> Callable[..., Any]:
        """The compiled rewritten graph if it times faster than Inductor alone, else Inductor's."""
        if any(isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs) and torch.is_grad_enabled():
            log.info("compare: training graphs are not timed in context; keeping the replacements")
            return self._inductor(rewritten, example_inputs)
        ours = self._inductor(rewritten, example_inputs)
        alone = self._inductor(original, example_inputs)
        timer = self._timer()
        alone_ms, ours_ms = timer([alone, ours], example_inputs)
        log.info("in context: Inductor alone %.3f ms, with every kernelsmith replacement %.3f ms", alone_ms, ours_ms)
        if ours_ms < alone_ms:
            return ours
        kept: list[Site] = []
        chosen, chosen_ms = alone, alone_ms
        families = sorted({site.op for site in replaced})
        if len(families) > 1:  # maybe one family's replacements pay where all of them together do not
            subsets = [[site for site in replaced if site.op == family] for family in families]
            graphs = [self._inductor(rewrite(original, subset), example_inputs) for subset in subsets]
            alone_ms, *family_ms = timer([alone, *graphs], example_inputs)
            for family, ms in zip(families, family_ms, strict=True):
                log.info("in context: Inductor alone %.3f ms, with %s replaced %.3f ms", alone_ms, family, ms)
            best = min(range(len(families)), key=lambda i: family_ms[i])
            if family_ms[best] < alone_ms:
                kept, chosen, chosen_ms = subsets[best], graphs[best], family_ms[best]
        kept_ids = {id(site) for site in kept}
        for site in replaced:
            if id(site) not in kept_ids:
                site.status = "slower in context"
                site.reason = (f"the graph took {ours_ms:.3f} ms with every replacement and {alone_ms:.3f} ms with "
                               f"Inductor alone" + (f" ({kept[0].op} alone: {chosen_ms:.3f} ms)" if kept else ""))
        return chosen


    def _timer(self) -> Callable[[Sequence[Callable[..., Any]], Sequence[Any]], list[float]]:
        """How the in-context comparison times a graph: the way the step will run, as a replayed
        CUDA graph where it runs as one (:func:`kernelsmith.whole_model.decode.in_context_timer`)."""
        from kernelsmith.whole_model.decode import in_context_timer

        return in_context_timer(self.timing, self.mode, self.inductor_options)


def backend(**options: Any) -> KernelsmithBackend:
    """A kernelsmith backend with options: ``torch.compile(model, backend=kernelsmith.backend(db="x.db"))``.

    Options: ``tune``, ``budget``, ``strategy``, ``db``, ``families``, ``compare``,
    ``fuse_residual``, ``decode``, ``timing`` (see :class:`KernelsmithBackend`); any other key is an
    Inductor option.
    """
    return KernelsmithBackend().with_options(**options)


def kernelsmith_backend(
    gm: fx.GraphModule, example_inputs: Sequence[Any], mode: str | None = None, options: dict[str, Any] | None = None
) -> Callable[..., Any]:
    """The backend registered as ``"kernelsmith"`` (entry point ``torch_dynamo_backends``)."""
    return backend(**(options or {}))(gm, example_inputs, mode)

