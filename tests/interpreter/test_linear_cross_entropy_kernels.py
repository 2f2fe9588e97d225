"""The fused linear + cross-entropy families (forward, backward, fused forward+backward) in the
Triton interpreter: small and odd shapes against float64 under the harness's own tolerance, the
cross-entropy semantics (reductions, ignore_index, label smoothing), soft-capping, a bias, chunks
smaller and larger than the token count, and the real harness (``validate``) once per family.

The interpreter is slow and the GEMM tiles are at least 16 x 32, so each case runs one or two
configs: the widest tiles (fewest programs), and for the chunked kernels a 16-token chunk where
the case has more tokens (several chunks and a ragged last one). The gradient tests run every
gradient variant: the families' own and ``chunked_library_gemm``
(:mod:`kernelsmith.ops._linear_cross_entropy_library`, whose GEMMs are PyTorch's: on the CPU
here, cuBLAS on a GPU), which the families do not list yet (its module says why).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from kernelsmith.evaluate import validate as validate_module
from kernelsmith.evaluate.errors import check_close
from kernelsmith.evaluate.validate import validate
from kernelsmith.ops import get_op
from kernelsmith.ops._base import Variant
from kernelsmith.ops._linear_cross_entropy_library import LIBRARY_OPS, LIBRARY_OPS_OFF_CUDA, LIBRARY_VARIANT
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec
from kernelsmith.testing.validation_runs import validation_runs

FORWARD = get_op("linear_cross_entropy")
BACKWARD = get_op("linear_cross_entropy_backward")
FUSED = get_op("linear_cross_entropy_fused")
GRADIENT_VARIANTS = [*BACKWARD.variants, LIBRARY_VARIANT]
assert [v.name for v in FUSED.variants] == [v.name for v in BACKWARD.variants]


def _widest(op, spec: OpSpec, variant: Variant | None = None, **fixed: object) -> Config:
    """The config with the widest tiles (fewest interpreted programs), or for the library variant
    (no tiles) the widest row block, given ``fixed`` values."""
    variant = variant or op.variants[0]
    configs = [c for c in variant.space(spec).configs() if all(c[k] == v for k, v in fixed.items())]
    assert configs, f"no config with {fixed}"
    if variant is LIBRARY_VARIANT:
        return max(configs, key=lambda c: (c["BLOCK_V"], -c["ROW_WARPS"]))
    return max(configs, key=lambda c: (c["BLOCK_M"] * c["BLOCK_N"], -c["BLOCK_K"], -c["num_stages"], -c["num_warps"]))


def _run(
    op, spec: OpSpec, config: Config, inputs: tuple[torch.Tensor, ...], variant: Variant | None = None
) -> list[torch.Tensor]:
    """Launch into NaN-filled outputs; the inputs must come back untouched."""
    before = [t.clone() for t in inputs]
    outs = [torch.full(o.shape, math.nan, dtype=o.torch_dtype, device=inputs[0].device) for o in op.output_specs(spec)]
    (variant or op.variants[0]).build(spec, config)(inputs, outs)
    for t, b in zip(inputs, before, strict=True):
        assert torch.equal(t, b), "an input was modified"
    return outs


def _assert_correct(op, spec: OpSpec, outs: list[torch.Tensor], inputs: tuple[torch.Tensor, ...], what: str) -> None:
    refs64 = op.reference_fp64(spec, inputs)
    lowps = op.reference(spec, inputs)
    assert len(outs) == len(refs64)
    for k, (out, ref64, lowp) in enumerate(zip(outs, refs64, lowps, strict=True)):
        assert out.shape == ref64.shape and out.dtype == lowp.dtype, f"{what}: output {k}"
        problem = check_close(out, ref64, lowp, op.tolerance)
        assert problem is None, f"{what}: output {k}: {problem}"


# (tokens, hidden, vocabulary, dtype, distribution, reduction, label_smoothing, softcap, bias)
CASES = [
    (1, 8, 1, "float32", "normal", "mean", 0.0, None, False),
    (3, 33, 7, "bfloat16", "large", "none", 0.1, 30.0, True),
    (17, 8, 1000, "float16", "peaked", "sum", 0.0, None, True),
    (17, 33, 1000, "bfloat16", "normal", "mean", 0.1, 15.0, False),
]


def _spec(op, case) -> OpSpec:
    t, h, v, dtype, _, reduction, smoothing, softcap, bias = case
    return op.spec((t, h, v), dtype, reduction=reduction, label_smoothing=smoothing, softcap=softcap, bias=bias)


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("case", CASES, ids=str)
def test_forward_matches_float64(case, device: str) -> None:
    spec = _spec(FORWARD, case)
    inputs = FORWARD.make_inputs(spec, seed=5, distribution=case[4], device=device)
    splits = max(s for s in (1, 2, 4) if s * 32 <= max(32, 1 << (case[2] - 1).bit_length()))
    config = _widest(FORWARD, spec, SPLITS=splits)
    _assert_correct(FORWARD, spec, _run(FORWARD, spec, config, inputs), inputs, f"{config.key} {spec.describe()}")


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("variant", GRADIENT_VARIANTS, ids=lambda v: v.name)
@pytest.mark.parametrize("op", [BACKWARD, FUSED], ids=lambda op: op.name)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_gradients_match_float64(op, case, variant: Variant, device: str) -> None:
    """17 tokens run as chunks of 16 (a ragged last chunk of 1); 1 and 3 tokens as one chunk of
    16, larger than the token count. In 16-bit dtypes, dW accumulated in float32."""
    spec = _spec(op, case)
    inputs = op.make_inputs(spec, seed=7, distribution=case[4], device=device)
    config = _widest(op, spec, variant, CHUNK=16, DW_ACC="float32")
    outs = _run(op, spec, config, inputs, variant)
    _assert_correct(op, spec, outs, inputs, f"{variant.name} {config.key} {spec.describe()}")


@pytest.mark.parametrize("variant", GRADIENT_VARIANTS, ids=lambda v: v.name)
@pytest.mark.parametrize(("op", "softcap"), [(BACKWARD, None), (FUSED, 20.0)], ids=["backward", "fused-softcap"])
def test_dw_accumulated_in_the_output_dtype_is_right_too(op, softcap, variant: Variant, device: str) -> None:
    """40 tokens in chunks of 16 (two full, one ragged), dW rounded to bfloat16 after each."""
    spec = op.spec((40, 16, 100), "bfloat16", reduction="mean", label_smoothing=0.1, softcap=softcap, bias=True)
    inputs = op.make_inputs(spec, seed=3, distribution="large", device=device)
    config = _widest(op, spec, variant, CHUNK=16, DW_ACC="output")
    _assert_correct(op, spec, _run(op, spec, config, inputs, variant), inputs, f"{variant.name} {config.key}")


@pytest.mark.parametrize("variant", GRADIENT_VARIANTS, ids=lambda v: v.name)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_every_target_ignored(reduction: str, variant: Variant, device: str) -> None:
    """torch: "mean" over no counted token is NaN, "sum" 0, "none" zeros; gradients all zero."""
    spec = FUSED.spec((5, 8, 7), "float32", reduction=reduction, bias=True)
    hidden, weight, target, bias = FUSED.make_inputs(spec, seed=1, device=device)
    target = torch.full_like(target, -100)
    inputs = (hidden, weight, target, bias)
    loss, dh, dw, db = _run(FUSED, spec, _widest(FUSED, spec, variant), inputs, variant)
    (expected,) = FORWARD.reference_fp64(FORWARD.spec_for(hidden, weight, target, bias, reduction=reduction), inputs)
    assert torch.equal(loss.isnan(), expected.isnan()) and torch.all(loss[~loss.isnan()] == 0)
    assert all(torch.all(g == 0) for g in (dh, dw, db))
    (forward_loss,) = _run(FORWARD, FORWARD.spec_for(*inputs, reduction=reduction), _widest(FORWARD, spec), inputs)
    assert torch.equal(forward_loss.isnan(), expected.isnan())


def test_out_of_range_targets_raise_at_the_front_door_and_are_nan_in_the_kernel(device: str) -> None:
    spec = FORWARD.spec((4, 8, 7), "float32", reduction="none")
    hidden, weight, _ = FORWARD.make_inputs(spec, seed=2, device=device)
    bad = torch.tensor([0, 7, -1, -100], device=device)
    with pytest.raises(IndexError, match="out of bounds"):
        FORWARD.spec_for(hidden, weight, bad, reduction="none")
    with pytest.raises(IndexError):  # on the CPU: on a GPU torch's bounds check is a device-side assert
        FORWARD.reference(spec, (hidden.cpu(), weight.cpu(), bad.cpu()))
    (loss,) = _run(FORWARD, spec, _widest(FORWARD, spec), (hidden, weight, bad))
    assert math.isnan(float(loss[1])) and math.isnan(float(loss[2])) and float(loss[3]) == 0.0
    want = F.cross_entropy(F.linear(hidden.double(), weight.double())[:1], bad[:1], reduction="none")
    assert torch.allclose(loss[:1].double(), want, rtol=1e-6)


def test_specs_describe_the_inputs_and_outputs() -> None:
    spec = BACKWARD.spec((9, 16, 50), "bfloat16", reduction="none", bias=True)
    assert [t.shape for t in spec.inputs] == [(9,), (9, 16), (50, 16), (9,), (50,)]
    assert [t.shape for t in BACKWARD.output_specs(spec)] == [(9, 16), (50, 16), (50,)]
    fused = FUSED.spec((9, 16, 50), "bfloat16")
    assert [t.shape for t in FUSED.output_specs(fused)] == [(), (9, 16), (50, 16)]
    tails = BACKWARD.validation_specs(spec)
    assert all(s.inputs[0].shape == s.inputs[1].shape[:1] == s.inputs[3].shape for s in tails)
    assert {s.inputs[2].shape for s in tails} == {(50, 16)}


@pytest.mark.parametrize("op", [FORWARD, FUSED, BACKWARD], ids=lambda op: op.name)
def test_the_harness_accepts_each_family(op, device: str) -> None:
    """The real harness: tails, every distribution, stress data, canaries, two runs bit for bit.

    The gradient families run in float16: the interpreter rounds float32 subnormals to bfloat16
    wrongly (1e-39 becomes 4.2e-39; a GPU rounds them right), and dW from the "denormal" stress
    data is subnormal."""
    dtype = "bfloat16" if op is FORWARD else "float16"
    spec = op.spec((9, 16, 40), dtype, reduction="mean", label_smoothing=0.1, bias=op is not FORWARD)
    fixed = {} if op is FORWARD else {"CHUNK": 16}
    runs = validate(op, spec, op.variants[0].build, _widest(op, spec, **fixed), device, lambda: None)
    # The target on every distribution, each tail on one. In float16 a tail's first draw (the spike
    # data) can be blind: spikes in h make every logit ~1e2-1e3 and PyTorch's float16 logits about
    # 100% wrong, so validate rightly draws the tail's next distribution (simulated: 11 of 3000
    # seeds for the backward, 3 of 3000 for the fused op; 0 of 3000 for the bf16 forward).
    maybe_blind = () if op is FORWARD else ("spikes",)
    assert {runs} <= validation_runs(op, spec, maybe_blind)


def _library_ops_issued(op, spec: OpSpec, config: Config, device: str) -> set[str]:
    """The aten ops one call of the library variant issues beyond rule 7's views and allocations."""
    inputs = op.make_inputs(spec, seed=2, device=device)
    outs = [torch.empty(o.shape, dtype=o.torch_dtype, device=device) for o in op.output_specs(spec)]
    launch = LIBRARY_VARIANT.build(spec, config)
    with validate_module.TorchOpWatch() as watch:
        launch(inputs, outs)
    return set(watch.issued)


def test_the_library_variant_issues_the_ops_it_declares(device: str) -> None:
    """LIBRARY_OPS is what the harness would have to allow (the library module's docstring): every
    call stays within it (off CUDA, the float32 copies too), and every op of it but the CUDA-only
    ``out_dtype`` GEMMs is issued by some call (a bias, several chunks, both dW accumulators)."""
    spec = FUSED.spec((37, 16, 40), "bfloat16", reduction="mean", bias=True)
    seen: set[str] = set()
    for dw_acc in ("float32", "output"):
        issued = _library_ops_issued(
            FUSED, spec, _widest(FUSED, spec, LIBRARY_VARIANT, CHUNK=16, DW_ACC=dw_acc), device
        )
        allowed = LIBRARY_OPS | (LIBRARY_OPS_OFF_CUDA if device != "cuda" else frozenset())
        assert issued <= allowed, f"DW_ACC={dw_acc}: undeclared {sorted(issued - allowed)}"
        seen |= issued
    cuda_only = {"aten.mm.dtype_out", "aten.addmm.dtype_out"}
    assert LIBRARY_OPS - cuda_only <= seen, f"declared, never issued: {sorted(LIBRARY_OPS - cuda_only - seen)}"


@pytest.mark.parametrize("op", [FUSED, BACKWARD], ids=lambda op: op.name)
def test_the_harness_admits_the_library_variant_by_its_declared_ops_only(op, device: str, monkeypatch) -> None:
    """The families list the variant, with LIBRARY_OPS as its rule-7 allowance: through it the
    variant passes the real harness (tails, every distribution, stress data, canaries, two runs bit
    for bit); without it (what any other candidate gets) rule 7 rejects it as computing with
    PyTorch; and an op outside the allowance is still rejected."""
    assert LIBRARY_VARIANT in op.variants
    assert LIBRARY_VARIANT.library_ops == LIBRARY_OPS | LIBRARY_OPS_OFF_CUDA
    spec = op.spec((9, 16, 40), "float16", reduction="mean", label_smoothing=0.1, softcap=20.0, bias=True)
    config = _widest(op, spec, LIBRARY_VARIANT, CHUNK=16)
    monkeypatch.setattr(validate_module, "_SEALED", {})  # (no worker sealed this test process's harness)
    with pytest.raises(validate_module.Rejected, match=r"computed with PyTorch instead of its kernel: .*aten\.mm\.out"):
        validate(op, spec, LIBRARY_VARIANT.build, config, device, lambda: None)
    runs = validate(op, spec, LIBRARY_VARIANT.build, config, device, lambda: None, LIBRARY_VARIANT.library_ops)
    assert {runs} <= validation_runs(op, spec, ("spikes",))  # (see test_the_harness_accepts_each_family)

    def with_a_softmax(spec: OpSpec, config: Config):  # the variant plus one op it did not declare
        launch = LIBRARY_VARIANT.build(spec, config)

        def call(inputs, outputs) -> None:
            launch(inputs, outputs)
            torch.softmax(inputs[1][:1].float(), -1)

        return call

    with pytest.raises(validate_module.Rejected, match=r"computed with PyTorch instead of its kernel: aten\._softmax"):
        validate(op, spec, with_a_softmax, config, device, lambda: None, LIBRARY_VARIANT.library_ops)


@pytest.mark.parametrize("num_items_in_batch", [None, 7])
def test_hugging_face_causal_lm_loss_is_the_op_on_shifted_labels(num_items_in_batch, device: str) -> None:
    """Hugging Face's ForCausalLMLoss (labels shifted by one with -100 padding; "mean", or "sum" over
    ``num_items_in_batch``) is the fused op on the shifted labels, divided outside when the trainer
    counts the items: loss, dh and dW against the float64 formula."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    batch, seq, hidden, vocab = 2, 9, 16, 40
    g = torch.Generator().manual_seed(11)
    h = torch.randn(batch, seq, hidden, generator=g).to(device)
    w = (torch.randn(vocab, hidden, generator=g) / 4).to(device)
    labels = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
    labels[0, :3] = -100  # a masked prompt
    shifted = F.pad(labels, (0, 1), value=-100)[..., 1:].reshape(-1)
    reduction = "mean" if num_items_in_batch is None else "sum"
    inputs = (h.reshape(-1, hidden), w, shifted)
    spec = FUSED.spec_for(*inputs, reduction=reduction)
    loss, dh, dw = _run(FUSED, spec, _widest(FUSED, spec, CHUNK=16), inputs)
    scale = 1.0 if num_items_in_batch is None else 1.0 / num_items_in_batch

    # Hugging Face's own function (it upcasts the logits to float32), and the same formula in float64.
    hf = ForCausalLMLoss(F.linear(h, w), labels, vocab, num_items_in_batch=num_items_in_batch)
    torch.testing.assert_close(loss * scale, hf, rtol=1e-5, atol=1e-6)
    h64, w64 = h.double().requires_grad_(), w.double().requires_grad_()
    logits = F.linear(h64, w64).reshape(-1, vocab)
    expected = F.cross_entropy(logits, shifted, ignore_index=-100, reduction=reduction) * scale
    expected.backward()
    torch.testing.assert_close(loss.double() * scale, expected.detach(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(dh.double() * scale, h64.grad.reshape(-1, hidden), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(dw.double() * scale, w64.grad, rtol=1e-4, atol=1e-6)
