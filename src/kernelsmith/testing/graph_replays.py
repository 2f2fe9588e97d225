"""GPU test checks shared by families: a launcher's results close, reproducible and the same when
replayed from a CUDA graph, and ``write_kv`` attention replayed at new positions.

They need a CUDA device (the GPU suites under tests/gpu call them); nothing here runs in the
interpreter. Each family's test keeps its own cases and says how to make its outputs and how
to judge them; the running, re-running and capturing is written once here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from kernelsmith import dispatch
from kernelsmith.ops._base import Launcher, OpFamily, Variant
from kernelsmith.space import Config, Space
from kernelsmith.spec import OpSpec

# How many configs of a space a GPU test runs: every len // CONFIG_SAMPLES-th one (every chunk
# width or so, a few warp counts), so a large space costs no more than a small one.
CONFIG_SAMPLES = 8


def assert_sampled_configs_close_reproducible_and_graphed(
    space: Space,
    build: Callable[[Config], Launcher],
    inputs: Sequence[torch.Tensor],
    outputs: Callable[[float], list[torch.Tensor]],
    problem: Callable[[list[torch.Tensor]], str | None],
    what: str,
    graph_fill: float = 0.0,
) -> None:
    """On a sample of ``space`` (which must not be empty: a test of no config would pass on
    nothing), each config's launcher made by ``build``: launched into ``outputs(nan)`` (so an
    element it skips stays NaN), ``problem`` of them must be None (the family's tolerance check);
    then again into ``outputs(0.0)``, bit for bit the same (no atomics, no order that depends on
    timing); then captured in a CUDA graph and replayed into ``outputs(graph_fill)``, the same
    again (scratch allocated during the capture comes from the graph's pool, and must work there)."""
    configs = space.configs()
    assert configs, f"{what}: the space is empty"
    for config in configs[:: max(1, len(configs) // CONFIG_SAMPLES)]:
        label = f"{what} {config}".strip()
        launch = build(config)
        first = outputs(math.nan)
        launch(inputs, first)
        found = problem(first)
        assert found is None, f"{label}: {found}"
        again = outputs(0.0)
        launch(inputs, again)
        assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True)), f"{label}: not reproducible"
        graphed = outputs(graph_fill)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            launch(inputs, graphed)
        graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(first, graphed, strict=True)), f"{label}: graph replay differs"


def assert_write_kv_replays_at_new_positions(family: OpFamily, spec: OpSpec, variant: Variant, config: Config) -> None:
    """A ``write_kv`` decode attention launcher captured once in a CUDA graph, then replayed on
    new caches, rows and positions copied into the captured buffers (the position is read on the
    device): each replay's output close to the family's reference on those inputs, and the
    caches bit for bit the reference's update (the new rows at the new positions, nothing else
    moved)."""
    runner = dispatch.KernelRunner.build(family, spec, variant.build(spec, config), variant.name, config)
    inputs = family.make_inputs(spec, 0, "uneven", "cuda")
    runner(inputs)  # compiles
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        (out,) = runner(inputs)
    for seed in (1, 2, 3):  # new caches, rows and positions in the same buffers
        fresh = family.make_inputs(spec, seed, "uneven", "cuda")
        for buffer, new in zip(inputs, fresh, strict=True):
            buffer.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        (expected,) = family.reference(spec, [t.clone() for t in fresh])
        torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2, msg=f"{variant.name} {config}")
        k_after, v_after = family.reference_written(spec, fresh)
        assert torch.equal(inputs[1], k_after) and torch.equal(inputs[2], v_after), f"{variant.name} {config}"
