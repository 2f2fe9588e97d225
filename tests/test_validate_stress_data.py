"""The blind spots of the validation data (issue 12): huge values, NaN and Inf, denormals, and row
counts with a particular residue.

The validation inputs used to be each family's own distributions on a target and tails of 1, 7
and an odd row count; a kernel wrong only on a row holding a value above 1000, only on NaN input,
only on denormals, or only on a row count of 5 modulo 8 was kept. Each is planted here as a
trusted in-test launcher of one Triton RMSNorm kernel with a defect switch, shown to pass the old
validation data (the family with its old distributions and tails, :class:`_Before`) and to be
rejected now. They run in the Triton interpreter (conftest).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
import torch
import triton
import triton.language as tl

from kernelsmith.evaluate.errors import check_close
from kernelsmith.evaluate.validate import Rejected, validate
from kernelsmith.ops import get_op
from kernelsmith.ops._base import SPIKE_RANGE, STRESS_DISTRIBUTIONS, Launcher, Tolerance, generator, stress_, tail_rows
from kernelsmith.ops.rmsnorm import RMSNorm
from kernelsmith.spec import OpSpec

OP = get_op("rmsnorm")
ROWS_PER_PROGRAM = 8
# The interpreter computes with numpy, which warns on the NaN and Inf these tests feed on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
DEFECTS = {"honest": 0, "clamps_spikes": 1, "nan_to_zero": 2, "flushes_denormals": 3, "wrong_on_rows_5_mod_8": 4}


@triton.jit
def _planted_rmsnorm_kernel(x_ptr, w_ptr, y_ptr, n_rows, n_cols, eps, tiny,
                            DEFECT: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    offsets = rows[:, None] * n_cols + cols[None, :]
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    if DEFECT == 1:  # a "safe" clamp: only a row holding |x| > 1000 changes
        x = tl.minimum(tl.maximum(x, -1000.0), 1000.0)
    if DEFECT == 2:  # NaN laundered to zero
        x = tl.where(x != x, 0.0, x)
    if DEFECT == 3:  # denormals flushed to zero
        x = tl.where(tl.abs(x) < tiny, 0.0, x)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    y = x * rstd[:, None] * w[None, :]
    if DEFECT == 4:  # the last row is wrong when the last block holds 5 rows of 8
        wrong = (n_rows % 8 == 5) & (rows == n_rows - 1)
        y = tl.where(wrong[:, None], y * 0.5, y)
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


def planted_build(defect: int):
    def build(spec: OpSpec, config: object) -> Launcher:
        rows = math.prod(spec.inputs[0].shape[:-1])
        n = spec.inputs[0].shape[-1]
        eps = float(spec.const("eps"))
        tiny = torch.finfo(spec.inputs[0].torch_dtype).tiny

        def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
            grid = (triton.cdiv(rows, ROWS_PER_PROGRAM),)
            _planted_rmsnorm_kernel[grid](inputs[0], inputs[1], outputs[0], rows, n, eps, tiny, DEFECT=defect,
                                          ROWS=ROWS_PER_PROGRAM, BLOCK_N=triton.next_power_of_2(n))  # fmt: skip

        return launch

    return build


class _Before(RMSNorm):
    """RMSNorm with the validation data of before issue 12: its own distributions only, and tails
    of 1, 7 and an odd row count."""

    stress_distributions = ()

    def validation_specs(self, spec: OpSpec) -> list[OpSpec]:
        rows, width = spec.inputs[0].shape
        tails = sorted({1, min(rows, 7) if rows > 1 else 1, rows + 3 if rows < 64 else 67} - {rows})
        return [spec] + [OpSpec(spec.op, (spec.inputs[0].with_shape((r, width)), spec.inputs[1]),
                                dict(spec.constants)) for r in tails]  # fmt: skip


# A bucket of 8 rows in float32 (whose smallest normal, 1.2e-38, no ordinary draw comes near).
SPEC = OP.spec((8, 64), "float32", eps=1e-6)


def _validate(op: RMSNorm, defect: str) -> int:
    return validate(op, SPEC, planted_build(DEFECTS[defect]), None, "cpu", lambda: None)


def test_the_honest_planted_kernel_passes_the_new_validation():
    assert _validate(OP, "honest") > 0


@pytest.mark.parametrize(
    ("defect", "caught_on"),
    [("clamps_spikes", "spikes"), ("nan_to_zero", "nonfinite"), ("flushes_denormals", "denormal"),
     ("wrong_on_rows_5_mod_8", "5x64")],
)
def test_a_kernel_wrong_only_on_the_blind_spot_passed_before_and_is_rejected_now(defect: str, caught_on: str):
    assert _validate(_Before(), defect) > 0  # the old validation data kept it
    with pytest.raises(Rejected) as err:
        _validate(OP, defect)
    assert err.value.kind == "validate"
    assert caught_on in str(err.value), str(err.value)


# ---- the pieces ------------------------------------------------------------------------------


@pytest.mark.parametrize(("rows", "block"), [(8, 8), (8, 32), (64, 32), (8192, 32), (128, 64), (16, 16), (4096, 8)])
def test_tail_rows_cover_every_residue_modulo_8_and_the_block_edges(rows: int, block: int):
    tails = tail_rows(rows, block)
    assert len(tails) <= 8 and all(1 <= r < rows for r in tails)
    counts = [rows, *tails]
    assert {r % 8 for r in counts} == set(range(8))
    if rows > block:
        assert {0, 1, block - 1} <= {r % block for r in counts}
    assert any(r > rows // 2 for r in tails) or rows <= 8  # one inside the bucket's upper half


def test_every_row_wise_family_declares_its_largest_block():
    assert get_op("rmsnorm").row_block == 32 and get_op("softmax").row_block == 32
    assert get_op("sum").row_block == 64 and get_op("layernorm").row_block == 32
    assert get_op("swiglu").row_block == 16


def test_stress_distributions_make_what_they_say():
    g = generator(1, "cpu")
    x = torch.randn(64, 100).to(torch.float16)
    stress_(x, "spikes", g)
    big = x.abs() > 500
    assert bool(torch.isfinite(x).all()) and int(big.sum(1).min()) >= 1 and int(big.sum(1).max()) <= 2
    assert SPIKE_RANGE[0] * 0.99 <= float(x[big].abs().min()) and float(x.abs().max()) <= SPIKE_RANGE[1] * 1.01

    x = torch.randn(8, 100)
    stress_(x, "nonfinite", g)
    assert bool(torch.isnan(x).any()) and bool((x == math.inf).any()) and bool((x == -math.inf).any())
    finite_rows = torch.isfinite(x).all(1)
    assert int(finite_rows.sum()) == 2  # one row in four stays finite
    for rows in (1, 2, 3):  # too few rows for one of each a row: every row has all three
        x = torch.randn(rows, 5)
        stress_(x, "nonfinite", g)
        assert int(torch.isnan(x).sum()) == int((x == math.inf).sum()) == int((x == -math.inf).sum()) == rows

    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        x = torch.randn(16, 100).to(dtype)
        stress_(x, "denormal", g)
        tiny = torch.finfo(dtype).tiny
        if dtype == torch.bfloat16:  # the interpreter (conftest) mishandles bfloat16 subnormals
            assert 2**10 * tiny * 0.99 <= float(x.abs().min()) and float(x.abs().max()) <= 2**16 * tiny
            continue
        assert float(x.abs().max()) <= 8 * tiny and float(x.abs().min()) >= tiny / 8 * 0.99
        assert 0.3 < float((x.abs() < tiny).float().mean()) < 0.7  # about half are subnormal


def test_validation_draws_the_stress_data_on_the_activations_only():
    spec = OP.spec((4, 32), "float16")
    assert OP.validation_distributions == (*OP.distributions, *STRESS_DISTRIBUTIONS)
    x, w = OP.validation_inputs(spec, 3, "nonfinite", "cpu")
    _, w0 = OP.make_inputs(spec, 3, OP.distributions[0], "cpu")
    assert not bool(torch.isfinite(x).all()) and torch.equal(w, w0)  # the weight is untouched
    ce = get_op("cross_entropy").spec((4, 32), "float32")
    logits, target = get_op("cross_entropy").validation_inputs(ce, 3, "spikes", "cpu")
    assert float(logits.abs().max()) >= SPIKE_RANGE[0] and target.dtype == torch.int64


# ---- check_close on non-finite values --------------------------------------------------------

TOL = Tolerance()


def _close(out: list[float], ref: list[float], dtype=torch.float32) -> str | None:
    reference = torch.tensor(ref, dtype=torch.float64)
    return check_close(torch.tensor(out, dtype=dtype), reference, reference.to(dtype), TOL)


def test_non_finite_values_must_be_the_references():
    nan, inf = math.nan, math.inf
    assert _close([1.0, nan, inf, -inf], [1.0, nan, inf, -inf]) is None
    assert "NaN" in (_close([1.0, 0.0], [1.0, nan]) or "")  # NaN laundered to zero
    assert "NaN" in (_close([1.0, nan], [1.0, inf]) or "")  # NaN where the reference is infinite
    assert "infinite" in (_close([1.0, -inf], [1.0, inf]) or "")  # the other sign
    assert "infinite" in (_close([1.0, inf], [1.0, 2.0]) or "")
    assert "infinite" in (_close([1.0, 3e38], [1.0, inf]) or "")  # finite where it is infinite


def test_a_finite_answer_past_the_dtypes_range_is_an_infinity_there():
    assert _close([1.0, math.inf], [1.0, 7e4], torch.float16) is None  # 7e4 rounds to +Inf in float16
    assert _close([1.0, 65504.0], [1.0, 7e4], torch.float16) is not None


def test_where_pytorch_overflows_it_sets_no_tolerance():
    reference = torch.tensor([1.0, 2.0, 3.0, 100.0], dtype=torch.float64)
    lowp = torch.tensor([1.0, 2.0, 3.0, math.inf])  # PyTorch overflowed an intermediate there
    wrong = torch.tensor([1.0, 2.0, 3.0, 50.0])
    assert check_close(wrong, reference, lowp, TOL) is not None
    assert check_close(reference.float(), reference, lowp, TOL) is None
