"""LayerNorm's split_row on the GPU: the compiled kernels (not the interpreter) on the wide rows it
is for, against the float64 reference, bitwise reproducible, and replayed inside a CUDA graph
(the scratch of chunk statistics allocated during the capture, from the graph's pool).

GPU only; the interpreter's tests are tests/interpreter/test_layernorm_split_row.py.
"""

from __future__ import annotations

import pytest
import torch

from kernelsmith.evaluate.errors import check_close
from kernelsmith.ops.layernorm import OP, build_with_stats, stats_output_specs

pytestmark = pytest.mark.gpu

SPLIT = OP.variant("split_row")


@pytest.mark.parametrize(("shape", "dtype", "affine"), [((8, 32000), "bfloat16", "weight_bias"),
                                                        ((3, 65537), "float32", "weight"),
                                                        ((1, 262144), "float16", "none")])  # fmt: skip
def test_every_config_is_close_reproducible_and_replays_in_a_graph(shape: tuple[int, int], dtype: str,
                                                                   affine: str) -> None:  # fmt: skip
    spec = OP.spec(shape, dtype, affine=affine)
    inputs = OP.make_inputs(spec, seed=1, distribution="offset", device="cuda")
    (ref64,) = OP.reference_fp64(spec, inputs)
    (lowp,) = OP.reference(spec, inputs)
    configs = SPLIT.space(spec).configs()
    assert configs
    for config in configs[:: max(1, len(configs) // 8)]:  # every BLOCK_N or so, a few warp counts
        launch = build_with_stats("split_row", spec, config)
        first = [torch.full(t.shape, float("nan"), dtype=t.torch_dtype, device="cuda")
                 for t in stats_output_specs(spec)]
        launch(inputs, first)
        problem = check_close(first[0], ref64, lowp, OP.tolerance)
        assert problem is None, f"{config}: {problem}"
        again = [torch.zeros_like(t) for t in first]
        launch(inputs, again)
        assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True)), f"{config}: not reproducible"
        graphed = [torch.zeros_like(t) for t in first]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            launch(inputs, graphed)
        graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(first, graphed, strict=True)), f"{config}: graph replay differs"
