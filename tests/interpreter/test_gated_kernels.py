"""The gated activation families (``swiglu``, ``geglu``) in both layouts: kernels in the Triton
interpreter without a GPU (every distribution, schedules at their edges), the tolerance, specs,
inputs and buckets.

Kernel outputs are pre-filled with NaN and followed by a NaN guard, so a kernel that skips an
element or writes past the end is caught; results are compared with the float64 reference under
the harness's own tolerance (``check_close``). Every variant's config classes on small and odd
shapes, the harness, the two layouts computing the same function and the variants' hashes are
the shared elementwise suite's (test_families.py), and so are the spaces' sizes, budgets and
refusals, which the gated families share with their backwards.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernelsmith.evaluate.errors import check_close
from kernelsmith.ops import UnsupportedWorkload
from kernelsmith.ops._base import tail_rows
from kernelsmith.ops._elementwise import tile_shape
from kernelsmith.ops.gated import GEGLU, SWIGLU, GeGLU, SwiGLU, _Gated
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec
from kernelsmith.testing.kernels import assert_matches_fp64, run_single_output

# (family, constants): SwiGLU, and GeGLU with each GELU formula.
FAMILIES: dict[str, tuple[_Gated, dict[str, str]]] = {
    "swiglu": (SWIGLU, {}),
    "geglu-tanh": (GEGLU, {"approximate": "tanh"}),
    "geglu-none": (GEGLU, {"approximate": "none"}),
}
LAYOUTS = ("pair", "concat")
DTYPES = ("float16", "bfloat16", "float32")


# ---- every distribution, schedules at their edges, the tolerance ---------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_distribution(family: str, layout: str, device: str) -> None:
    op, constants = FAMILIES[family]
    for i, distribution in enumerate(op.distributions):
        spec = op.spec((5, 96), DTYPES[i % 3], layout=layout, **constants)
        inputs = op.make_inputs(spec, seed=i, distribution=distribution, device=device)
        for variant in op.variants:
            config = variant.space(spec).configs()[-1]
            y = run_single_output(op, spec, variant.name, config, inputs)
            assert_matches_fp64(op, spec, inputs, y, f"{family}/{variant.name}/{layout} {distribution}")


def test_persistent_programs_walk_several_tiles(device: str) -> None:
    # H = 4097 in 1024-column tiles is 5 column tiles a row; 3 rows are 15 tiles for 4 programs
    # (4 stand-in SMs, one program each), the last tile of each row 1 column wide.
    spec = SWIGLU.spec((3, 4097), "bfloat16", layout="concat")
    assert tile_shape(4097, 1024) == (1, 1024)
    inputs = SWIGLU.make_inputs(spec, seed=2, distribution="wide", device=device)
    config = Config(PROGRAMS_PER_SM=1, TILE=1024, num_warps=4, num_stages=3)
    y = run_single_output(SWIGLU, spec, "persistent", config, inputs)
    assert_matches_fp64(SWIGLU, spec, inputs, y, "persistent, 4 programs for 15 tiles")


def test_persistent_tiles_follow_the_row_width() -> None:
    assert tile_shape(8192, 4096) == (1, 4096)
    assert tile_shape(100, 2048) == (16, 128)
    assert tile_shape(1, 1024) == (64, 16)  # at least 16 columns
    for h in (1, 7, 125, 4097, 11008):
        for tile in (1024, 2048, 4096):
            m, n = tile_shape(h, tile)
            assert m * n == tile and n >= min(tile, h)


def test_rows_tiles_cover_rows_and_columns_past_the_end(device: str) -> None:
    # 17 rows in 16-row tiles and 241 columns in 64-column tiles: a 1-row and a 49-column remainder.
    spec = GEGLU.spec((17, 241), "float32", layout="concat", approximate="none")
    inputs = GEGLU.make_inputs(spec, seed=5, distribution="tails", device=device)
    y = run_single_output(GEGLU, spec, "rows", Config(BLOCK_M=16, BLOCK_N=64, num_warps=2), inputs)
    assert_matches_fp64(GEGLU, spec, inputs, y, "rows 16x64 on 17x241")


def test_the_tolerance_tells_the_gate_from_the_up_projection(device: str) -> None:
    # silu(b) * a (halves swapped), gelu of the other formula, and silu for gelu all fail.
    spec = GEGLU.spec((8, 64), "bfloat16", layout="concat", approximate="tanh")
    (x,) = GEGLU.make_inputs(spec, seed=1, device=device)
    (ref64,) = GEGLU.reference_fp64(spec, (x,))
    (lowp,) = GEGLU.reference(spec, (x,))
    a, b = x.float().chunk(2, dim=-1)
    right = (F.gelu(a, approximate="tanh") * b).to(x.dtype)
    assert check_close(right, ref64, lowp, GEGLU.tolerance) is None
    for wrong in (F.gelu(b, approximate="tanh") * a, F.silu(a) * b, a * b):
        assert check_close(wrong.to(x.dtype), ref64, lowp, GEGLU.tolerance) is not None
    # in float32 even the other GELU formula is told apart
    spec32 = GEGLU.spec((8, 256), "float32", approximate="none")
    a32, b32 = GEGLU.make_inputs(spec32, seed=1, device=device)
    (ref64,) = GEGLU.reference_fp64(spec32, (a32, b32))
    (lowp,) = GEGLU.reference(spec32, (a32, b32))
    assert check_close(F.gelu(a32, approximate="tanh") * b32, ref64, lowp, GEGLU.tolerance) is not None


# ---- validation specs and buckets ---------------------------------------------------------------


def test_validation_specs_and_buckets_reshape_every_input() -> None:
    spec = SWIGLU.spec((2, 40, 3000), "float16")
    vspecs = SWIGLU.validation_specs(spec)
    tails = tail_rows(80, SWIGLU.row_block)
    assert [[t.shape for t in s.inputs] for s in vspecs] == [[(2, 40, 3000)] * 2] + [[(r, 3000)] * 2 for r in tails]
    concat = GEGLU.spec((2, 40, 3000), "float16", layout="concat", approximate="none")
    assert [s.inputs[0].shape for s in GEGLU.validation_specs(concat)] == [(2, 40, 6000)] + [(r, 6000) for r in tails]
    for s in GEGLU.validation_specs(concat):
        assert dict(s.constants) == {"layout": "concat", "approximate": "none"}
        for variant in GEGLU.variants:  # spaces depend on H and the dtype only
            assert variant.space(s).configs() == variant.space(concat).configs()

    assert SWIGLU.rowwise and GEGLU.rowwise
    bucket = SWIGLU.bucket(SWIGLU.spec((5000, 4096), "bfloat16"))
    assert [t.shape for t in bucket.inputs] == [(8192, 4096), (8192, 4096)]
    assert bucket == SWIGLU.bucket(SWIGLU.spec((2, 3000, 4096), "bfloat16"))
    bucket = GEGLU.bucket(GEGLU.spec((5000, 4096), "bfloat16", layout="concat"))
    assert [t.shape for t in bucket.inputs] == [(8192, 8192)] and bucket.const("approximate") == "tanh"


# ---- specs ---------------------------------------------------------------------------------------


def test_spec_from_the_command_line() -> None:
    pair = SWIGLU.spec((8192, 14336), "bf16")
    assert pair.op == "swiglu" and dict(pair.constants) == {"layout": "pair"}
    assert [t.shape for t in pair.inputs] == [(8192, 14336), (8192, 14336)]
    concat = SWIGLU.spec((8192, 14336), "bf16", layout="concat")
    assert [t.shape for t in concat.inputs] == [(8192, 28672)]
    assert SWIGLU.output_specs(pair) == SWIGLU.output_specs(concat)
    assert SWIGLU.output_specs(concat)[0].shape == (8192, 14336)
    assert dict(GEGLU.spec((4, 8), "fp32").constants) == {"layout": "pair", "approximate": "tanh"}
    assert GEGLU.spec((4, 8), "fp32", approximate="none").const("approximate") == "none"
    assert len({pair.workload_hash, concat.workload_hash, GEGLU.spec((8192, 14336), "bf16").workload_hash}) == 3
    assert "8192x14336" in SWIGLU.shape_help and "concat" in GEGLU.shape_help


def test_spec_for_matches_spec() -> None:
    a, b = torch.zeros(2, 16, 96, dtype=torch.bfloat16), torch.ones(2, 16, 96, dtype=torch.bfloat16)
    x = torch.zeros(2, 16, 192, dtype=torch.bfloat16)
    assert SWIGLU.spec_for(a, b) == SWIGLU.spec((2, 16, 96), "bfloat16")
    assert SWIGLU.spec_for(a, b, layout="pair") == SWIGLU.spec((2, 16, 96), "bf16", layout="pair")
    assert SWIGLU.spec_for(x) == SWIGLU.spec((2, 16, 96), "bfloat16", layout="concat")
    assert GEGLU.spec_for(x, approximate="none") == GEGLU.spec((2, 16, 96), "bf16", layout="concat", approximate="none")
    assert GEGLU.spec_for(a, b).workload_hash == GEGLU.spec((2, 16, 96), "bf16", approximate="tanh").workload_hash
    assert OpSpec.from_dict(GEGLU.spec_for(x).to_dict()) == GEGLU.spec_for(x)


@pytest.mark.parametrize(
    ("make", "constants"),
    [
        (lambda: (torch.zeros(4, 8), torch.zeros(4, 9)), {}),
        (lambda: (torch.zeros(4, 8), torch.zeros(8)), {}),
        (lambda: (torch.zeros(4, 8), torch.zeros(4, 8, dtype=torch.float16)), {}),
        (lambda: (torch.zeros(4, 8, dtype=torch.float64),) * 2, {}),
        (lambda: (torch.zeros(4, 8, dtype=torch.int32),), {}),
        (lambda: (torch.zeros(4, 7),), {}),
        (lambda: (torch.zeros(()),) * 2, {}),
        (lambda: (torch.zeros(0, 8),), {}),
        (lambda: (torch.zeros(8, 4).t(), torch.zeros(4, 8)), {}),
        (lambda: (torch.zeros(4, 16)[:, ::2],), {}),
        (lambda: (torch.zeros(4, 8),) * 3, {}),
        (lambda: (), {}),
        (lambda: (torch.zeros(4, 8),), {"layout": "pair"}),
        (lambda: (torch.zeros(4, 8),) * 2, {"layout": "concat"}),
        (lambda: (torch.zeros(4, 8),), {"layout": "interleaved"}),
        (lambda: (torch.zeros(4, 8),), {"dim": -1}),
    ],
    ids=["shapes", "broadcast", "dtypes", "float64", "int32", "odd-concat", "scalars", "empty", "transposed",
         "strided", "three", "none", "layout-pair", "layout-concat", "layout-unknown", "constant"],
)
def test_spec_for_rejects_what_the_kernels_cannot_do(make, constants) -> None:  # type: ignore[no-untyped-def]
    for op in (SWIGLU, GEGLU):
        with pytest.raises(UnsupportedWorkload):
            op.spec_for(*make(), **constants)


def test_bad_command_line_specs() -> None:
    for bad in [((4, 8), "fp64", {}), ((4, 0), "fp32", {}), ((), "fp32", {}), ((4, 8), "fp32", {"layout": "x"})]:
        shape, dtype, constants = bad
        with pytest.raises(UnsupportedWorkload):
            SWIGLU.spec(shape, dtype, **constants)
    with pytest.raises(UnsupportedWorkload, match="approximate"):
        GEGLU.spec((4, 8), "fp32", approximate="erf")
    with pytest.raises(UnsupportedWorkload, match="constants"):
        SWIGLU.spec((4, 8), "fp32", approximate="tanh")  # SwiGLU has no GELU formula
    with pytest.raises(ValueError):
        SWIGLU.spec((4, 8), "int3")


def test_bytes_and_flops() -> None:
    rows, h = 16384, 8192
    for layout in LAYOUTS:
        spec = SWIGLU.spec((rows, h), "bfloat16", layout=layout)
        assert SWIGLU.bytes_moved(spec) == 3 * rows * h * 2  # read a and b, write y
        assert SWIGLU.flops(spec) == 7 * rows * h
    assert GEGLU.bytes_moved(GEGLU.spec((3, 5), "float32", layout="concat")) == 3 * 15 * 4
    assert GEGLU.flops(GEGLU.spec((rows, h), "bfloat16")) == 11 * rows * h
    assert GEGLU.flops(GEGLU.spec((rows, h), "bfloat16", approximate="none")) == 6 * rows * h


def test_references() -> None:
    a = torch.linspace(-6, 6, 96, dtype=torch.bfloat16).view(2, 48)
    b = torch.linspace(2, -1, 96, dtype=torch.bfloat16).view(2, 48)
    x = torch.cat((a, b), dim=-1)
    xa, xb = x.chunk(2, dim=-1)  # strided views, as users write it (PyTorch's CPU GELU of a strided
    # bfloat16 view can differ from that of a contiguous copy in the far tail: compare like with like)
    assert torch.equal(SWIGLU.reference(SWIGLU.spec_for(a, b), (a, b))[0], F.silu(a) * b)
    assert torch.equal(SWIGLU.reference(SWIGLU.spec_for(x), (x,))[0], F.silu(xa) * xb)
    for approximate in ("none", "tanh"):
        spec = GEGLU.spec_for(x, approximate=approximate)
        assert torch.equal(GEGLU.reference(spec, (x,))[0], F.gelu(xa, approximate=approximate) * xb)
        pair = GEGLU.spec_for(a, b, approximate=approximate)
        assert torch.equal(GEGLU.reference(pair, (a, b))[0], F.gelu(a, approximate=approximate) * b)
        (y64,) = GEGLU.reference_fp64(spec, (x,))
        assert y64.dtype == torch.float64
        assert torch.equal(y64, F.gelu(a.double(), approximate=approximate) * b.double())
    (s64,) = SWIGLU.reference_fp64(SWIGLU.spec_for(a, b), (a, b))
    ad = a.double()
    assert torch.allclose(s64, ad / (1 + torch.exp(-ad)) * b.double(), rtol=1e-12, atol=1e-15)
    assert isinstance(SWIGLU, SwiGLU) and isinstance(GEGLU, GeGLU)
    assert (SWIGLU.name, GEGLU.name) == ("swiglu", "geglu")


# ---- inputs --------------------------------------------------------------------------------------
# (that they are deterministic by seed, shaped and typed: test_families.py)


def test_distributions_have_their_shape(device: str) -> None:
    spec = SWIGLU.spec((64, 512), "float32", layout="concat")
    halves = {}
    for d in SWIGLU.distributions:
        (x,) = SWIGLU.make_inputs(spec, seed=0, distribution=d, device=device)
        halves[d] = x.chunk(2, dim=-1)
    a, b = halves["normal"]
    assert 0.9 < float(a.std()) < 1.1 and 0.9 < float(b.std()) < 1.1
    assert abs(float(torch.corrcoef(torch.stack((a.flatten(), b.flatten())))[0, 1])) < 0.05  # independent
    assert 7 < float(halves["wide"][0].std()) < 9 and 7 < float(halves["wide"][1].std()) < 9
    assert 0.9e-3 < float(halves["small"][0].std()) < 1.1e-3 and 0.9 < float(halves["small"][1].std()) < 1.1
    tails = halves["tails"][0]
    assert 9.5 < float(tails.abs().mean()) < 10.5 and 0.45 < float((tails > 0).float().mean()) < 0.55
    # pair and concat draw the same a and b
    pa, pb = SWIGLU.make_inputs(SWIGLU.spec((64, 512), "float32"), seed=0, distribution="wide", device=device)
    assert torch.equal(pa, halves["wide"][0]) and torch.equal(pb, halves["wide"][1])
