"""Output pre-fills that vary (DESIGN.md rules 1, 9 and 12): validation fills output buffers with
NaN, random values, zeros or untouched memory, chosen with secret randomness, so a kernel that
reads its output buffer first cannot tell validation from a user's process.

The kernels here are trusted in-test launchers around small ``@triton.jit`` kernels, validated
in this process with :func:`kernelsmith.evaluate.validate.validate` (the worker runs the same).
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Sequence

import pytest
import torch
import triton
import triton.language as tl

from kernelsmith.evaluate import validate as harness
from kernelsmith.evaluate.validate import PREFILLS, Prefill, Rejected, allocate_outputs, prefill_, validate
from kernelsmith.ops import get_op
from kernelsmith.space import next_power_of_two
from kernelsmith.spec import OpSpec

RMSNORM = get_op("rmsnorm")
SPEC = RMSNORM.spec((16, 64), "float32")


@triton.jit
def _rmsnorm_rows(x_ptr, w_ptr, y_ptr, N, eps, BLOCK_N: tl.constexpr, MODE: tl.constexpr):
    """RMSNorm, one row per program. MODE 0: honest. MODE 1: poison detection (computes the
    answer only when its output buffer holds what the NaN-era harness wrote, NaN or 777.0, and
    writes the input back otherwise). MODE 2: adds a little of the buffer's old contents (NaN
    laundered to 0). MODE 3: never writes."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / N + eps) * w
    old = tl.load(y_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    if MODE == 1:
        poisoned = tl.sum(((old != old) | (old == 777.0)).to(tl.int32), axis=0) == N
        y = tl.where(poisoned, y, x)
    if MODE == 2:
        y = y + tl.where(old != old, 0.0, old) * 1e-3
    if MODE != 3:
        tl.store(y_ptr + row * N + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def _build(mode: int):
    def build(spec: OpSpec, config: object):
        n = spec.inputs[0].shape[-1]
        rows = spec.inputs[0].numel // n
        eps = float(spec.const("eps"))

        def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
            _rmsnorm_rows[(rows,)](inputs[0], inputs[1], outputs[0], n, eps,
                                   BLOCK_N=next_power_of_two(n), MODE=mode)

        return launch

    return build


HONEST, POISON_DETECT, READS_OUTPUT, NEVER_WRITES = _build(0), _build(1), _build(2), _build(3)


def _run(build) -> int:
    return validate(RMSNORM, SPEC, build, None, "cpu", lambda: None)


def _force(monkeypatch: pytest.MonkeyPatch, first: str, second: str) -> None:
    """Every pair of pre-fills of the kinds given, with fresh seeds as the harness draws them (a
    fixed seed would let untouched memory be the previous step's freed buffer of equal values)."""
    monkeypatch.setattr(harness, "_prefill_pair",
                        lambda: (Prefill(first, secrets.randbits(62)), Prefill(second, secrets.randbits(62))))


def test_each_prefill_fills_as_it_says():
    shape = (4, 8)
    assert torch.isnan(Prefill("nan").values(shape, torch.bfloat16, "cpu")).all()
    assert not Prefill("zeros").values(shape, torch.float16, "cpu").any()
    assert Prefill("untouched").values(shape, torch.float32, "cpu") is None
    random = Prefill("random", 12345).values(shape, torch.float16, "cpu")
    assert torch.isfinite(random).all() and random.unique().numel() > 16
    assert torch.equal(random, Prefill("random", 12345).values(shape, torch.float16, "cpu"))  # re-generable
    assert not torch.equal(random, Prefill("random", 54321).values(shape, torch.float16, "cpu"))
    assert Prefill("nan").values(shape, torch.int32, "cpu").dtype == torch.int32  # no NaN in integers
    outs = allocate_outputs(RMSNORM, SPEC, "cpu", Prefill("nan"))
    assert len(outs) == 1 and outs[0].shape == (16, 64) and torch.isnan(outs[0]).all()


def test_the_choice_is_secret_and_covers_every_kind_and_each_pair_has_random_values():
    pairs = [harness._prefill_pair() for _ in range(200)]
    assert all("random" in (a.kind, b.kind) for a, b in pairs)
    assert {fill.kind for pair in pairs for fill in pair} == set(PREFILLS)
    assert {a.kind for a, _ in pairs} == set(PREFILLS)  # the random one is not always second
    assert len({fill.seed for pair in pairs for fill in pair}) == 400


def test_an_in_place_refill_replaces_what_the_buffers_held():
    buffers = [torch.full((8, 8), 3.0) for _ in range(3)]
    prefill_(buffers)
    assert all(not torch.equal(b, torch.full((8, 8), 3.0)) for b in buffers)
    # every buffer of one refill is filled the same way (rule 5's refill between timing halves)
    assert len({(bool(torch.isnan(b).all()), bool((b == 0).all())) for b in buffers}) == 1


def test_an_honest_kernel_passes_on_every_pair(monkeypatch):
    """One validation whose steps take every pair in turn (each kind with random values, in both
    orders): bitwise-stable and correct on all of them."""
    pairs = [pair for other in PREFILLS for pair in (("random", other), (other, "random"))]
    turn = itertools.cycle(pairs)
    monkeypatch.setattr(harness, "_prefill_pair", lambda: tuple(Prefill(k, secrets.randbits(62)) for k in next(turn)))
    assert _run(HONEST) // 2 >= len(pairs)  # one pair per step: every pair was drawn


def test_a_kernel_that_detects_nan_poisoning_passed_the_nan_era_harness_and_is_rejected_now(monkeypatch):
    """The attack of issue 12: right where the output buffer holds the old harness's poison
    (NaN, then 777.0 for the rule 9 rerun), wrong in a user's process (``torch.empty``)."""
    monkeypatch.setattr(harness, "_prefill_pair", lambda: (Prefill("nan"), Prefill("zeros")))
    monkeypatch.setattr(Prefill, "values", _nan_era_values)
    assert _run(POISON_DETECT) > 0  # the detector works: the NaN-only harness accepts it
    monkeypatch.undo()
    for _ in range(3):  # secret pre-fills: rejected every time, not by luck
        with pytest.raises(Rejected) as rejected:
            _run(POISON_DETECT)
        assert rejected.value.kind == "validate"


_REAL_VALUES = Prefill.values


def _nan_era_values(self: Prefill, shape, dtype, device):
    """What the harness wrote before rule 12: NaN, and 777.0 for the rerun."""
    if self.kind == "zeros":
        return torch.full(tuple(shape), 777.0, dtype=dtype, device=device)
    return _REAL_VALUES(self, shape, dtype, device)


@pytest.mark.parametrize("other", PREFILLS)
@pytest.mark.parametrize("random_first", [True, False])
def test_rule9_and_rule1_hold_whatever_the_other_prefill(monkeypatch, other, random_first):
    """A kernel reading its output's old contents differs bit for bit between the two runs, and
    one that never writes is named, on every pair the secret choice can draw."""
    _force(monkeypatch, *(("random", other) if random_first else (other, "random")))
    with pytest.raises(Rejected, match="bit for bit") as reads:
        _run(READS_OUTPUT)
    assert "uninitialized" in str(reads.value)
    with pytest.raises(Rejected, match="1024 elements were never written"):
        _run(NEVER_WRITES)
