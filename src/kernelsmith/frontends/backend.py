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
(:mod:`kernelsmith.frontends.patterns.decode`), and ``decode_attention``: SDPA over a static KV
cache (Hugging Face's ``StaticCache``; the causal mask of the query positions, or a boolean mask
such as ``generate()``'s), or a maskless one-token SDPA over a cache
(:mod:`kernelsmith.frontends.patterns.decode_attention`). Not (yet): bias + activation after a linear (no such op
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
one graph for every shape, with no launcher installed for one of them. A scalar argument Dynamo
made symbolic too (an RMSNorm's ``eps`` under ``dynamic=True``) is read at its example value into
the site's constants and guarded on it, so another value recompiles. A region that cannot be
recognized because a size is data-dependent (unbacked) is named in an info line.

Limits. Inputs must be
contiguous (the kernels' contract); a site whose region has an in-place op or a grad-mode switch
between its first node and its output is left alone; installed launchers live in this process.

The steps live in sibling modules: finding sites in :mod:`~kernelsmith.frontends._backend_sites`,
resolving them in :mod:`~kernelsmith.frontends._backend_resolve`, rewriting and timing in
:mod:`~kernelsmith.frontends._backend_rewrite`; this module holds the backend object that runs them.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import fx

from kernelsmith import dispatch
from kernelsmith.frontends._backend_resolve import _backward_metas as _backward_metas
from kernelsmith.frontends._backend_resolve import _install, _Resolver
from kernelsmith.frontends._backend_rewrite import _call as _call
from kernelsmith.frontends._backend_rewrite import rewrite
from kernelsmith.frontends._backend_rewrite import time_graphs as time_graphs
from kernelsmith.frontends._backend_sites import DECODE_FAMILIES, FAMILIES, KNOWN_FAMILIES, Site, _value, find_sites
from kernelsmith.frontends._backend_sites import MAX_REGION as MAX_REGION
from kernelsmith.frontends._backend_sites import OpInput as OpInput
from kernelsmith.frontends._backend_sites import _target_name as _target_name

log = logging.getLogger(__name__)

# Keys of torch.compile's ``options`` the backend takes; every other key is an Inductor option.
BACKEND_OPTIONS = frozenset({"tune", "budget", "strategy", "db", "families", "compare", "fuse_residual", "decode",
                             "timing"})


# ---------------------------------------------------------------------------------------------
# The backend
# ---------------------------------------------------------------------------------------------


_warned_nothing_replaced = False  # the warning below is given once per process


def _specialize(site: Site) -> None:
    """Guard each symbolic scalar the site's constants were read at on its example value.

    Under ``dynamic=True`` Dynamo passes a float argument (an RMSNorm's ``eps``) as a symbol; the
    op bakes the value it had when the site was recognized into its constants, so the compiled
    graph is right only for that value. The guard (ShapeEnv's, which Dynamo turns into a guard on
    the argument) makes another value recompile rather than run with the wrong constant.
    """
    from torch.fx.experimental.symbolic_shapes import guard_scalar

    for node in site.specialized:
        value = guard_scalar(_value(node))
        log.info("%s at %s: %s specialized to %r (its example value)", site.op, site.output.name, node.name, value)


def _warn_nothing_replaced(sites: Sequence[Site], notes: Sequence[str] = ()) -> None:
    """Say once, as a warning, that a graph with sites kernelsmith recognizes runs on Inductor
    alone, and why: most often nothing is tuned for these shapes on this machine yet, and a user
    who wrote ``backend="kernelsmith"`` would otherwise never learn that it did nothing. (A graph
    with no recognized site is only logged, at info: graph breaks make many such small graphs.)"""
    global _warned_nothing_replaced
    if not sites:
        why = f" ({'; '.join(notes)})" if notes else ""  # a region turned down for a dynamic-shape reason
        log.info("no op kernelsmith recognizes in this graph: Inductor compiles it alone%s", why)
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
    (``decode_matmul``) and attention over a KV cache (``decode_attention``); ``timing`` is how
    the in-context comparison times graphs: ``"graph"`` as replayed CUDA graphs, ``"calls"`` call
    by call, ``"auto"`` the way the step will run
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
        from torch._dynamo.exc import TensorifyScalarRestartAnalysis

        reported = len(self.sites)
        try:
            return self._compile_graph(gm, example_inputs)
        except TensorifyScalarRestartAnalysis:
            # A site's guard specialized a float argument (_specialize): Inductor asks Dynamo to
            # trace the frame again with that float as a constant, and the retrace's graph, not this
            # one, is what runs and what reports its sites.
            del self.sites[reported:]
            raise

    def _compile_graph(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        notes: list[str] = []
        graph_sites = self._sites(gm, notes)
        self.sites.extend(graph_sites)
        if self.discover:
            return gm.forward
        replaced = [s for s in graph_sites if s.status == "replaced"]
        for site in graph_sites:
            why = f" ({site.reason})" if site.reason else ""
            log.info("%s %s: %s%s", site.op, site.spec.describe(), site.status, why)
        if not replaced:
            _warn_nothing_replaced(graph_sites, notes)
            return self._inductor(gm, example_inputs)
        for site in replaced:
            _specialize(site)
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

    def _sites(self, gm: fx.GraphModule, notes: list[str] | None = None) -> list[Site]:
        # A q or k projection with its RoPE rotation is one site only where its kernel would be
        # served (discovery offers every one, to be tuned); elsewhere its nodes stay free for the
        # plain projection and the rope family, so a database tuned before these sites existed
        # still serves what it holds.
        rope_decided = (lambda site: True) if self.discover else self.resolver.kernel_decided
        try:
            sites = find_sites(gm, self.families, self.fuse_residual, notes, rope_decided=rope_decided)
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

