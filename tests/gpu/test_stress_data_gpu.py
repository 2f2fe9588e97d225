"""The stress data of validation (spikes, NaN/Inf, denormals, row-count residues) on the GPU.

In the interpreter every built-in kernel passes it (tests/test_validate_stress_data.py and the
families' harness tests); on the GPU, Triton's libdevice math flushes denormals (its default
``enable_reflect_ftz``) and ``tl.max`` ignores NaN, so this checks that the honest kernels still
pass the whole validation there, with one config of every variant of every family.
"""

from __future__ import annotations

import pytest
import torch

from kernelsmith.evaluate.validate import validate
from kernelsmith.ops import get_op, op_names

pytestmark = pytest.mark.gpu

# Each family in its own --shape terms; the default is rows x columns.
SHAPES = {
    "attention": (1, 2, 19, 16),  # B x H x S x D
    "rope": (1, 2, 9, 16),
    "matmul": (13, 24, 40),  # M x N x K
    "decode_matmul": (3, 24, 40),
    "decode_attention": (2, 4, 19, 16),  # B x H x L x D
    "linear_cross_entropy": (13, 40, 100),  # tokens x hidden x vocabulary
    "linear_cross_entropy_backward": (13, 40, 100),
    "linear_cross_entropy_fused": (13, 40, 100),
}


# Known gaps, each a case the harness rightly rejects: the test documents them until fixed. Not
# strict: validation draws secret random data, and the H200 run of 2026-12-01 saw this case both
# fail and pass (the gap shows only when a spike lands where it hurts).
GAPS = {
    ("layernorm_backward", "float32"): (
        "the built-in kernels' dw on spiky rows (dy and x with elements of 1e3-3e4) is about 10x "
        "less accurate than PyTorch's CUDA backward on the GPU (max abs 0.0075 against 0.00074, "
        "tolerance 0.0048; on 12 x 40). Cause not yet found: shifting the rows by their mean "
        "instead of x[0] did not close it (measured in the interpreter, with x[0] a spike)"
    ),
}
CASES = [
    pytest.param(name, dtype, id=f"{name}-{dtype}",
                 marks=[pytest.mark.xfail(strict=False, reason=GAPS[name, dtype])] if (name, dtype) in GAPS else [])
    for name in op_names()
    for dtype in ("float16", "bfloat16", "float32")
]


@pytest.mark.parametrize(("name", "dtype"), CASES)
def test_every_variant_passes_the_stress_data_on_the_gpu(name: str, dtype: str) -> None:
    op = get_op(name)
    if dtype not in op.dtypes:
        pytest.skip(f"{name} has no {dtype} kernels")
    spec = op.spec(SHAPES.get(name, (13, 40)), dtype)
    for variant in op.variants:
        configs = variant.space(spec).configs()
        if configs:
            assert validate(op, spec, variant.build, configs[-1], "cuda", torch.cuda.synchronize) > 0
