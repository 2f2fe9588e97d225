"""The row reductions' split_row on the GPU (sum, mean, max): the compiled kernels (not the
interpreter) on the wide and few rows they are for, against the float64 reference, bitwise
reproducible, replayed inside a CUDA graph (the scratch of chunk statistics allocated during the
capture, from the graph's pool), and a NaN in the last chunk propagating through the max.

GPU only; the interpreter's tests are tests/interpreter/test_reductions_split_row.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from kernelsmith.evaluate.errors import check_close
from kernelsmith.ops.reductions import MAX, MEAN, SUM
from kernelsmith.testing.graph_replays import assert_sampled_configs_close_reproducible_and_graphed

pytestmark = pytest.mark.gpu

OPS = {"sum": SUM, "mean": MEAN, "max": MAX}


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize(("shape", "dtype"), [((8, 32001), "bfloat16"), ((3, 65537), "float32"),
                                              ((1, 262144), "float16")])  # fmt: skip
def test_every_config_is_close_reproducible_and_replays_in_a_graph(name: str, shape: tuple[int, int],
                                                                   dtype: str) -> None:  # fmt: skip
    op = OPS[name]
    spec = op.spec(shape, dtype)
    inputs = op.make_inputs(spec, seed=1, distribution="normal", device="cuda")
    (ref64,) = op.reference_fp64(spec, inputs)
    (lowp,) = op.reference(spec, inputs)
    assert_sampled_configs_close_reproducible_and_graphed(
        op.variant("split_row").space(spec),
        lambda config: op.variant("split_row").build(spec, config),
        inputs,
        lambda fill: [torch.full((shape[0],), fill, dtype=inputs[0].dtype, device="cuda")],
        lambda outs: check_close(outs[0], ref64, lowp, op.tolerance),
        name,
    )


def test_max_propagates_a_nan_of_the_last_chunk() -> None:
    """The compiled max reduction (maxnum on the GPU) must still propagate NaN as torch.amax."""
    spec = MAX.spec((4, 40001), "bfloat16")
    (x,) = MAX.make_inputs(spec, seed=2, device="cuda")
    x[2, -1] = math.nan
    for config in MAX.variant("split_row").space(spec).configs()[::7]:
        y = torch.zeros((4,), dtype=x.dtype, device="cuda")
        MAX.variant("split_row").build(spec, config)((x,), (y,))
        assert bool(torch.isnan(y[2])), config
        assert torch.equal(y[[0, 1, 3]], torch.amax(x, -1)[[0, 1, 3]]), config
