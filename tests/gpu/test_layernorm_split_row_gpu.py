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
from kernelsmith.testing.graph_replays import assert_sampled_configs_close_reproducible_and_graphed

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
    assert_sampled_configs_close_reproducible_and_graphed(
        SPLIT.space(spec),
        lambda config: build_with_stats("split_row", spec, config),
        inputs,
        lambda fill: [torch.full(t.shape, fill, dtype=t.torch_dtype, device="cuda") for t in stats_output_specs(spec)],
        lambda outs: check_close(outs[0], ref64, lowp, OP.tolerance),  # y; mean and rstd reproducible only
        "",
    )
