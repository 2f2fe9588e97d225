"""Finding the decode projections of a captured FX graph: ``decode_matmul`` sites.

Part of step 1 of the ``kernelsmith`` torch.compile backend, on request only (``decode=True``, or
``decode_matmul`` named in ``families``): :func:`kernelsmith.frontends._backend_sites.find_sites`
calls :func:`decode_sites` before it looks for any other family, since at decode shapes the
projections are the step and their fused epilogues save launches. What a decode projection is,
its RoPE epilogue and its RMSNorm prologue are :mod:`kernelsmith.frontends.patterns.decode`'s;
this module walks the graph with the site finder's regions and recognizer
(:mod:`kernelsmith.frontends._backend_sites`) and checks that a RoPE site's output, viewed as the
rewrite views it, is laid out as the graph reads it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import fx

from kernelsmith.frontends._backend_sites import (
    _CHARACTERISTIC,
    Site,
    _input_meta,
    _layout_problem,
    _levels,
    _recognize_region,
    _target_name,
    _value,
)
from kernelsmith.ops import get_op

log = logging.getLogger("kernelsmith.frontends.backend")  # the backend's logger: this is its site finding


def decode_sites(
    gm: fx.GraphModule,
    nodes: list[fx.Node],
    order: dict[fx.Node, int],
    taken: set[fx.Node],
    generators: dict[torch.device, torch.Generator],
    rope_decided: Callable[[Site], bool] | None = None,
) -> list[Site]:
    """``decode_matmul`` sites: first, where ``rope_decided`` is given, each layer's q, k and v
    projections as one ``weights="qkv"`` site that it says is decided
    (:mod:`kernelsmith.frontends.patterns.decode_qkv`), then each q or k projection left with its
    RoPE rotation that it says is decided (see ``find_sites``); then the matmul
    pattern's match on a region around each decode-shaped ``F.linear`` left (largest region
    first), routed to the decode family when its shape is one. Either kind takes the RMSNorm
    before it into its prologue where the norm qualifies
    (:mod:`kernelsmith.frontends.patterns.decode`)."""
    from kernelsmith.frontends.patterns import decode, decode_qkv

    norms: dict[fx.Node, Site] = {}  # RMSNorms whose every user is a decode projection: prologue candidates
    for x in decode.prologue_norms(gm, taken):
        for region in reversed(_levels(x, taken)):
            if not any(_target_name(n) in _CHARACTERISTIC for n in region):
                break  # nor will a smaller region hold a norm
            norm = _recognize_region(gm, x, region, nodes, order, {"rmsnorm"}, generators)
            if norm is not None:
                norms[x] = norm
                break

    def with_norm(site: Site) -> Site:
        """``site`` computing the RMSNorm before it in its prologue, where that norm qualifies and
        the fused site passes its check; else ``site`` as it is."""
        norm = norms.get(site.inputs[0].node)
        if norm is None:
            return site
        fused = decode.with_prologue(gm, site, norm, nodes, order, generators, site.output_view)
        if isinstance(fused, str):
            log.debug("%s keeps its norm %s: %s", site.output.name, norm.output.name, fused)
            return site
        return fused

    def plain_site(out: fx.Node, region: frozenset[fx.Node]) -> Site | str | None:
        """The matmul pattern's site on ``region`` routed to the decode family, its norm folded;
        None where the pattern does not match, why not where the shape is no decode workload."""
        site = _recognize_region(gm, out, region, nodes, order, {"matmul"}, generators)
        if site is None:
            return None
        routed = decode.decode_spec([_input_meta(i) for i in site.inputs], site.constants)
        if isinstance(routed, str):  # not a decode workload: Inductor's and cuBLAS's
            return routed
        site.op, site.spec = decode.OP, routed
        return with_norm(site)

    def plain_projection(linear: fx.Node) -> Site | None:
        site = plain_site(linear, frozenset({linear}))
        return site if isinstance(site, Site) else None

    found: list[Site] = []
    ropes: list[Site] = []
    for rope in decode.rope_sites(gm, taken) if rope_decided is not None else ():
        if not isinstance(rope, decode.RopeSite):
            continue  # (the linear, why not): rope_sites logged it; the plain projection may be a site
        problem = output_view_problem(rope.site)
        if problem:
            log.debug("%s is no RoPE site: %s", rope.site.output.name, problem)
            continue
        ropes.append(with_norm(rope.site))
    # q, k and v in one launch (weights="qkv") first, where decided; else the sites they are made of
    for fused in decode_qkv.qkv_sites(gm, ropes, taken, nodes, order, generators, plain_projection) if ropes else ():
        assert rope_decided is not None
        if set(fused.region) & taken or not rope_decided(fused):
            log.debug("%s %s has no decision: q, k and v stay three sites", fused.op, fused.spec.describe())
            continue
        found.append(fused)
        taken |= {*fused.region, *fused.prologue}
    for rotated in ropes:
        assert rope_decided is not None
        if set(rotated.region) & taken:
            continue  # in a fused QKV site
        if not rope_decided(rotated):  # its nodes stay free for the plain projection (below)
            log.debug("%s %s has no decision: its nodes go back to the plain projection", rotated.op,
                      rotated.spec.describe())  # fmt: skip
            continue
        found.append(rotated)
        taken |= {*rotated.region, *rotated.prologue}
    for candidates in decode.candidate_regions(gm, taken):
        for out, region in candidates:
            site = plain_site(out, region)
            if site is None:
                continue
            if isinstance(site, str):
                log.debug("%s is not a decode projection: %s", out.name, site)
                break
            found.append(site)
            taken |= {*region, *site.prologue}
            break
    return found


def output_view_problem(site: Site) -> str:
    """Why the kernel's output, viewed by the rewrite as ``site.output_view`` says, would not be
    laid out as the value the graph's users of the site's output read (``_layout_problem``);
    "" when it is, or when the site has no output view. The kernel writes its (B, S, H * D)
    output contiguous, so ``.view(B, S, H, D).transpose(1, 2)`` has strides (S*H*D, D, H*D, 1):
    those of the graph's own view and transpose of ``F.linear``'s output, which the rotation's
    elementwise ops give their result too (PyTorch lays an elementwise result out as its
    inputs are); with S = 1 they differ only in the stride of that size-1 dim."""
    if site.output_view is None:
        return ""
    (produced,) = get_op(site.op).output_specs(site.spec)
    kernel_out = torch.empty(produced.shape, dtype=produced.torch_dtype, device="meta")
    expected = _value(site.output)
    try:
        heads = kernel_out.view(site.output_view).transpose(1, 2)
    except RuntimeError as exc:
        return f"the kernel's {tuple(produced.shape)} output does not view as {site.output_view}: {exc}"
    if not isinstance(expected, torch.Tensor):
        return "the site's output is not a tensor"
    return _layout_problem(heads, expected)
