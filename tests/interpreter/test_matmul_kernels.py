"""The ``matmul`` family (products with fused epilogues): kernels in the Triton interpreter without
a GPU, the harness, specs, precision, inputs, buckets and spaces.

Kernel outputs are pre-filled with NaN and followed by a NaN guard, so a kernel that skips an
element or writes past the end is caught; results are compared with the float64 reference under
the harness's own tolerance (``check_close``). Configs come from each variant's *validity* space
(what ``build`` accepts at any M), so that tall tiles run on short matrices too.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from kernelsmith.evaluate.errors import check_close
from kernelsmith.evaluate.validate import validate
from kernelsmith.ops import UnsupportedWorkload, get_op
from kernelsmith.ops.matmul import (
    OP,
    SHARED_MEMORY_BUDGET,
    Matmul,
    _geometry,
    _persistent_space,
    _split_k_space,
    _tiled_space,
    _tma_space,
    matmul_precision,
    parse_epilogue,
    tf32_allowed,
)
from kernelsmith.space import Config, Space
from kernelsmith.spec import OpSpec
from kernelsmith.testing.kernels import (
    assert_matches_fp64,
    assert_source_hash_covers,
    covering_configs,
    run_single_output,
)
from kernelsmith.testing.validation_runs import validation_runs

VARIANTS = ("tiled", "persistent", "split_k", "tma")
LAYOUTS = ("linear", "matmul")
DTYPES = ("float16", "bfloat16", "float32")
# Every epilogue, with and without a bias where it takes one.
EPILOGUES = ("none", "bias", "gelu", "bias+gelu_tanh", "silu", "bias+silu", "residual", "bias+residual", "swiglu")
# (..., M, N, K): M of 1 and 17, N of 1, 17, 100 and 129 (for 256-wide blocks), K of 1, 17 and 100,
# a 3-D x; nothing a multiple of a block but the 64s (EVEN_N and EVEN_K at the smallest blocks).
SHAPES: tuple[tuple[int, ...], ...] = ((1, 17, 100), (17, 100, 17), (5, 1, 33), (2, 3, 64, 64), (17, 33, 1),
                                       (3, 129, 40))  # fmt: skip
# split-K needs two K blocks or more: the same shapes with a deeper K where it is one block (K = 520
# for 16 splits of 32 and two blocks of 256).
SPLIT_SHAPES: tuple[tuple[int, ...], ...] = ((1, 17, 100), (17, 100, 77), (5, 1, 33), (2, 3, 64, 64), (17, 33, 520),
                                             (3, 129, 40))  # fmt: skip
# TMA needs rows of a multiple of 16 bytes: K (and N for layout "matmul") a multiple of 8 elements.
TMA_SHAPES: tuple[tuple[int, ...], ...] = ((1, 24, 104), (17, 104, 24), (5, 8, 40), (2, 3, 64, 64), (17, 40, 8),
                                           (3, 136, 40))  # fmt: skip
VALIDITY_SPACES = {"tiled": _tiled_space, "persistent": _persistent_space, "split_k": _split_k_space,
                   "tma": _tma_space}  # fmt: skip


def validity_space(variant: str, spec: OpSpec) -> Space:
    return VALIDITY_SPACES[variant](spec, prune=False)


def plan(variant: str, specs: list[OpSpec]) -> list[tuple[OpSpec, Config]]:
    """(spec, config) runs: each spec once, with the config that adds the most (parameter, value)
    pairs not seen yet, then the covering configs of each space until every pair has been seen."""
    runs: list[tuple[OpSpec, Config]] = []
    seen: set[tuple[str, object]] = set()
    for spec in specs:
        configs = validity_space(variant, spec).configs()
        assert configs, f"{variant} has no config for {spec.describe()}"
        best = max(configs, key=lambda c: len(set(c.items()) - seen))
        runs.append((spec, best))
        seen |= set(best.items())
    for spec in specs:
        for config in covering_configs(validity_space(variant, spec)):
            if set(config.items()) - seen:
                runs.append((spec, config))
                seen |= set(config.items())
    return runs


def run(spec: OpSpec, variant: str, config: Config, inputs: tuple[torch.Tensor, ...], launcher: Any = None) -> Any:
    return run_single_output(OP, spec, variant, config, inputs, launcher)


def assert_matches(spec: OpSpec, inputs: tuple[torch.Tensor, ...], y: torch.Tensor, what: str) -> None:
    assert_matches_fp64(OP, spec, inputs, y, what)


def specs_for(layout: str, variant: str = "tiled") -> list[OpSpec]:
    """Every (epilogue, dtype) pair once, the shapes in turn; float32 with TF32 allowed and not."""
    shapes = {"split_k": SPLIT_SHAPES, "tma": TMA_SHAPES}.get(variant, SHAPES)
    specs = []
    for i, (epilogue, dtype) in enumerate(itertools.product(EPILOGUES, DTYPES)):
        tf32 = dtype == "float32" and i % 2 == 0
        specs.append(OP.spec(shapes[i % len(shapes)], dtype, layout=layout, epilogue=epilogue, allow_tf32=tf32))
    return specs


# ---- every variant, every config class, small and odd shapes, every dtype and epilogue ------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_config_class_matches_the_reference(variant: str, layout: str, device: str) -> None:
    specs = specs_for(layout, variant)
    runs = plan(variant, specs)
    for i, (spec, config) in enumerate(runs):
        inputs = OP.make_inputs(spec, seed=i, distribution=OP.distributions[i % len(OP.distributions)], device=device)
        y = run(spec, variant, config, inputs)
        assert_matches(spec, inputs, y, f"{variant}/{layout} {config.key} {spec.describe()}")
    tested = {(k, v) for _, c in runs for k, v in c.items()}
    possible = {(k, v) for spec in specs for c in validity_space(variant, spec) for k, v in c.items()}
    assert tested == possible
    assert {(s.const("epilogue"), s.const("bias")) for s, _ in runs} == {parse_epilogue(e) for e in EPILOGUES}
    assert {s.inputs[0].dtype for s, _ in runs} == set(DTYPES)


def test_the_validity_spaces_offer_every_choice() -> None:
    """Across the test shapes every value of every parameter is in some space (so the test above
    runs each one): no choice is dead."""
    for variant in VARIANTS:
        values: dict[str, set[object]] = {}
        for spec in specs_for("linear", variant):
            for config in validity_space(variant, spec):
                for k, v in config.items():
                    values.setdefault(k, set()).add(v)
        for param in validity_space(variant, OP.spec((8, 4096, 4096), "bfloat16")).params:
            assert set(param.choices) == values[param.name], (variant, param.name)


def test_every_distribution(device: str) -> None:
    for i, distribution in enumerate(OP.distributions):
        spec = OP.spec((9, 40, 72), DTYPES[i % 3], epilogue=("bias+gelu", "swiglu", "residual")[i])
        inputs = OP.make_inputs(spec, seed=i, distribution=distribution, device=device)
        for variant in VARIANTS:
            config = validity_space(variant, spec).configs()[-1]
            y = run(spec, variant, config, inputs)
            assert_matches(spec, inputs, y, f"{variant} {distribution}")


def test_the_layouts_compute_the_same_function(device: str) -> None:
    linear = OP.spec((7, 40, 52), "float32", epilogue="bias+silu")
    matmul = OP.spec((7, 40, 52), "float32", layout="matmul", epilogue="bias+silu")
    x, w, b = OP.make_inputs(linear, seed=3, device=device)
    for variant in VARIANTS:
        config = validity_space(variant, linear).configs()[0]
        assert config in validity_space(variant, matmul)
        y_linear = run(linear, variant, config, (x, w, b))
        y_matmul = run(matmul, variant, config, (x, w.t().contiguous(), b))
        torch.testing.assert_close(y_linear, y_matmul, rtol=1e-6, atol=1e-6)


def test_persistent_programs_walk_several_tiles(device: str) -> None:
    # 200 x 130 in 64 x 64 tiles is 4 x 3 = 12 tiles for 4 programs (4 stand-in SMs), grouped by 8
    # rows (one group of 4 tile rows: the last group is partial).
    spec = OP.spec((200, 130, 70), "bfloat16", epilogue="residual")
    inputs = OP.make_inputs(spec, seed=2, device=device)
    for flatten in (False, True):
        config = Config(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, num_warps=4, num_stages=3, FLATTEN=flatten)
        assert_matches(spec, inputs, run(spec, "persistent", config, inputs), f"persistent FLATTEN={flatten}")


def test_grouped_order_covers_every_tile(device: str) -> None:
    # 7 tile rows (the last group of 8 is 7 rows tall) by 4 tile columns; and GROUP_M = 1.
    spec = OP.spec((100, 100, 40), "float16", epilogue="gelu")
    inputs = OP.make_inputs(spec, seed=4, device=device)
    for group in (1, 8):
        config = Config(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=group, num_warps=4, num_stages=2)
        assert_matches(spec, inputs, run(spec, "tiled", config, inputs), f"tiled GROUP_M={group}")


def test_split_k_with_uneven_and_empty_splits(device: str) -> None:
    # K = 160 is 5 blocks of 32: 4 splits take 2, 2, 1 and 0 blocks (the last stores zeros);
    # 2 splits of 3 and 2 blocks; K = 100 in blocks of 64: a masked last block.
    for k, block_k, splits in ((160, 32, 4), (160, 32, 2), (100, 64, 2)):
        spec = OP.spec((3, 50, k), "bfloat16", epilogue="swiglu")
        inputs = OP.make_inputs(spec, seed=k, distribution="outliers", device=device)
        config = Config(BLOCK_M=16, BLOCK_N=32, BLOCK_K=block_k, SPLIT_K=splits, num_warps=2, num_stages=2)
        assert config in validity_space("split_k", spec)
        y = run(spec, "split_k", config, inputs)
        assert_matches(spec, inputs, y, f"split_k K={k} BLOCK_K={block_k} SPLIT_K={splits}")
        assert torch.equal(y, run(spec, "split_k", config, inputs))  # bitwise reproducible


def test_tall_tiles_on_one_row(device: str) -> None:
    """A config tuned for many rows is correct for one (the validation tails, a bucket's rows)."""
    big = OP.spec((512, 64, 64), "bfloat16", epilogue="bias")
    one = OP.spec((1, 64, 64), "bfloat16", epilogue="bias")
    config = Config(BLOCK_M=256, BLOCK_N=64, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)
    assert config in OP.variant("tiled").space(big) and config not in OP.variant("tiled").space(one)
    inputs = OP.make_inputs(one, seed=0, device=device)
    assert_matches(one, inputs, run(one, "tiled", config, inputs), "256-row tiles on 1 row")


def test_tma_falls_back_to_pointers_for_unaligned_storage(device: str) -> None:
    spec = OP.spec((5, 40, 72), "bfloat16", epilogue="bias")
    x, w, b = OP.make_inputs(spec, seed=6, device=device)
    storage = torch.empty(x.numel() + 1, dtype=x.dtype, device=device)
    shifted = storage[1:].view(x.shape)  # contiguous, but 2 bytes past a 16-byte boundary
    shifted.copy_(x)
    assert shifted.data_ptr() % 16 != 0
    config = _tma_space(spec).configs()[0]
    y = run(spec, "tma", config, (shifted, w, b))
    assert_matches(spec, (x, w, b), y, "tma fallback")
    assert torch.equal(y, run(spec, "tiled", config, (x, w, b)))  # the very same tiles, through pointers


def test_the_tma_space_is_empty_where_descriptors_cannot_work(monkeypatch: pytest.MonkeyPatch) -> None:
    import kernelsmith.ops._matmul_launch as module  # (where the spaces read it)

    assert len(_tma_space(OP.spec((8, 40, 72), "bfloat16"))) > 0
    assert len(_tma_space(OP.spec((8, 40, 100), "bfloat16"))) == 0  # 200-byte rows
    assert len(_tma_space(OP.spec((8, 40, 100), "float32"))) > 0  # 400-byte rows
    assert len(_tma_space(OP.spec((8, 36, 72), "bfloat16", layout="matmul"))) == 0  # (K, N): 72-byte rows
    assert len(_tma_space(OP.spec((8, 36, 72), "bfloat16"))) > 0  # (N, K): N does not matter
    monkeypatch.setattr(module, "tma_available", lambda: False)  # an older Triton, or a pre-Hopper GPU
    assert len(_tma_space(OP.spec((8, 40, 72), "bfloat16"))) == 0


# ---- the harness ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("epilogue", "dtype"), [("bias+gelu", "bfloat16"), ("swiglu", "float16"),
                                                 ("residual", "float32")])  # fmt: skip
def test_one_config_of_each_variant_passes_the_harness(epilogue: str, dtype: str, device: str) -> None:
    spec = OP.spec((20, 40, 72), dtype, epilogue=epilogue)
    for variant in OP.variants:
        config = variant.space(spec).configs()[-1]
        # the target on every distribution of the family, three tails (1, 7 and 19 rows) on one
        # each (the stress data first), two runs apiece; swiglu's float16 product of denormal
        # data underflows to zero on most draws (blind), and that tail then draws once more
        maybe_blind = ("denormal",) if (epilogue, dtype) == ("swiglu", "float16") else ()
        runs = validate(OP, spec, variant.build, config, device, lambda: None)
        assert runs in validation_runs(OP, spec, maybe_blind), (variant.name, runs)


def test_validation_specs_and_buckets() -> None:
    spec = OP.spec((2, 40, 96, 64), "float16", epilogue="bias+residual")
    vspecs = OP.validation_specs(spec)
    assert [[t.shape for t in s.inputs] for s in vspecs] == [
        [(2, 40, 64), (96, 64), (96,), (2, 40, 96)],
        [(1, 64), (96, 64), (96,), (1, 96)],
        [(7, 64), (96, 64), (96,), (7, 96)],
        [(67, 64), (96, 64), (96,), (67, 96)],
        [(79, 64), (96, 64), (96,), (79, 96)],
    ]
    assert all(dict(s.constants) == dict(spec.constants) for s in vspecs)
    assert [s.inputs[0].shape for s in OP.validation_specs(OP.spec((1, 8, 8), "float32"))] == [(1, 8)]
    assert [s.inputs[0].shape for s in OP.validation_specs(OP.spec((8, 8, 8), "float32"))] == [(8, 8), (1, 8), (7, 8)]
    # every config of the target's (pruned) space builds for every tail
    for variant in OP.variants:
        for config in covering_configs(variant.space(spec)):
            for vspec in vspecs:
                variant.build(vspec, config)

    bucket = OP.bucket(OP.spec((5000, 4096, 1024), "bfloat16", epilogue="residual"))
    assert [t.shape for t in bucket.inputs] == [(8192, 1024), (4096, 1024), (8192, 4096)]
    assert bucket == OP.bucket(OP.spec((2, 3000, 4096, 1024), "bfloat16", epilogue="residual"))
    assert OP.bucket(OP.spec((1, 64, 64), "bfloat16")) == OP.spec((1, 64, 64), "bfloat16")
    assert OP.bucket(OP.spec((33, 64, 64), "bfloat16", epilogue="swiglu")).inputs[0].shape == (64, 64)


# ---- specs ---------------------------------------------------------------------------------------


def test_spec_from_the_command_line() -> None:
    spec = OP.spec((8192, 11008, 4096), "bf16", epilogue="bias+gelu")
    assert get_op("matmul") is OP and isinstance(OP, Matmul)
    assert dict(spec.constants) == {"layout": "linear", "epilogue": "gelu", "bias": True, "allow_tf32": False}
    assert [t.shape for t in spec.inputs] == [(8192, 4096), (11008, 4096), (11008,)]
    assert OP.output_specs(spec)[0].shape == (8192, 11008)
    swiglu = OP.spec((16, 11008, 4096), "fp16", layout="matmul", epilogue="swiglu")
    assert [t.shape for t in swiglu.inputs] == [(16, 4096), (4096, 11008), (4096, 11008)]
    residual = OP.spec((4, 2048, 4096, 4096), "bf16", epilogue="residual")
    assert [t.shape for t in residual.inputs] == [(4, 2048, 4096), (4096, 4096), (4, 2048, 4096)]
    assert OP.output_specs(residual)[0].shape == (4, 2048, 4096)
    assert OP.spec((8, 8, 8), "bf16", epilogue="bias") == OP.spec((8, 8, 8), "bf16", bias=True)
    assert OP.spec((8, 8, 8), "bf16", epilogue="gelu", bias=True) == OP.spec((8, 8, 8), "bf16", epilogue="bias,gelu")
    assert "MxNxK" in OP.shape_help and "epilogue" in OP.shape_help
    assert OP.small_shape((8192, 11008, 4096)) == (32, 128, 128)
    assert OP.small_shape((4, 3, 20, 30)) == (12, 20, 30)


def test_spec_for_matches_spec() -> None:
    x, w, b = torch.zeros(3, 5, 16, dtype=torch.bfloat16), torch.zeros(24, 16, dtype=torch.bfloat16), torch.zeros(
        24, dtype=torch.bfloat16)  # fmt: skip
    r = torch.zeros(3, 5, 24, dtype=torch.bfloat16)
    assert OP.spec_for(x, w) == OP.spec((3, 5, 24, 16), "bf16")
    assert OP.spec_for(x, w, b) == OP.spec((3, 5, 24, 16), "bf16", epilogue="bias")  # a bias, inferred
    assert OP.spec_for(x, w, b, epilogue="gelu") == OP.spec((3, 5, 24, 16), "bf16", epilogue="bias+gelu")
    assert OP.spec_for(x, w, r, epilogue="residual") == OP.spec((3, 5, 24, 16), "bf16", epilogue="residual")
    assert OP.spec_for(x, w, b, r, epilogue="residual", bias=True).const("bias") is True
    assert OP.spec_for(x, w, w, epilogue="swiglu") == OP.spec((3, 5, 24, 16), "bf16", epilogue="swiglu")
    assert OP.spec_for(x, w.t().contiguous(), layout="matmul") == OP.spec((3, 5, 24, 16), "bf16", layout="matmul")
    assert OpSpec.from_dict(OP.spec_for(x, w, b).to_dict()) == OP.spec_for(x, w, b)


@pytest.mark.parametrize(
    ("make", "constants"),
    [
        (lambda: (torch.zeros(4, 8), torch.zeros(6, 9)), {}),
        (lambda: (torch.zeros(4, 8), torch.zeros(8, 6)), {}),  # (K, N) without layout=matmul
        (lambda: (torch.zeros(4, 8), torch.zeros(6, 8)), {"layout": "matmul"}),
        (lambda: (torch.zeros(4, 8), torch.zeros(6, 8, dtype=torch.float16)), {}),
        (lambda: (torch.zeros(4, 8, dtype=torch.float64), torch.zeros(6, 8, dtype=torch.float64)), {}),
        (lambda: (torch.zeros(4, 8), torch.zeros(2, 6, 8)), {}),
        (lambda: (torch.zeros(4, 8), torch.zeros(6, 8), torch.zeros(5)), {}),  # a bias of the wrong size
        (lambda: (torch.zeros(4, 8), torch.zeros(6, 8), torch.zeros(4, 6)), {}),  # a residual without the epilogue
        (lambda: (torch.zeros(4, 8), torch.zeros(6, 8), torch.zeros(1, 6)), {"epilogue": "residual"}),
        (lambda: (torch.zeros(4, 8), torch.zeros(6, 8), torch.zeros(6, 9)), {"epilogue": "swiglu"}),
        (lambda: (torch.zeros(4, 8), torch.zeros(6, 8), torch.zeros(6, 8), torch.zeros(6)), {"epilogue": "swiglu"}),
        (lambda: (torch.zeros(4, 8), torch.zeros(8, 6).t()), {}),  # a transposed (non-contiguous) weight
        (lambda: (torch.zeros(0, 8), torch.zeros(6, 8)), {}),
        (lambda: (torch.zeros(()), torch.zeros(6, 1)), {}),
        (lambda: (torch.zeros(4, 8),), {}),
        (lambda: (torch.zeros(4, 8), torch.zeros(6, 8)), {"epilogue": "relu"}),
        (lambda: (torch.zeros(4, 8), torch.zeros(6, 8)), {"epilogue": "gelu+silu"}),
        (lambda: (torch.zeros(4, 8), torch.zeros(6, 8)), {"dim": -1}),
        (lambda: (torch.zeros(4, 8, dtype=torch.bfloat16), torch.zeros(6, 8, dtype=torch.bfloat16)),
         {"allow_tf32": True}),
    ],
    ids=["k-mismatch", "kn-as-linear", "nk-as-matmul", "dtypes", "float64", "3d-weight", "bias-size",
         "extra-tensor", "residual-shape", "w3-shape", "swiglu-bias", "transposed", "empty", "scalar", "one",
         "relu", "two-epilogues", "constant", "tf32-bf16"],
)  # fmt: skip
def test_spec_for_rejects_what_the_kernels_cannot_do(make, constants) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UnsupportedWorkload):
        OP.spec_for(*make(), **constants)


def test_bad_command_line_specs() -> None:
    bad: list[tuple[tuple[int, ...], dict]] = [
        ((8, 8), {}), ((8, 0, 8), {}), ((8, 8, 8), {"layout": "nt"}), ((8, 8, 8), {"epilogue": 1}),
        ((8, 8, 8), {"epilogue": "bias+swiglu"}), ((8, 8, 8), {"epilogue": "bias", "bias": False}),
        ((8, 8, 8), {"bias": "yes"}), ((8, 8, 8), {"eps": 1.0}), ((8, 8, 8), {"allow_tf32": "yes"}),
    ]  # fmt: skip
    for shape, constants in bad:
        with pytest.raises(UnsupportedWorkload):
            OP.spec(shape, "fp32", **constants)
    with pytest.raises(UnsupportedWorkload):
        OP.spec((8, 8, 8), "fp64")


def test_parse_epilogue() -> None:
    assert parse_epilogue("bias") == ("none", True)
    assert parse_epilogue("bias+gelu") == ("gelu", True)
    assert parse_epilogue(" GELU_TANH ") == ("gelu_tanh", False)
    assert parse_epilogue("residual, bias") == ("residual", True)
    assert parse_epilogue("silu", bias=True) == ("silu", True)
    assert parse_epilogue() == ("none", False)


def test_the_command_line_passes_the_epilogue(monkeypatch: pytest.MonkeyPatch) -> None:
    """``kernelsmith tune matmul --epilogue bias+gelu`` tunes that spec (the search itself stubbed)."""
    from typer.testing import CliRunner

    import kernelsmith.tuner
    from kernelsmith.cli.main import app

    seen: list[OpSpec] = []

    def stop(spec: OpSpec, **kwargs: object) -> None:
        seen.append(spec)
        raise RuntimeError("stubbed search")

    monkeypatch.setattr(kernelsmith.tuner, "tune_spec", stop)
    runner = CliRunner()
    runner.invoke(app, ["tune", "matmul", "--shape", "64x48x40", "--epilogue", "bias+gelu", "--budget", "1"])
    (spec,) = seen
    assert (spec.const("epilogue"), spec.const("bias")) == ("gelu", True)
    assert spec.inputs[1].shape == (48, 40)  # the weight (N, K); M may shrink in the interpreter
    refused = runner.invoke(app, ["tune", "matmul", "--shape", "64x48x40", "--epilogue", "relu"])
    assert refused.exit_code == 2 and "epilogue" in refused.output
    other = runner.invoke(app, ["tune", "softmax", "--shape", "8x64", "--epilogue", "gelu"])
    assert other.exit_code == 2 and "epilogue" in other.output


# ---- precision -----------------------------------------------------------------------------------


def test_the_tf32_setting_is_read_into_float32_specs_only() -> None:
    for allowed in (False, True):
        with matmul_precision(allowed):
            assert tf32_allowed() is allowed
            assert OP.spec((4, 8, 8), "float32").const("allow_tf32") is allowed
            assert OP.spec_for(torch.zeros(4, 8), torch.zeros(8, 8)).const("allow_tf32") is allowed
            assert OP.spec((4, 8, 8), "bfloat16").const("allow_tf32") is False
            assert OP.spec((4, 8, 8), "float32", allow_tf32=False).const("allow_tf32") is False
    ieee, tf32 = OP.spec((4, 8, 8), "float32", allow_tf32=False), OP.spec((4, 8, 8), "float32", allow_tf32=True)
    assert ieee.workload_hash != tf32.workload_hash
    assert _geometry(ieee).ieee and not _geometry(tf32).ieee
    assert not _geometry(OP.spec((4, 8, 8), "bfloat16")).ieee


def test_the_reference_runs_under_the_recorded_setting(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    seen: list[bool] = []
    real_linear = F.linear

    def spying_linear(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(tf32_allowed())
        return real_linear(*args, **kwargs)

    monkeypatch.setattr(F, "linear", spying_linear)
    before = tf32_allowed()
    for allowed in (True, False):
        spec = OP.spec((3, 8, 8), "float32", allow_tf32=allowed)
        OP.reference(spec, OP.make_inputs(spec, seed=0, device=device))
    assert seen == [True, False]
    assert tf32_allowed() == before  # restored


# ---- math and inputs -------------------------------------------------------------------------------


def test_references_are_what_users_write(device: str) -> None:
    cases = {
        "bias+gelu": lambda x, w, b: F.gelu(F.linear(x, w, b)),
        "gelu_tanh": lambda x, w: F.gelu(x @ w.T, approximate="tanh"),
        "bias+silu": lambda x, w, b: F.silu(F.linear(x, w, b)),
        "bias+residual": lambda x, w, b, r: F.linear(x, w, b) + r,
        "swiglu": lambda x, w1, w3: F.silu(x @ w1.T) * (x @ w3.T),
    }
    for epilogue, fn in cases.items():
        spec = OP.spec((2, 5, 24, 16), "bfloat16", epilogue=epilogue)
        inputs = OP.make_inputs(spec, seed=1, device=device)
        (y,) = OP.reference(spec, inputs)
        assert y.dtype == torch.bfloat16 and torch.equal(y, fn(*inputs))
        (y64,) = OP.reference_fp64(spec, inputs)
        assert y64.dtype == torch.float64
        torch.testing.assert_close(y64, fn(*(t.double() for t in inputs)), rtol=1e-12, atol=1e-12)
    spec = OP.spec((5, 24, 16), "float32", layout="matmul", epilogue="bias")
    x, w, b = OP.make_inputs(spec, seed=1, device=device)
    assert torch.equal(OP.reference(spec, (x, w, b))[0], x @ w + b)


def test_make_inputs(device: str) -> None:
    spec = OP.spec((64, 48, 256), "float32", epilogue="bias+residual")
    for distribution in OP.distributions:
        first = OP.make_inputs(spec, seed=11, distribution=distribution, device=device)
        again = OP.make_inputs(spec, seed=11, distribution=distribution, device=device)
        other = OP.make_inputs(spec, seed=12, distribution=distribution, device=device)
        assert all(torch.equal(p, q) for p, q in zip(first, again, strict=True))
        assert not any(torch.equal(p, q) for p, q in zip(first, other, strict=True))
        assert [tuple(t.shape) for t in first] == [t.shape for t in spec.inputs]
    x, w, b, r = OP.make_inputs(spec, seed=0, device=device)
    assert 0.9 < float(x.std()) < 1.1 and 0.9 < float(r.std()) < 1.1 and 0.7 < float(b.std()) < 1.3
    assert 0.9 < float(w.std()) * 16 < 1.1  # N(0, 1) / sqrt(K)
    assert 0.8 < float((x @ w.T).std()) < 1.2
    (wide, *_) = OP.make_inputs(spec, seed=0, distribution="wide", device=device)
    assert 7 < float(wide.std()) < 9
    (outliers, *_) = OP.make_inputs(spec, seed=0, distribution="outliers", device=device)
    loud = outliers.abs().mean(0) > 5
    assert int(loud.sum()) == 256 // 16  # one column in 16, the same in every row
    with pytest.raises(ValueError, match="distribution"):
        OP.make_inputs(spec, seed=0, distribution="cauchy", device=device)
    w1, w3 = OP.make_inputs(OP.spec((4, 8, 64), "float32", epilogue="swiglu"), seed=0, device=device)[1:]
    assert not torch.equal(w1, w3) and 0.08 < float(w3.std()) < 0.17


def test_bytes_and_flops() -> None:
    m, n, k = 4096, 11008, 4096
    spec = OP.spec((m, n, k), "bfloat16", epilogue="bias+gelu")
    assert OP.bytes_moved(spec) == 2 * (m * k + n * k + n + m * n)
    assert OP.flops(spec) == 2 * m * n * k + m * n * (6 + 1)
    swiglu = OP.spec((m, n, k), "bfloat16", epilogue="swiglu")
    assert OP.flops(swiglu) == 4 * m * n * k + 7 * m * n
    assert OP.bytes_moved(swiglu) == 2 * (m * k + 2 * n * k + m * n)
    assert OP.flops(OP.spec((m, n, k), "float32")) == 2 * m * n * k


def test_the_tolerance_tells_a_missing_epilogue_apart(device: str) -> None:
    spec = OP.spec((16, 64, 96), "bfloat16", epilogue="bias+gelu")
    x, w, b = OP.make_inputs(spec, seed=1, device=device)
    (ref64,) = OP.reference_fp64(spec, (x, w, b))
    (lowp,) = OP.reference(spec, (x, w, b))
    right = F.gelu(x.float() @ w.float().T + b.float()).to(torch.bfloat16)
    assert check_close(right, ref64, lowp, OP.tolerance) is None
    h = x.float() @ w.float().T
    for wrong in (F.gelu(h), h + b.float(), F.silu(h + b.float()), F.gelu(h + 2 * b.float())):
        assert check_close(wrong.to(torch.bfloat16), ref64, lowp, OP.tolerance) is not None


# ---- spaces --------------------------------------------------------------------------------------


def test_space_sizes() -> None:
    sizes = {}
    for shape in ((8192, 8192, 8192), (1, 4096, 4096), (16, 11008, 4096)):
        spec = OP.spec(shape, "bfloat16")
        sizes[shape] = {v.name: len(v.space(spec)) for v in OP.variants}
    assert sizes[(8192, 8192, 8192)]["split_k"] == 0  # split-K is for small M
    assert all(100 <= n <= 400 for n in sizes[(8192, 8192, 8192)].values() if n)
    assert all(40 <= n <= 400 for n in sizes[(1, 4096, 4096)].values()), sizes


@pytest.mark.parametrize("shape", [(1, 1, 1), (17, 100, 17), (4096, 4096, 4096), (64, 11008, 4096)])
def test_every_config_respects_its_budgets(shape: tuple[int, int, int]) -> None:
    for dtype, epilogue in itertools.product(DTYPES, ("none", "swiglu")):
        spec = OP.spec(shape, dtype, epilogue=epilogue)
        itemsize = spec.inputs[0].torch_dtype.itemsize
        weights = 2 if epilogue == "swiglu" else 1
        for variant in OP.variants:
            space = variant.space(spec)
            # split-K is for M <= 256 and needs two K blocks; TMA needs 16-byte rows
            empty_ok = {"split_k": shape[0] > 256 or shape[2] <= 32, "tma": shape[2] * itemsize % 16 != 0}
            assert len(space) > 0 or empty_ok.get(variant.name, False), variant.name
            for c in space:
                accumulators = weights * c["BLOCK_M"] * c["BLOCK_N"] / (32 * c["num_warps"])
                assert 4 <= accumulators <= 128
                stage = (c["BLOCK_M"] + weights * c["BLOCK_N"]) * c["BLOCK_K"] * itemsize
                assert c["num_stages"] * stage <= SHARED_MEMORY_BUDGET
                smallest = min(space.params[0].choices)  # BLOCK_M
                assert c["BLOCK_M"] <= max(smallest, 1 << (shape[0] - 1).bit_length())  # pruned to the padded M
                assert c in validity_space(variant.name, spec)


def test_build_rejects_a_config_outside_the_validity_space() -> None:
    spec = OP.spec((4, 100, 100), "float32")
    with pytest.raises(ValueError, match="not in the space"):  # 256 x 256 float32 accumulators
        OP.variant("tiled").build(spec, Config(BLOCK_M=256, BLOCK_N=256, BLOCK_K=32, GROUP_M=1, num_warps=8,
                                               num_stages=2))  # fmt: skip
    with pytest.raises(ValueError, match="not in the space"):  # a missing parameter
        OP.variant("split_k").build(spec, Config(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, num_warps=4, num_stages=2))
    with pytest.raises(ValueError, match="not in the space"):  # more splits than K blocks
        OP.variant("split_k").build(spec, Config(BLOCK_M=16, BLOCK_N=32, BLOCK_K=64, SPLIT_K=4, num_warps=4,
                                                 num_stages=2))  # fmt: skip


def test_variants_are_described() -> None:
    assert [v.name for v in OP.variants] == list(VARIANTS)
    assert len({v.source_hash for v in OP.variants}) == len(VARIANTS)
    # the hash covers the kernels, the launchers, the family and the activation code in
    # kernelsmith.ops.gelu, each in a module of its own
    assert_source_hash_covers(OP, ["kernelsmith.ops._matmul_kernels", "kernelsmith.ops._matmul_launch",
                                   "kernelsmith.ops.matmul", "kernelsmith.ops.gelu"])  # fmt: skip
    assert all(v.summary for v in OP.variants)
