"""decode_attention ``write_kv`` on the GPU: the fused cache write under the compiled kernels (not
the interpreter), inside CUDA graphs replayed at new positions (the position is read on the
device), and through the worker (validation, graph-replay timing on shared input sets, the state
check of the written caches after timing).

GPU only.
"""

from __future__ import annotations

import pytest

from kernelsmith.ops import get_op
from kernelsmith.space import Config
from kernelsmith.testing.graph_replays import assert_write_kv_replays_at_new_positions
from kernelsmith.testing.harness import evaluate_launcher

pytestmark = pytest.mark.gpu

FAMILY = get_op("decode_attention")


def test_every_variant_writes_the_rows_and_replays_at_new_positions_inside_a_capture():
    spec = FAMILY.spec((3, 32, 300, 128), "bf16", kv_heads=8, write_kv=True)
    for variant in FAMILY.variants:
        for config in variant.space(FAMILY.bucket(spec)).configs()[:2]:
            assert_write_kv_replays_at_new_positions(FAMILY, spec, variant, config)


@pytest.mark.parametrize("variant", ["single_pass", "split_kv"])
def test_the_worker_validates_and_times_write_kv_on_the_gpu(variant):
    spec = FAMILY.spec((1, 32, 1024, 64), "bf16", kv_heads=8, write_kv=True)
    chosen = FAMILY.variant(variant)
    config: Config = chosen.space(FAMILY.bucket(spec)).configs()[0]
    result = evaluate_launcher(spec, lambda s, c: chosen.build(s, config), mode="gpu")
    assert result.status == "ok", result.error
