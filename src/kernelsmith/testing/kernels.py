"""Helpers for testing kernels in the Triton interpreter: which configs to run, launching into
guarded outputs, and what a variant's source hash covers.

>>> from kernelsmith.ops import get_op
>>> op = get_op("softmax")
>>> spec = op.spec((3, 40), "float32")
>>> configs = covering_configs(op.variants[0].space(spec))
>>> all(isinstance(c, dict) or hasattr(c, "items") for c in configs)
True
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Sequence
from typing import Any
from unittest import mock

import torch

from kernelsmith.ops._base import OpFamily
from kernelsmith.space import Config, Space
from kernelsmith.spec import OpSpec


def covering_configs(space: Space) -> list[Config]:
    """Few configs that exercise every value of every parameter at least once.

    The first and the last config, then, greedily, every config that adds a (parameter, value)
    pair not seen yet. Asserts that the space is not empty: a variant without a config for a
    test's shape would otherwise be tested on nothing.
    """
    configs = space.configs()
    assert configs, f"the space is empty: {space}"
    chosen = [configs[0], configs[-1]] if len(configs) > 1 else [configs[0]]
    seen = {item for c in chosen for item in c.items()}
    for c in configs:
        new = set(c.items()) - seen
        if new:
            chosen.append(c)
            seen |= new
    return chosen


def launch_guarded(
    op: OpFamily, variant: str, spec: OpSpec, config: Config, inputs: Sequence[torch.Tensor], guard: int = 64
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Launch a variant into NaN-filled outputs, each followed by ``guard`` NaN elements that a
    kernel writing past its output's end would overwrite; return (outputs, guards)."""
    outs, guards = [], []
    for t in op.output_specs(spec):
        buffer = torch.full((t.numel + guard,), math.nan, dtype=t.torch_dtype, device=inputs[0].device)
        outs.append(buffer[: t.numel].view(t.shape))
        guards.append(buffer[t.numel :])
    op.variant(variant).build(spec, config)(inputs, outs)
    return outs, guards


def assert_guarded_outputs(
    op: OpFamily,
    spec: OpSpec,
    inputs: Sequence[torch.Tensor],
    outputs: Sequence[torch.Tensor],
    guards: Sequence[torch.Tensor],
    names: Sequence[str],
    what: str,
) -> None:
    """Each output fully written, nothing written past its end (its guard still NaN), and within
    the family's tolerance of the float64 reference, with its error floor, as the harness judges
    it (see :func:`launch_guarded`; ``inputs``: as they were before the launch)."""
    from kernelsmith.evaluate.errors import check_close, references

    refs = references(op, spec, inputs)
    for name, out, guard, ref64, lowp, floor in zip(names, outputs, guards, refs.fp64, refs.lowp, refs.floors,
                                                    strict=True):  # fmt: skip
        assert bool(torch.isfinite(out).all()), f"{what}: some {name} elements were never written"
        assert bool(torch.isnan(guard).all()), f"{what}: the kernel wrote past the end of {name}"
        problem = check_close(out, ref64, lowp, op.tolerance, floor)
        assert problem is None, f"{what} {name}: {problem}"


def run_guarded_and_check(
    op: OpFamily, variant: str, spec: OpSpec, config: Config, inputs: Sequence[torch.Tensor],
    names: Sequence[str], what: str, guard: int = 64,
) -> list[torch.Tensor]:  # fmt: skip
    """:func:`launch_guarded`, then the inputs unchanged and :func:`assert_guarded_outputs` on every
    output (``names``, one per output, say which failed). Returns the outputs."""
    before = [t.clone() for t in inputs]
    outs, guards = launch_guarded(op, variant, spec, config, inputs, guard)
    assert all(torch.equal(t, b) for t, b in zip(inputs, before, strict=True)), f"{what}: modified its inputs"
    assert_guarded_outputs(op, spec, before, outs, guards, names, what)
    return outs


def run_single_output(
    op: OpFamily, spec: OpSpec, variant: str, config: Config, inputs: Sequence[torch.Tensor],
    launcher: Any = None, guard: int = 64,
) -> torch.Tensor:  # fmt: skip
    """Launch a one-output variant (or ``launcher``, built elsewhere) into a NaN-filled output with
    a NaN guard after it; assert that nothing was written past the end and the inputs are
    unchanged; return the output."""
    before = [t.clone() for t in inputs]
    (out,) = op.output_specs(spec)
    buffer = torch.full((out.numel + guard,), math.nan, dtype=out.torch_dtype, device=inputs[0].device)
    y = buffer[: out.numel].view(out.shape)
    (launcher or op.variant(variant).build(spec, config))(inputs, (y,))
    assert bool(torch.isnan(buffer[out.numel :]).all()), f"{variant} {config.key} wrote past the end"
    assert all(torch.equal(t, b) for t, b in zip(inputs, before, strict=True)), f"{variant} modified its inputs"
    return y


def assert_matches_fp64(op: OpFamily, spec: OpSpec, inputs: Sequence[torch.Tensor], y: torch.Tensor, what: str) -> None:
    """``y`` fully written and within the family's tolerance of its float64 reference, with its
    error floor, as the harness judges it (``inputs``: as they were before the launch)."""
    from kernelsmith.evaluate.errors import references

    assert bool(torch.isfinite(y).all()), f"{what}: some outputs were never written"
    problem = references(op, spec, inputs).problem([y], op.tolerance)
    assert problem is None, f"{what}: {problem}"


def assert_source_hash_covers(op: OpFamily, modules: Sequence[str]) -> None:
    """Every variant's source hash changes when the source of any of ``modules`` (by name) does:
    the kernels, launchers and borrowed helpers a variant runs, wherever they live, so that a
    change in any of them makes stored decisions re-validate."""
    before = {v.name: v.source_hash for v in op.variants}
    real_getsource = inspect.getsource
    for name in modules:
        module = importlib.import_module(name)

        def edited(obj: Any, module: Any = module) -> str:
            return real_getsource(obj) + ("\n# edited" if obj is module else "")

        with mock.patch.object(inspect, "getsource", edited):
            after = {v.name: v.source_hash for v in op.variants}
        unchanged = sorted(v for v in before if after[v] == before[v])
        assert not unchanged, f"{op.name}: the source hashes of {unchanged} do not cover {name}"
