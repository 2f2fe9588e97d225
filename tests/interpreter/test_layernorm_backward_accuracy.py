"""LayerNorm backward's row mean where float32 loses it: rows whose sum is carried by spikes that
cancel, and rows whose shift is far from their mean (issue 19's flake audit).

On such rows a plain float32 mean of ``d = x - shift`` is many ulps off the small elements' own
centred values, and ``dw = sum(dy * xhat)`` shows it wherever ``dy`` is large on them. The
kernels compute those rows' statistics exactly (the section on exactly centred values in
:mod:`kernelsmith.ops._layernorm_kernels`; where each variant pays for it: the module docstring
of :mod:`kernelsmith.ops.layernorm_backward`). Tested here: the helpers against float64, the
check that sends two_stage's rows to them (normal rows must stay off it: it costs), and every
variant, affine form and a few odd widths against float64 with the most accurate float32 result
as the baseline, and on 'spikes' validation draws under the harness's own rule.

The kernels run in the Triton interpreter without a GPU (tests/conftest.py), so rows stay few and
narrow there; on a GPU every test here runs compiled, which is what proves that the compiler keeps
TwoSum's additions as written (no reassociation), and the last test runs wide rows on many warps.
"""

from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl
from test_layernorm_backward_kernels import formula

from kernelsmith.evaluate.errors import check_close
from kernelsmith.ops._layernorm_kernels import centred_row, compensated_mean, exactly_centred_row, row_shift
from kernelsmith.ops.layernorm import AFFINE
from kernelsmith.ops.layernorm_backward import OP, _plain_mean_may_be_off
from kernelsmith.testing.kernels import launch_guarded

VARIANTS = [v.name for v in OP.variants]
EPS = 1e-5

# The draw of tests/interpreter/test_validation_flakes.py: the 1-row tail of (20, 100)
# weight_bias, 'spikes' stress data, whose x holds -10288.8 and +11371.8 (both among the first 64
# elements) and whose dy holds -2.1e4 and -8.2e3 on two small elements.
FLAKE_SEED = 378339608034625827


def _flake_draw() -> tuple:
    spec = OP.spec((20, 100), "float32", affine="weight_bias")
    tail = OP.validation_specs(spec)[1]
    return spec, tail, OP.validation_inputs(tail, FLAKE_SEED, "spikes", "cpu")


def _spiky_rows(rows: int, width: int, seed: int, head: bool = False) -> torch.Tensor:
    """Rows of N(0, 1) values, each with two spikes of 3e3..2e4 of opposite signs whose sum is a
    few hundred (so that the mean is far from the small values, as on the flake's row); with
    ``head`` the positive spike is among the first 64 elements, which drags row_shift away."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=g, dtype=torch.float64)
    for r in range(rows):
        a, b = torch.randperm(width, generator=g)[:2].tolist()
        if head:
            a = int(torch.randint(0, min(64, width), (1,), generator=g))
            b = b if b != a else (a + 1) % width
        size = 3e3 + 1.7e4 * float(torch.rand(1, generator=g))
        x[r, a], x[r, b] = size, -size + 300.0 * (1 + float(torch.rand(1, generator=g)))
    return x.float()


def _dy_on_small_elements(x: torch.Tensor, seed: int) -> torch.Tensor:
    """N(0, 1) upstream gradients with one of 1e4 on a small element of each row (as the flake's
    dy), so that dw is ruled by the small elements' xhat."""
    g = torch.Generator().manual_seed(seed ^ 0xD1)
    dy = torch.randn(x.shape, generator=g)
    for r in range(x.shape[0]):
        small = (x[r].abs() < 3).nonzero().flatten()
        dy[r, small[int(torch.randint(0, len(small), (1,), generator=g))]] = 1e4
    return dy


# ---- the helpers, in a kernel of their own ------------------------------------------------------


@triton.jit
def _centring_kernel(x_ptr, xc_ptr, out_ptr, N, EXACT: tl.constexpr, BLOCK_N: tl.constexpr):
    """Row ``program``: its shift, its centred values by exactly_centred_row (or, without EXACT,
    the forward's centred_row), and whether the check finds its plain mean may be off, as
    two_stage makes it (from mean|xc|) and as looped does (from mean|d| - |mean(d)|): ``out``
    holds (shift, mean(d), flagged, flagged in one pass) a row."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0)
    shift = row_shift(x_ptr + row * N, N)
    if EXACT:
        mean_d, xc, rstd = exactly_centred_row(x, shift, mask, N, 1e-5)
    else:
        mean_d, xc, rstd = centred_row(x, shift, mask, N, 1e-5)
    tl.store(xc_ptr + row * N + cols, xc, mask=mask)
    flagged = _plain_mean_may_be_off(mean_d, tl.sum(tl.abs(xc), axis=0) / N, rstd, N, 1e-5)
    d = tl.where(mask, x - shift, 0.0)
    spread_bound = tl.sum(tl.abs(d), axis=0) / N - tl.abs(mean_d)
    flagged_in_one_pass = _plain_mean_may_be_off(mean_d, spread_bound, rstd, N, 1e-5)
    tl.store(out_ptr + row * 4, shift)
    tl.store(out_ptr + row * 4 + 1, mean_d)
    tl.store(out_ptr + row * 4 + 2, flagged.to(tl.float32))
    tl.store(out_ptr + row * 4 + 3, flagged_in_one_pass.to(tl.float32))


def _centre(x: torch.Tensor, exact: bool, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(xc, flagged as two_stage flags, flagged as looped does) of each row of float32 ``x``."""
    rows, width = x.shape
    x = x.to(device).contiguous()
    xc = torch.full_like(x, math.nan)
    out = torch.full((rows, 4), math.nan, device=device)
    _centring_kernel[(rows,)](x, xc, out, width, EXACT=exact, BLOCK_N=triton.next_power_of_2(width))
    out = out.cpu()
    return xc.cpu(), out[:, 2] == 1.0, out[:, 3] == 1.0


def _ulp(t: torch.Tensor) -> torch.Tensor:
    """float32's spacing at each |value|, as float64."""
    t = t.abs().float()
    return (torch.nextafter(t, torch.tensor(math.inf)) - t).double()


def _centring_errors(x: torch.Tensor, exact: bool, device: str) -> torch.Tensor:
    """Each centred value's error against float64, in units of what exact centring promises: two
    ulps of the value itself (its two roundings), and a millionth of an ulp of mean(d) (the mean's
    rest, rounded: a floor for values that are all but zero)."""
    xc, _, _ = _centre(x, exact, device)
    x64 = x.double()
    truth = x64 - x64.mean(-1, keepdim=True)
    shift = torch.stack([row[: min(64, len(row))].double().mean() for row in x])  # row_shift, in float64
    allowed = 2 * _ulp(truth) + 1e-6 * _ulp(x64.mean(-1) - shift)[:, None]
    return (xc.double() - truth).abs() / allowed


@pytest.mark.parametrize("width", [1, 2, 3, 37, 100, 257, 1000])
def test_exact_centring_is_within_its_rounding_on_hard_rows(width: int, device: str) -> None:
    """Cancelling spikes, a spike that drags the shift away, a large mean, a constant row: every
    centred value within two ulps of its own, whatever the row."""
    rows = [300.0 + torch.randn(1, width, generator=torch.Generator().manual_seed(width)),
            torch.full((1, width), 3.25), torch.full((1, width), 1.2e4)]  # fmt: skip
    if width > 1:  # (two spikes need two columns)
        rows += [_spiky_rows(2, width, seed=width), _spiky_rows(2, width, seed=width + 1, head=True)]
    if width == 100:
        rows.append(_flake_draw()[2][1])
    errors = _centring_errors(torch.cat(rows), exact=True, device=device)
    assert float(errors.max()) <= 1.0, float(errors.max())


def test_plain_centring_misses_that_bound_on_the_flake_row(device: str) -> None:
    """The same bound on the flake's row with the forward's plain centred_row: the mean of d is
    ~1e-5 off, ten ulps of the small elements' centred values (so the test above can fail)."""
    (_, x, *_) = _flake_draw()[2]
    assert float(_centring_errors(x, exact=False, device=device).max()) > 4
    assert float(_centring_errors(x, exact=True, device=device).max()) <= 1.0


@triton.jit
def _mean_kernel(x_ptr, out_ptr, N, BLOCK_N: tl.constexpr):
    cols = tl.arange(0, BLOCK_N)
    x = tl.load(x_ptr + cols, mask=cols < N, other=0.0)
    mean, rest = compensated_mean(x, tl.zeros_like(x), N)
    tl.store(out_ptr, mean)
    tl.store(out_ptr + 1, rest)


def test_the_compensated_mean_is_exact_where_the_plain_one_loses_everything(device: str) -> None:
    """2^24 + 1 is not a float32: a plain sum of (2^24, 1, 1, ..., -2^24) in that order drops every 1.
    The compensated mean gets (N - 2) / N correctly rounded in any order of the values, and its
    rest makes the two floats' sum some 2^-24 of an ulp from it."""
    width = 37
    values = torch.tensor([2.0**24, *[1.0] * (width - 2), -(2.0**24)])
    exact = (width - 2) / width
    rounded = float(torch.tensor(exact, dtype=torch.float32))
    for order in (torch.arange(width), torch.randperm(width, generator=torch.Generator().manual_seed(0))):
        out = torch.full((2,), math.nan, device=device)
        _mean_kernel[(1,)](values[order].contiguous().to(device), out, width, BLOCK_N=64)
        mean, rest = (float(v) for v in out.cpu())
        assert mean == rounded
        assert abs(mean + rest - exact) <= 2**-24 * abs(rounded - exact)
    # (the plain float32 sum, left to right, as the interpreter folds it: every 1 lost)
    assert float(torch.tensor(values.numpy().cumsum(dtype="float32")[-1])) == 0.0


# ---- the check that sends two_stage's rows to exact centring -------------------------------------


@pytest.mark.parametrize("width", [64, 100, 341, 1000, 4096])
def test_normal_rows_stay_on_the_plain_path(width: int, device: str) -> None:
    """The exact path costs (module docstring of layernorm_backward): the family's input
    distributions and the 'denormal' stress data never take it, in either variant's form of the
    check, and rows with spikes do."""
    spec = OP.spec((64, width), "float32", affine="none")
    for distribution in (*OP.distributions, "denormal"):
        if distribution == "denormal":
            _, x = OP.validation_inputs(spec, width, distribution, "cpu")
        else:
            _, x = OP.make_inputs(spec, seed=width, distribution=distribution, device="cpu")
        _, flagged, flagged_in_one_pass = _centre(x, exact=False, device=device)
        assert not bool((flagged | flagged_in_one_pass).any()), (distribution, flagged, flagged_in_one_pass)
    for head in (False, True):
        _, flagged, flagged_in_one_pass = _centre(_spiky_rows(8, width, seed=width, head=head), False, device)
        assert bool((flagged & flagged_in_one_pass).all()), (head, flagged, flagged_in_one_pass)


# ---- the variants ---------------------------------------------------------------------------------


@pytest.mark.parametrize("affine", AFFINE)
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_on_cancelling_spikes_against_float64(variant: str, affine: str, device: str) -> None:
    """Rows of cancelling spikes (the shift dragged away on some), a large dy on a small element of
    each: every output within the tolerance of the most accurate float32 result, at odd widths."""
    for rows, width, head in ((1, 100, False), (3, 37, True), (2, 257, False), (2, 1000, True)):
        spec = OP.spec((rows, width), "float32", affine=affine)
        drawn = OP.make_inputs(spec, seed=width, device="cpu")
        x = _spiky_rows(rows, width, seed=width, head=head)
        inputs = tuple(t.to(device) for t in (_dy_on_small_elements(x, width), x, *drawn[2:]))
        best = formula(inputs, EPS, torch.float32, exact_centring=True)
        config = OP.variant(variant).space(spec).configs()[0]
        outs, _ = launch_guarded(OP, variant, spec, config, inputs)
        for name, out, ref64, lowp in zip(("dx", "dw", "db"), outs, OP.reference_fp64(spec, inputs), best,
                                          strict=False):  # fmt: skip
            problem = check_close(out.cpu(), ref64.cpu(), lowp.cpu(), OP.tolerance)
            assert problem is None, f"{variant} {affine} {spec.describe()} {name}: {problem}"


# Seeds of the 1-row tail of (20, 100) weight_bias with 'spikes': the flake's and the first others.
SPIKE_SEEDS = (FLAKE_SEED, *range(12))


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_passes_spike_draws_under_the_harness_rule(variant: str, device: str) -> None:
    """The harness's own rule (k times PyTorch's error, PyTorch's sums lucky or not) on 'spikes'
    validation draws, the flake's among them."""
    spec, tail, _ = _flake_draw()
    config = OP.variant(variant).space(spec).configs()[-1]
    for seed in SPIKE_SEEDS:
        inputs = OP.validation_inputs(tail, seed, "spikes", "cpu")
        refs64, lowps = OP.reference_fp64(tail, inputs), OP.reference(tail, inputs)
        outs, _ = launch_guarded(OP, variant, tail, config, [t.to(device) for t in inputs])
        problems = [check_close(out.cpu(), ref, low, OP.tolerance) for out, ref, low in zip(outs, refs64, lowps,
                                                                                             strict=True)]  # fmt: skip
        assert problems == [None] * len(outs), (seed, problems)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_wide_spiky_rows_compiled(variant: str, dtype: str, device: str) -> None:
    """Compiled, at widths whose rows span many warps (other reduction trees than the
    interpreter's left-to-right fold): spiky rows, every config class of the space."""
    from kernelsmith.testing.kernels import covering_configs

    for width in (4096, 8192):
        spec = OP.spec((64, width), dtype, affine="weight_bias")
        drawn = OP.make_inputs(spec, seed=width, device=device)
        x = _spiky_rows(64, width, seed=width, head=width == 8192)
        dy = _dy_on_small_elements(x, width)
        inputs = (dy.to(device, drawn[0].dtype), x.to(device, drawn[1].dtype), *drawn[2:])
        best = formula(inputs, EPS, torch.float32, exact_centring=True)
        for config in covering_configs(OP.variant(variant).space(spec)):
            outs, _ = launch_guarded(OP, variant, spec, config, inputs)
            for out, ref64, lowp in zip(outs, OP.reference_fp64(spec, inputs), best, strict=True):
                problem = check_close(out.cpu(), ref64.cpu(), lowp.cpu(), OP.tolerance)
                assert problem is None, f"{variant} {spec.describe()} {dict(config)}: {problem}"
