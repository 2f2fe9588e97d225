"""SwiGLU and GeGLU backward (``swiglu_backward``, ``geglu_backward``): the kernels against the
written-out formulas and at saturated and huge gates in the Triton interpreter, and the specs,
inputs, references and spaces.

Kernel outputs are pre-filled with NaN and followed by a NaN guard, so a kernel that skips an
element or writes past the end is caught; results are compared with the float64 reference under
the harness's own tolerance (``check_close``). Every variant's config classes on small and odd
shapes, the harness, the two layouts computing the same function and the variants' hashes are
the shared elementwise suite's (test_families.py).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from kernelsmith.evaluate.errors import check_close
from kernelsmith.ops import UnsupportedWorkload, get_op
from kernelsmith.ops._base import tail_rows
from kernelsmith.ops.gated import GEGLU, SWIGLU
from kernelsmith.ops.gated_backward import (
    GEGLU_BACKWARD,
    SWIGLU_BACKWARD,
    GeGLUBackward,
    SwiGLUBackward,
    _GatedBackward,
)
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec
from kernelsmith.testing.kernels import launch_guarded

# (family, constants): SwiGLU, and GeGLU with each GELU formula.
FAMILIES: dict[str, tuple[_GatedBackward, dict[str, str]]] = {
    "swiglu": (SWIGLU_BACKWARD, {}),
    "geglu-tanh": (GEGLU_BACKWARD, {"approximate": "tanh"}),
    "geglu-none": (GEGLU_BACKWARD, {"approximate": "none"}),
}
LAYOUTS = ("pair", "concat")
DTYPES = ("float16", "bfloat16", "float32")


def run(op: _GatedBackward, variant: str, spec: OpSpec, config: Config, inputs: tuple[torch.Tensor, ...]
        ) -> list[torch.Tensor]:  # fmt: skip
    """Launch into NaN-filled outputs, each followed by a NaN guard; check the guards and inputs."""
    before = [t.clone() for t in inputs]
    outs, guards = launch_guarded(op, variant, spec, config, inputs)
    assert all(bool(torch.isnan(g).all()) for g in guards), f"{variant} {config.key} wrote past the end"
    assert all(torch.equal(t, b) for t, b in zip(inputs, before, strict=True)), f"{variant} modified its inputs"
    return outs


def formulas_fp64(family: str, dy: torch.Tensor, a: torch.Tensor, b: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(da, db) from the module docstring's formulas in float64, written out (no autograd)."""
    dy, a, b = dy.double(), a.double(), b.double()
    if family == "swiglu":
        s = torch.sigmoid(a)
        act, grad = a * s, s * (1 + a * (1 - s))
    elif family == "geglu-none":
        cdf = 0.5 * (1 + torch.erf(a / math.sqrt(2)))
        pdf = torch.exp(-0.5 * a * a) / math.sqrt(2 * math.pi)
        act, grad = a * cdf, cdf + a * pdf
    else:
        k = math.sqrt(2 / math.pi)
        t = torch.tanh(k * (a + 0.044715 * a**3))
        act = 0.5 * a * (1 + t)
        grad = 0.5 * (1 + t) + 0.5 * a * (1 - t * t) * k * (1 + 3 * 0.044715 * a * a)
    return dy * b * grad, dy * act


def split(spec: OpSpec, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dy, a, b) of either layout."""
    if spec.const("layout") == "concat":
        a, b = inputs[1].chunk(2, dim=-1)
        return inputs[0], a, b
    return inputs[0], inputs[1], inputs[2]


# ---- the written-out formulas, saturated gates ------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_kernels_and_references_match_the_written_out_formulas(family: str, layout: str, device: str) -> None:
    op, constants = FAMILIES[family]
    spec = op.spec((9, 130), "float32", layout=layout, **constants)
    inputs = op.make_inputs(spec, seed=4, distribution="normal", device=device)
    da64, db64 = formulas_fp64(family, *split(spec, inputs))
    expected = (da64, db64) if layout == "pair" else (torch.cat((da64, db64), dim=-1),)
    for ref in op.reference_fp64(spec, inputs), op.reference(spec, inputs):
        for r, e in zip(ref, expected, strict=True):
            assert torch.allclose(r.double(), e, rtol=1e-5, atol=1e-6)
    for r, e in zip(op.reference_fp64(spec, inputs), expected, strict=True):
        assert r.dtype == torch.float64 and torch.allclose(r, e, rtol=1e-12, atol=1e-14)
    for variant in op.variants:
        outs = run(op, variant.name, spec, variant.space(spec).configs()[0], inputs)
        for out, e in zip(outs, expected, strict=True):
            assert out.dtype == torch.float32
            assert torch.allclose(out.double(), e, rtol=2e-6, atol=1e-6), variant.name


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter evaluates both where() branches
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_saturated_and_huge_gates_give_finite_gradients(family: str, dtype: str, device: str) -> None:
    # Where exp(-|z|) underflows, or even a^2 or a^3 overflows float32, the derivatives are
    # exactly 1 (a > 0) or 0 (a < 0): no inf, no NaN, no 0 * inf.
    op, constants = FAMILIES[family]
    big = 6e4 if dtype == "float16" else 1e30
    values = [0.0, 1.0, -1.0, 9.0, -9.0, 20.0, -20.0, 100.0, -100.0, big, -big]
    if dtype == "float32":
        values += [3e38, -3e38]
    spec = op.spec((len(values),), dtype, **constants)
    torch_dtype = spec.inputs[0].torch_dtype
    a = torch.tensor(values, dtype=torch_dtype, device=device)
    dy = torch.full_like(a, 1.0)
    b = torch.full_like(a, 0.5)
    refs = op.reference_fp64(spec, (dy, a, b))
    for ref, formula in zip(refs, formulas_fp64(family, dy, a, b), strict=True):  # autograd agrees
        assert torch.allclose(ref, formula, rtol=1e-9, atol=1e-300)
    # Results below the dtype's smallest normal may flush to 0 or lose digits; and for a << 0 the
    # float64 reference of the tanh form cancels in 1 + tanh(u) (the kernels, with sigmoid(2u),
    # do not), which leaves it absolute errors of about 1e-16 where the true gradient is ~1e-27.
    atol = max(torch.finfo(torch_dtype).tiny, 1e-12)
    for variant in op.variants:
        outs = run(op, variant.name, spec, variant.space(spec).configs()[0], (dy, a, b))
        for out, ref in zip(outs, refs, strict=True):
            assert bool(torch.isfinite(out).all()), (variant.name, out)
            assert torch.allclose(out.double(), ref, rtol=1e-2, atol=atol), (variant.name, out, ref)
        da, db = outs
        assert bool((da[a > 9] == 0.5).all()) and torch.equal(db[a > 9], a[a > 9])  # act' = 1, act = a
        assert bool((da[a < -100] == 0).all()) and bool((db[a < -100] == 0).all())


# ---- references and tolerance ----------------------------------------------------------------------


def test_the_tolerance_catches_mistakes(device: str) -> None:
    spec = GEGLU_BACKWARD.spec((8, 64), "bfloat16", layout="concat", approximate="tanh")
    inputs = GEGLU_BACKWARD.make_inputs(spec, seed=1, device=device)
    (ref64,) = GEGLU_BACKWARD.reference_fp64(spec, inputs)
    (lowp,) = GEGLU_BACKWARD.reference(spec, inputs)
    dy, a, b = (t.double() for t in split(spec, inputs))

    def dx(da: torch.Tensor, db: torch.Tensor) -> torch.Tensor:
        return torch.cat((da, db), dim=-1).to(torch.bfloat16)

    assert check_close(ref64.to(torch.bfloat16), ref64, lowp, GEGLU_BACKWARD.tolerance) is None
    da, db = formulas_fp64("geglu-tanh", dy, a, b)
    assert check_close(dx(da, db), ref64, lowp, GEGLU_BACKWARD.tolerance) is None
    # the halves swapped, act for act', silu's derivative, db times b, da without dy or b
    silu_da, _ = formulas_fp64("swiglu", dy, a, b)
    act = F.gelu(a, approximate="tanh")
    for wrong in (dx(db, da), dx(dy * b * act, db), dx(silu_da, db), dx(da, dy * act * b), dx(da / dy, db),
                  dx(da / b, db)):  # fmt: skip
        assert check_close(wrong, ref64, lowp, GEGLU_BACKWARD.tolerance) is not None
    # the other GELU formula is told apart in float32
    spec32 = GEGLU_BACKWARD.spec((8, 256), "float32", approximate="tanh")
    inputs32 = GEGLU_BACKWARD.make_inputs(spec32, seed=1, device=device)
    ref64_da, _ = GEGLU_BACKWARD.reference_fp64(spec32, inputs32)
    lowp_da, _ = GEGLU_BACKWARD.reference(spec32, inputs32)
    other, _ = formulas_fp64("geglu-none", *inputs32)
    assert check_close(other.float(), ref64_da, lowp_da, GEGLU_BACKWARD.tolerance) is not None


def test_references_are_autograd_through_the_forward(device: str) -> None:
    a = torch.linspace(-6, 6, 96, dtype=torch.bfloat16, device=device).view(2, 48)
    b = torch.linspace(2, -1, 96, dtype=torch.bfloat16, device=device).view(2, 48)
    dy = torch.linspace(-1, 1, 96, dtype=torch.bfloat16, device=device).view(2, 48)
    x = torch.cat((a, b), dim=-1)
    ag, bg, xg = (t.clone().requires_grad_() for t in (a, b, x))
    (F.silu(ag) * bg).backward(dy)
    da, db = SWIGLU_BACKWARD.reference(SWIGLU_BACKWARD.spec_for(dy, a, b), (dy, a, b))
    assert torch.equal(da, ag.grad) and torch.equal(db, bg.grad)
    xa, xb = xg.chunk(2, dim=-1)
    (F.gelu(xa, approximate="none") * xb).backward(dy)
    with torch.no_grad():  # autograd is switched on inside
        (dx,) = GEGLU_BACKWARD.reference(GEGLU_BACKWARD.spec_for(dy, x, approximate="none"), (dy, x))
    assert dx.dtype == torch.bfloat16 and torch.equal(dx, xg.grad)
    (dx64,) = GEGLU_BACKWARD.reference_fp64(GEGLU_BACKWARD.spec_for(dy, x), (dy, x))
    assert dx64.dtype == torch.float64 and dx64.shape == (2, 96)
    assert not any(t.requires_grad for t in (da, db, dx, dx64))


# ---- specs -----------------------------------------------------------------------------------------


def test_registry_and_the_forward_families() -> None:
    assert get_op("swiglu_backward") is SWIGLU_BACKWARD and get_op("geglu_backward") is GEGLU_BACKWARD
    assert get_op(SWIGLU.backward) is SWIGLU_BACKWARD and get_op(GEGLU.backward) is GEGLU_BACKWARD  # type: ignore[arg-type]
    assert isinstance(SWIGLU_BACKWARD, SwiGLUBackward) and isinstance(GEGLU_BACKWARD, GeGLUBackward)
    assert SWIGLU_BACKWARD.forward is SWIGLU and GEGLU_BACKWARD.forward is GEGLU
    assert SWIGLU_BACKWARD.rowwise and GEGLU_BACKWARD.backward is None
    # (the variants' names, summaries and what their hashes cover: test_families.py)
    hashes = {v.source_hash for v in SWIGLU_BACKWARD.variants}
    assert not hashes & {v.source_hash for v in SWIGLU.variants}
    assert "8192x14336" in SWIGLU_BACKWARD.shape_help and "concat" in GEGLU_BACKWARD.shape_help


def test_spec_from_the_command_line() -> None:
    pair = SWIGLU_BACKWARD.spec((8192, 14336), "bf16")
    assert pair.op == "swiglu_backward" and dict(pair.constants) == {"layout": "pair"}
    assert [t.shape for t in pair.inputs] == [(8192, 14336)] * 3
    assert [t.shape for t in SWIGLU_BACKWARD.output_specs(pair)] == [(8192, 14336)] * 2
    concat = SWIGLU_BACKWARD.spec((2, 4096, 14336), "fp16", layout="concat")
    assert [t.shape for t in concat.inputs] == [(2, 4096, 14336), (2, 4096, 28672)]
    (dx,) = SWIGLU_BACKWARD.output_specs(concat)
    assert dx.shape == (2, 4096, 28672) and dx.dtype == "float16"
    geglu = GEGLU_BACKWARD.spec((4, 8), "fp32")
    assert dict(geglu.constants) == {"layout": "pair", "approximate": "tanh"}
    assert GEGLU_BACKWARD.spec((4, 8), "fp32", approximate="none").const("approximate") == "none"
    forward = SWIGLU.spec((8192, 14336), "bf16")
    assert len({pair.workload_hash, concat.workload_hash, forward.workload_hash,
                GEGLU_BACKWARD.spec((8192, 14336), "bf16").workload_hash}) == 4  # fmt: skip


def test_spec_for_matches_spec() -> None:
    dy = torch.zeros(2, 16, 96, dtype=torch.bfloat16)
    a, b = torch.zeros_like(dy), torch.ones_like(dy)
    x = torch.zeros(2, 16, 192, dtype=torch.bfloat16)
    assert SWIGLU_BACKWARD.spec_for(dy, a, b) == SWIGLU_BACKWARD.spec((2, 16, 96), "bfloat16")
    assert SWIGLU_BACKWARD.spec_for(dy, a, b, layout="pair") == SWIGLU_BACKWARD.spec((2, 16, 96), "bf16")
    assert SWIGLU_BACKWARD.spec_for(dy, x) == SWIGLU_BACKWARD.spec((2, 16, 96), "bfloat16", layout="concat")
    assert GEGLU_BACKWARD.spec_for(dy, x, approximate="none") == GEGLU_BACKWARD.spec(
        (2, 16, 96), "bf16", layout="concat", approximate="none"
    )
    assert GEGLU_BACKWARD.spec_for(dy, a, b) == GEGLU_BACKWARD.spec((2, 16, 96), "bf16", approximate="tanh")
    spec = GEGLU_BACKWARD.spec_for(dy, x)
    assert OpSpec.from_dict(spec.to_dict()) == spec
    # the forward's constants, as the autograd wiring passes them, are accepted
    forward = GEGLU.spec_for(x, approximate="none")
    assert GEGLU_BACKWARD.spec_for(dy, x, **forward.constants).constants == forward.constants


def _f32(*shape: int) -> torch.Tensor:
    return torch.zeros(*shape)


@pytest.mark.parametrize(
    ("make", "constants"),
    [
        (lambda: (_f32(4, 9), _f32(4, 8), _f32(4, 8)), {}),
        (lambda: (_f32(4, 8), _f32(4, 8)), {}),
        (lambda: (_f32(4, 4), _f32(4, 8), _f32(4, 9)), {}),
        (lambda: (_f32(4, 8).half(), _f32(4, 8), _f32(4, 8)), {}),
        (lambda: (_f32(4, 4), _f32(4, 8).half()), {}),
        (lambda: (_f32(4, 8).int(), _f32(4, 8).int(), _f32(4, 8).int()), {}),
        (lambda: (_f32(4, 8).double(), _f32(4, 8).double(), _f32(4, 8).double()), {}),
        (lambda: (_f32(4, 8).t(), _f32(8, 4), _f32(8, 4)), {}),
        (lambda: (_f32(4, 4), _f32(4, 16)[:, ::2]), {}),
        (lambda: (_f32(4, 3), _f32(4, 7)), {}),
        (lambda: (_f32(0, 4), _f32(0, 8)), {}),
        (lambda: (torch.zeros(()),) * 3, {}),
        (lambda: (_f32(4, 8),), {}),
        (lambda: (_f32(4, 8),) * 4, {}),
        (lambda: (), {}),
        (lambda: (_f32(4, 8), [0.0]), {}),
        (lambda: (_f32(4, 4), _f32(4, 8)), {"layout": "pair"}),
        (lambda: (_f32(4, 8),) * 3, {"layout": "concat"}),
        (lambda: (_f32(4, 4), _f32(4, 8)), {"dim": -1}),
    ],
    ids=[
        "dy-shape",
        "concat-dy-shape",
        "a-b-shapes",
        "dy-dtype",
        "x-dtype",
        "int32",
        "float64",
        "dy-transposed",
        "x-strided",
        "odd-concat",
        "empty",
        "scalars",
        "dy-only",
        "four",
        "none",
        "not-a-tensor",
        "layout-pair",
        "layout-concat",
        "constant",
    ],
)
def test_spec_for_rejects_what_the_kernels_cannot_do(make, constants) -> None:  # type: ignore[no-untyped-def]
    for op in (SWIGLU_BACKWARD, GEGLU_BACKWARD):
        with pytest.raises(UnsupportedWorkload):
            op.spec_for(*make(), **constants)


def test_bad_command_line_specs_and_specs_from_elsewhere() -> None:
    bad = [
        ((4, 8), "fp64", {}),
        ((4, 0), "fp32", {}),
        ((), "fp32", {}),
        ((4, 8), "fp32", {"layout": "x"}),
        ((4, 8), "fp32", {"approximate": "tanh"}),
    ]
    for shape, dtype, constants in bad:
        with pytest.raises(UnsupportedWorkload):
            SWIGLU_BACKWARD.spec(shape, dtype, **constants)
    with pytest.raises(UnsupportedWorkload, match="approximate"):
        GEGLU_BACKWARD.spec((4, 8), "fp32", approximate="erf")
    with pytest.raises(UnsupportedWorkload, match="approximate"):
        GEGLU_BACKWARD.spec_for(_f32(4, 4), _f32(4, 8), approximate="erf")
    with pytest.raises(UnsupportedWorkload, match="constants"):
        SWIGLU_BACKWARD.spec_for(_f32(4, 4), _f32(4, 8), approximate="tanh")  # SwiGLU has no GELU formula
    with pytest.raises(ValueError):
        SWIGLU_BACKWARD.spec((4, 8), "int3")
    # check_supported also guards specs built by hand (or read back from a database)
    good = SWIGLU_BACKWARD.spec((4, 8), "fp32", layout="concat")
    dy, x = good.inputs
    for inputs, constants in [((dy, x, x), {"layout": "concat"}), ((dy, x), {"layout": "pair"}),
                              ((dy, x), {}), ((x, x), {"layout": "concat"}),
                              ((dy, x.with_shape((4, 7))), {"layout": "concat"})]:  # fmt: skip
        with pytest.raises(UnsupportedWorkload):
            SWIGLU_BACKWARD.check_supported(OpSpec("swiglu_backward", inputs, constants))
    SWIGLU_BACKWARD.check_supported(good)


def test_bucket_and_validation_specs_reshape_every_input() -> None:
    spec = SWIGLU_BACKWARD.spec((2, 40, 3000), "float16")
    shapes = [[t.shape for t in s.inputs] for s in SWIGLU_BACKWARD.validation_specs(spec)]
    rows = tail_rows(80, SWIGLU_BACKWARD.forward.row_block)
    assert shapes == [[(2, 40, 3000)] * 3] + [[(r, 3000)] * 3 for r in rows]
    concat = GEGLU_BACKWARD.spec((2, 40, 3000), "float16", layout="concat", approximate="none")
    vspecs = GEGLU_BACKWARD.validation_specs(concat)
    assert [[t.shape for t in s.inputs] for s in vspecs] == [[(2, 40, 3000), (2, 40, 6000)]] + [
        [(r, 3000), (r, 6000)] for r in rows
    ]
    for s in vspecs:
        assert s.op == "geglu_backward" and dict(s.constants) == {"layout": "concat", "approximate": "none"}
        for variant in GEGLU_BACKWARD.variants:  # spaces depend on H and the dtype only
            assert variant.space(s).configs() == variant.space(concat).configs()
    bucket = SWIGLU_BACKWARD.bucket(SWIGLU_BACKWARD.spec((5000, 4096), "bfloat16"))
    assert [t.shape for t in bucket.inputs] == [(8192, 4096)] * 3
    assert bucket == SWIGLU_BACKWARD.bucket(SWIGLU_BACKWARD.spec((2, 3000, 4096), "bfloat16"))
    bucket = GEGLU_BACKWARD.bucket(GEGLU_BACKWARD.spec((5000, 4096), "bfloat16", layout="concat"))
    assert [t.shape for t in bucket.inputs] == [(8192, 4096), (8192, 8192)]
    assert bucket.const("approximate") == "tanh"


# ---- inputs, roofline ------------------------------------------------------------------------------
# (the spaces' sizes, budgets and refusals: test_families.py)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_make_inputs_extends_the_forwards(layout: str, device: str) -> None:
    # (that they are deterministic by seed, shaped and typed: test_families.py)
    spec = SWIGLU_BACKWARD.spec((2, 5, 48), "bfloat16", layout=layout)
    forward = SWIGLU.spec((2, 5, 48), "bfloat16", layout=layout)
    for distribution in SWIGLU_BACKWARD.distributions:
        first = SWIGLU_BACKWARD.make_inputs(spec, seed=11, distribution=distribution, device=device)
        # a and b as the forward draws them; dy from its own stream, N(0, 1)
        forward_inputs = SWIGLU.make_inputs(forward, seed=11, distribution=distribution, device=device)
        assert all(torch.equal(p, q) for p, q in zip(first[1:], forward_inputs, strict=True))
        a = split(spec, first)[1]
        assert not torch.equal(first[0], a)
    (dy, *_) = SWIGLU_BACKWARD.make_inputs(SWIGLU_BACKWARD.spec((64, 512), "float32"), seed=0, device=device)
    assert 0.9 < float(dy.std()) < 1.1 and abs(float(dy.mean())) < 0.05


def test_bytes_and_flops() -> None:
    rows, h = 16384, 8192
    for layout in LAYOUTS:
        spec = SWIGLU_BACKWARD.spec((rows, h), "bfloat16", layout=layout)
        assert SWIGLU_BACKWARD.bytes_moved(spec) == 5 * rows * h * 2  # read dy, a, b; write da, db
        assert SWIGLU_BACKWARD.flops(spec) == 13 * rows * h
    assert GEGLU_BACKWARD.bytes_moved(GEGLU_BACKWARD.spec((3, 5), "float32", layout="concat")) == 5 * 15 * 4
    assert GEGLU_BACKWARD.flops(GEGLU_BACKWARD.spec((rows, h), "bfloat16")) == 21 * rows * h
    assert GEGLU_BACKWARD.flops(GEGLU_BACKWARD.spec((rows, h), "bfloat16", approximate="none")) == 15 * rows * h
