"""The error floor for softmax's condition (issue 19): families give it, the harness caps and uses it.

A softmax of logits (scores) of magnitude ``|z|`` moves by about ``|z| * eps`` under any float32
rounding of them; PyTorch's own error, the tolerance's base, is sometimes far smaller by luck, and
a correct kernel was rejected (:mod:`test_validation_flakes`). The families of linear
cross-entropy and attention now give, per output, the error rounding the logits can cause
(:mod:`kernelsmith.ops._softmax_condition`), and ``check_close`` takes the larger of its rule's
limit and that floor, capped. What must still hold, tested here: the bound is a bound; no family
but these has a floor; the canaries still fail on these families' draws, even under a floor as
large as the cap; planted bugs are still rejected with the floor on; the floor comes from the
inputs and the float64 references, computed before the candidate runs.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from kernelsmith.evaluate.errors import FLOOR_CAP, check_close
from kernelsmith.evaluate.validate import Rejected, _canary_problem, validate
from kernelsmith.ops import get_op, op_names
from kernelsmith.ops._base import NO_FLOOR, ErrorFloor, Tolerance
from kernelsmith.ops._softmax_condition import centered_spread, probability_error
from kernelsmith.ops.attention import _score_rows
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec

LCE = get_op("linear_cross_entropy")
LCE_BACKWARD = get_op("linear_cross_entropy_backward")
LCE_FUSED = get_op("linear_cross_entropy_fused")
ATTENTION = get_op("attention")
DECODE = get_op("decode_attention")
SOFTMAX_FAMILIES = {LCE.name, LCE_BACKWARD.name, LCE_FUSED.name, ATTENTION.name, DECODE.name}
SEEDS = (3, 11, 2024)


# ---- check_close with a floor ----------------------------------------------------------------
def _close_pair() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A float64 reference, PyTorch's exact answer (base error 0) and a candidate 1e-5 off."""
    reference = torch.linspace(1.0, 2.0, 64, dtype=torch.float64)
    return reference, reference.float(), (reference * (1 + 1e-5)).float()


def test_no_floor_is_the_rule_and_a_floor_raises_both_limits() -> None:
    reference, pytorch, candidate = _close_pair()
    tolerance = Tolerance()
    assert check_close(candidate, reference, pytorch, tolerance) is not None  # 1e-5 >> 2 ulps
    assert check_close(candidate, reference, pytorch, tolerance, NO_FLOOR) is not None
    # each limit on its own: a relative floor alone leaves the max-abs limit, and the reverse
    assert "max abs" in check_close(candidate, reference, pytorch, tolerance, ErrorFloor(rel_l2=1e-4))
    assert "relative L2" in check_close(candidate, reference, pytorch, tolerance, ErrorFloor(max_abs=1e-4))
    assert check_close(candidate, reference, pytorch, tolerance, ErrorFloor(1e-4, 1e-4)) is None
    message = check_close(candidate, reference, pytorch, tolerance, ErrorFloor(5e-6, 1.0))
    assert message is not None and "condition floor" in message


def test_the_floor_is_capped_and_a_nan_floor_is_no_floor() -> None:
    reference, pytorch, candidate = _close_pair()
    huge = ErrorFloor(rel_l2=1e9, max_abs=1e9)
    assert check_close(torch.zeros_like(pytorch), reference, pytorch, Tolerance(), huge) is not None
    constant = torch.full_like(pytorch, float(reference.mean()))
    assert check_close(constant, reference, pytorch, Tolerance(), huge) is not None
    # just under the cap passes, just over fails
    assert check_close((reference * (1 + FLOOR_CAP / 2)).float(), reference, pytorch, Tolerance(), huge) is None
    assert check_close((reference * (1 + FLOOR_CAP * 2)).float(), reference, pytorch, Tolerance(), huge) is not None
    assert check_close(candidate, reference, pytorch, Tolerance(), ErrorFloor(math.nan, math.nan)) is not None


# ---- the bound -------------------------------------------------------------------------------
@pytest.mark.parametrize("logit_scale", [1.0, 30.0, 3000.0])
@pytest.mark.parametrize("error_scale", [1e-6, 1e-2, 1.0, 5.0])
def test_probability_error_bounds_every_rounding_of_the_logits(logit_scale: float, error_scale: float) -> None:
    """|softmax(z + d) - softmax(z)| <= E for random and extreme d with |d_j| <= a_j, from
    near-uniform rows to one-hot ones, for errors far past first order; and E is not vacuous."""
    g = torch.Generator().manual_seed(5)
    z = torch.randn(16, 12, generator=g, dtype=torch.float64) * logit_scale
    a = torch.rand(16, 12, generator=g, dtype=torch.float64) * error_scale
    p = torch.softmax(z, dim=-1)
    bound = probability_error(p, a)
    signs = [torch.randint(0, 2, (16, 12), generator=g).double() * 2 - 1 for _ in range(64)]
    # the extremes of one probability: its own logit one way, every other one the other way
    for j in range(12):
        one = torch.nn.functional.one_hot(torch.tensor(j), 12).double()
        signs += [one * 2 - 1, 1 - one * 2]
    # (up to float64's own rounding in the check: z + d holds d only to about |z| 1e-16, which is
    # relative to d itself 1e-16 |z| / |d|; and a few float64 ulps of p in either softmax)
    relative = 1e-7 + 1e-14 * logit_scale / error_scale
    rounding = 4 * torch.finfo(torch.float64).eps * torch.maximum(p, torch.softmax(z + a, dim=-1))
    for sign in signs:
        moved = torch.softmax(z + sign * a, dim=-1)
        assert bool(((moved - p).abs() <= bound * (1 + relative) + rounding + 1e-300).all())
    assert float(bound.max()) <= 1.0
    if error_scale <= 1e-2 and logit_scale == 1.0:  # first order: about p (a_j + p . a), no more
        assert bool((bound <= 3 * p * (a + (p * a).sum(-1, keepdim=True))).all())


def test_centered_spread_is_the_sum_it_expands() -> None:
    g = torch.Generator().manual_seed(7)
    p = torch.softmax(torch.randn(5, 9, generator=g, dtype=torch.float64), dim=-1)
    error = torch.rand(5, 9, generator=g, dtype=torch.float64) * 1e-3
    values = torch.randn(9, 4, generator=g, dtype=torch.float64) * 3 + 10  # (an offset: centring matters)
    direct = ((error[:, :, None] * (values[None] - (p @ values)[:, None])) ** 2).sum(1).sqrt()
    assert torch.allclose(centered_spread(p, error, values), direct, rtol=1e-6, atol=1e-12)


# ---- which families have a floor, and from what -------------------------------------------
def test_only_the_softmax_families_give_a_floor() -> None:
    rmsnorm = get_op("rmsnorm")
    spec = rmsnorm.spec((4, 32), "float32")
    inputs = rmsnorm.validation_inputs(spec, 1, "spikes", "cpu")
    assert rmsnorm.error_floors(spec, inputs, rmsnorm.reference_fp64(spec, inputs)) == (NO_FLOOR,)
    overriding = {name for name in op_names() if type(get_op(name)).error_floors is not type(rmsnorm).error_floors}
    assert overriding == SOFTMAX_FAMILIES


def test_attention_floor_attends_as_the_reference_does() -> None:
    """The floor's probabilities are the reference's: p @ v rebuilds the float64 output, with
    causal masking, every mask kind, GQA and either layout."""
    for constants in ({"causal": True}, {"mask": "additive", "kv_heads": 1}, {"mask": "boolean", "layout": "bshd"}):
        spec = ATTENTION.spec((2, 2, 7, 16), "float32", kv_len=9, **constants)
        inputs = ATTENTION.validation_inputs(spec, 4, "normal", "cpu")
        (ref64,) = ATTENTION.reference_fp64(spec, inputs)
        rebuilt = torch.empty_like(ref64)
        rows = rebuilt.transpose(1, 2) if spec.const("layout") == "bshd" else rebuilt
        for b, h, p, _, _, v in _score_rows(spec, inputs):
            rows[b, h] = p @ v
        assert torch.allclose(rebuilt, ref64, rtol=1e-12, atol=1e-12), constants


def _wrong_scale_build(vspec: OpSpec, config: Config):  # type: ignore[no-untyped-def]
    """The real flash kernel built for a softmax scale 1e-3 too large: a planted bug in device
    code (a launcher computing with torch would be rejected as a cheat before any tolerance)."""
    constants = {**dict(vspec.constants), "scale": float(vspec.const("scale")) * (1 + 1e-3)}
    return ATTENTION.variant("flash").build(OpSpec(vspec.op, vspec.inputs, constants), config)


FLASH_CONFIG = Config(BLOCK_M=16, BLOCK_N=32, TWO_LOOPS=True, num_warps=2, num_stages=2)


def test_validate_rejects_a_planted_bug_with_the_floor_on(device: str) -> None:
    spec = ATTENTION.spec((1, 2, 16, 32), "float32")
    with pytest.raises(Rejected, match="wrong on"):
        validate(ATTENTION, spec, _wrong_scale_build, FLASH_CONFIG, device, lambda: None)


def test_validate_takes_the_floor_from_clean_inputs_before_the_candidate_runs(monkeypatch, device: str) -> None:
    """validate asks the family for the floors after the references and before the candidate's
    runs, with the inputs those references are of, and holds the candidate to them: the planted
    bug above passes when the family (in this test) gives a floor as large as the cap."""
    spec = ATTENTION.spec((1, 2, 16, 32), "float32")
    events: list[str] = []

    def capped_floors(vspec, inputs, refs64):  # type: ignore[no-untyped-def]
        (ref64,) = ATTENTION.reference_fp64(vspec, inputs)
        assert torch.equal(ref64, refs64[0])  # the references of exactly these inputs
        events.append("floors")
        return (ErrorFloor(math.inf, math.inf),)

    def spied_build(vspec, config):  # type: ignore[no-untyped-def]
        launcher = _wrong_scale_build(vspec, config)

        def launch(inputs, outputs):  # type: ignore[no-untyped-def]
            events.append("run")
            launcher(inputs, outputs)

        return launch

    monkeypatch.setattr(ATTENTION, "error_floors", capped_floors)
    runs = validate(ATTENTION, spec, spied_build, FLASH_CONFIG, device, lambda: None)
    assert events == ["floors", "run", "run"] * (runs // 2)


# ---- the canaries still fail on these families' draws ----------------------------------------
def _draws():  # type: ignore[no-untyped-def]
    lce = {"reduction": "mean", "label_smoothing": 0.1}
    cases = [
        (LCE, LCE.spec((9, 16, 40), "float32", **lce)),
        (LCE_BACKWARD, LCE_BACKWARD.spec((9, 16, 40), "float32", bias=True, **lce)),
        (LCE_FUSED, LCE_FUSED.spec((9, 16, 40), "float16", **lce)),
        (ATTENTION, ATTENTION.spec((2, 2, 5, 32), "float32", causal=True)),
        (DECODE, DECODE.spec((2, 4, 24, 16), "float32", kv_heads=2)),
    ]
    for op, spec in cases:
        for vspec in op.validation_specs(spec)[:2]:  # the target and its 1-row (1-query) tail
            for distribution in op.validation_distributions:
                for seed in SEEDS:
                    yield op, vspec, distribution, seed


@pytest.mark.parametrize("floor_kind", ["family", "capped"])
def test_canaries_fail_with_the_floor_on_these_families_draws(floor_kind: str) -> None:
    """On every draw a canary fails with the family's floor whenever it fails without it, and
    with a floor as large as the cap allows (the most any family can ask for) too, unless the
    draw's reference is blind anyway (its spread within the cap: a constant answer is right)."""
    checked = 0
    for op, vspec, distribution, seed in _draws():
        inputs = op.validation_inputs(vspec, seed, distribution, "cpu")
        refs64, lowps = op.reference_fp64(vspec, inputs), op.reference(vspec, inputs)
        floors = op.error_floors(vspec, inputs, refs64)
        if floor_kind == "capped":
            floors = tuple(ErrorFloor(math.inf, math.inf) for _ in refs64)
        for ref64, lowp, floor in zip(refs64, lowps, floors, strict=True):
            if _canary_problem(op, vspec, inputs, ref64, lowp) is not None:
                continue  # blind without a floor: nothing the floor could change
            finite = ref64[torch.isfinite(ref64)].double()
            spread = float(torch.linalg.vector_norm(finite - finite.mean()) / torch.linalg.vector_norm(finite))
            if floor_kind == "capped" and spread <= 2 * FLOOR_CAP:
                continue
            assert _canary_problem(op, vspec, inputs, ref64, lowp, floor) is None, (op.name, distribution, seed)
            checked += 1
    assert checked > 100


# ---- planted bugs are rejected with the floor on ---------------------------------------------
def _logit_gradient64(spec, inputs) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """d loss / d z of linear_cross_entropy_backward's draw, float64 (its dloss included)."""
    dloss, h, w, target, b = (x.double() if x.is_floating_point() else x for x in inputs)
    z = (h @ w.T + b).requires_grad_()
    with torch.enable_grad():
        loss = F.cross_entropy(z, target, reduction="mean", label_smoothing=0.1)
        (g,) = torch.autograd.grad(loss, [z], dloss)
    return g


def _assert_rejected(op, spec, inputs, output: int, wrong: torch.Tensor) -> None:  # type: ignore[no-untyped-def]
    """Output ``output`` computed ``wrong`` (in float64, then rounded as the output is) fails
    with the family's floor on this draw."""
    refs64, lowps = op.reference_fp64(spec, inputs), op.reference(spec, inputs)
    floors = op.error_floors(spec, inputs, refs64)
    wrong = wrong.to(lowps[output].dtype)
    assert check_close(wrong, refs64[output], lowps[output], op.tolerance, floors[output]) is not None


@pytest.mark.parametrize("distribution", ["normal", "large", "peaked", "spikes"])
@pytest.mark.parametrize("seed", SEEDS)
def test_a_backward_that_drops_one_chunks_dw_share_is_rejected(distribution: str, seed: int) -> None:
    """dW without the share of tokens 16..31 (one CHUNK of 16 of 40), everything else exact."""
    spec = LCE_BACKWARD.spec((40, 16, 40), "float32", reduction="mean", label_smoothing=0.1, bias=True)
    inputs = LCE_BACKWARD.validation_inputs(spec, seed, distribution, "cpu")
    g, h = _logit_gradient64(spec, inputs), inputs[1].double()
    chunk = slice(16, 32)
    dw = LCE_BACKWARD.reference_fp64(spec, inputs)[1] - g[chunk].T @ h[chunk]
    _assert_rejected(LCE_BACKWARD, spec, inputs, 1, dw)


def _attention64(spec, inputs, keys: slice | None = None, scale_error: float = 0.0) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Non-causal bhsd attention in float64, without the ``keys`` block, or with a wrong scale."""
    q, k, v = (t.double() for t in inputs)
    scores = q @ k.transpose(-1, -2) * float(spec.const("scale")) * (1 + scale_error)
    if keys is not None:
        scores[..., keys] = -math.inf
    return torch.softmax(scores, dim=-1) @ v


@pytest.mark.parametrize("distribution", ["normal", "peaked", "spikes"])
@pytest.mark.parametrize("seed", SEEDS)
def test_an_attention_that_skips_one_key_block_is_rejected(distribution: str, seed: int) -> None:
    spec = ATTENTION.spec((1, 2, 40, 32), "float32")
    inputs = ATTENTION.validation_inputs(spec, seed, distribution, "cpu")
    _assert_rejected(ATTENTION, spec, inputs, 0, _attention64(spec, inputs, keys=slice(16, 32)))


@pytest.mark.parametrize("distribution", ["normal", "peaked"])
@pytest.mark.parametrize("seed", SEEDS)
def test_an_attention_with_a_scale_wrong_by_a_thousandth_is_rejected(distribution: str, seed: int) -> None:
    """(On spike data such a kernel is right: scores of 1e7 whose rows are one-hot stay one-hot
    when scaled by 1.001, whatever the floor; validation's own distributions catch it.)"""
    spec = ATTENTION.spec((1, 2, 40, 32), "float32")
    inputs = ATTENTION.validation_inputs(spec, seed, distribution, "cpu")
    _assert_rejected(ATTENTION, spec, inputs, 0, _attention64(spec, inputs, scale_error=1e-3))


def test_the_logit_error_model_is_float32s_whatever_the_dtype() -> None:
    """Kernels of every dtype form their logits in float32 (a 16-bit PyTorch rounds them to its
    dtype: that is in its own error already), so the floor is float32's condition."""
    spec16 = ATTENTION.spec((1, 1, 4, 16), "bfloat16")
    spec32 = ATTENTION.spec((1, 1, 4, 16), "float32")
    inputs = ATTENTION.validation_inputs(spec32, 2, "normal", "cpu")
    rounded = tuple(t.to(torch.bfloat16) for t in inputs)
    widened = tuple(t.float() for t in rounded)
    (floor16,) = ATTENTION.error_floors(spec16, rounded, ATTENTION.reference_fp64(spec16, rounded))
    (floor32,) = ATTENTION.error_floors(spec32, widened, ATTENTION.reference_fp64(spec32, widened))
    assert floor16 == floor32 and floor16.rel_l2 > 0
