"""RMSNorm backward's split_row on the GPU (and add_rmsnorm_backward's): the compiled kernels (not
the interpreter) on the wide and few rows they are for, dx and dw against the float64 reference
under the harness's tolerance, bitwise reproducible, and replayed inside a CUDA graph (the scratch
of chunk sums and the dw shares allocated during the capture, from the graph's pool).

GPU only; the interpreter's tests are tests/interpreter/test_rmsnorm_backward_split_row.py.
"""

from __future__ import annotations

import pytest
import torch

from kernelsmith.evaluate.errors import check_close
from kernelsmith.ops._base import OpFamily
from kernelsmith.ops.add_rmsnorm_backward import OP as ADD_RMSNORM_BACKWARD
from kernelsmith.ops.rmsnorm_backward import OP as RMSNORM_BACKWARD
from kernelsmith.spec import OpSpec
from kernelsmith.testing.graph_replays import assert_sampled_configs_close_reproducible_and_graphed

pytestmark = pytest.mark.gpu

OPS = {"rmsnorm_backward": RMSNORM_BACKWARD, "add_rmsnorm_backward": ADD_RMSNORM_BACKWARD}


def _outputs(op: OpFamily, spec: OpSpec, fill: float) -> list[torch.Tensor]:
    """The outputs (dx or dsum, dw), filled with ``fill``: a run must overwrite every element."""
    return [torch.full(o.shape, fill, dtype=o.torch_dtype, device="cuda") for o in op.output_specs(spec)]


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize(("shape", "dtype", "constants"), [
    ((8, 32001), "bfloat16", {}), ((3, 65537), "float32", {"weight_offset": 1.0}), ((1, 262144), "float16", {}),
    ((2, 4097), "bfloat16", {}),
])  # fmt: skip
def test_every_config_is_close_reproducible_and_replays_in_a_graph(name: str, shape: tuple[int, int], dtype: str,
                                                                   constants: dict[str, float]) -> None:  # fmt: skip
    op = OPS[name]
    split = op.variant("split_row")
    spec = op.spec(shape, dtype, **constants)
    inputs = op.make_inputs(spec, seed=1, distribution="normal", device="cuda")
    refs64 = op.reference_fp64(spec, inputs)
    lowps = op.reference(spec, inputs)

    def problem(outputs: list[torch.Tensor]) -> str | None:
        for out, ref64, lowp, what in zip(outputs, refs64, lowps, ("dx", "dw"), strict=True):
            found = check_close(out, ref64, lowp, op.tolerance)
            if found is not None:
                return f"{what}: {found}"
        return None

    # every BLOCK_N or so, both GROUPS, a few warp counts; the graph's outputs poisoned with -1
    assert_sampled_configs_close_reproducible_and_graphed(split.space(spec), lambda config: split.build(spec, config),
                                                          inputs, lambda fill: _outputs(op, spec, fill), problem, name,
                                                          graph_fill=-1.0)  # fmt: skip


def test_the_space_is_empty_at_8_kb_rows() -> None:
    """The recorded spaces of 4096-wide bfloat16 rows stand: no split_row config there."""
    for op in OPS.values():
        assert len(op.variant("split_row").space(op.spec((8192, 4096), "bfloat16"))) == 0
