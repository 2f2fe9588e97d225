"""Rule 2 for ops that write an input (a decode step storing its new keys and values into the KV
cache): the family declares the written inputs and their state after the call; the harness checks
that state bit for bit and every other input as before.

A toy family here, ``_AppendRow``, is the smallest such op: it stores a row ``x`` into ``buf`` at
``pos`` and returns ``2 * x``. Its launchers are a Triton kernel (run by the interpreter) whose
``MODE`` plants one way of getting the write wrong; tests are trusted code, so they call
:func:`validate` and :func:`run_checked` in this process. The decode attention family's own
write (``write_kv``) is tested in tests/test_decode_attention_write_kv.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import pytest
import torch
import triton
import triton.language as tl

from kernelsmith.evaluate.validate import Rejected, allocate_outputs, expected_inputs, run_checked, validate
from kernelsmith.ops._base import Launcher, OpFamily, generator
from kernelsmith.spec import OpSpec, TensorSpec

ROWS, WIDTH = 5, 24


@triton.jit
def _append_row_kernel(x_ptr, buf_ptr, pos_ptr, out_ptr, WIDTH: tl.constexpr, BLOCK: tl.constexpr,
                       MODE: tl.constexpr):  # fmt: skip
    d = tl.arange(0, BLOCK)
    ok = d < WIDTH
    x = tl.load(x_ptr + d, mask=ok)
    pos = tl.load(pos_ptr)
    tl.store(out_ptr + d, 2.0 * x, mask=ok)
    if MODE == "right":
        tl.store(buf_ptr + pos * WIDTH + d, x, mask=ok)
    if MODE == "elsewhere":  # the row one position off
        tl.store(buf_ptr + (pos + 1) * WIDTH + d, x, mask=ok)
    if MODE == "half":  # only the first half of the row: the rest stays stale
        tl.store(buf_ptr + pos * WIDTH + d, x, mask=d < WIDTH // 2)
    if MODE == "undeclared":  # right, and scribbles on x too, which the op does not write
        tl.store(buf_ptr + pos * WIDTH + d, x, mask=ok)
        tl.store(x_ptr + d, 0.0 * x, mask=ok)
    # MODE == "skip": never writes the row


def _launcher(mode: str) -> Launcher:
    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        x, buf, pos = inputs
        _append_row_kernel[(1,)](x, buf, pos, outputs[0], WIDTH=WIDTH, BLOCK=32, MODE=mode)

    return launch


class _AppendRow(OpFamily):
    """``out = 2 * x``, and ``x`` stored into row ``pos`` of ``buf`` (declared written)."""

    name = "append_row_toy"
    summary = shape_help = "test only"
    distributions = ("normal",)
    stress_distributions: ClassVar[tuple[str, ...]] = ()
    dtypes = ("float32",)
    declares = (1,)

    def spec_for_test(self) -> OpSpec:
        return OpSpec(self.name, (TensorSpec((WIDTH,), "float32"), TensorSpec((ROWS, WIDTH), "float32"),
                                  TensorSpec((1,), "int64")), {})  # fmt: skip

    def validation_specs(self, spec: OpSpec) -> list[OpSpec]:
        return [spec]

    def written_inputs(self, spec: OpSpec) -> tuple[int, ...]:
        return self.declares

    def reference_written(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        x, buf, pos = inputs
        return [buf.clone().index_copy_(0, pos, x[None])]

    def reference(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return (2 * inputs[0],)

    def reference_fp64(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return (2 * inputs[0].double(),)

    def make_inputs(self, spec: OpSpec, seed: int, distribution: str = "normal",
                    device: str | torch.device = "cpu") -> tuple[torch.Tensor, ...]:  # fmt: skip
        g = generator(seed, device)
        x = torch.randn(WIDTH, generator=g, device=device)
        buf = torch.randn(ROWS, WIDTH, generator=g, device=device) + 100.0  # never equal to a new row
        pos = torch.randint(0, ROWS - 1, (1,), generator=g, device=device)  # (pos + 1 stays inside)
        return x, buf, pos


OP = _AppendRow()
SPEC = OP.spec_for_test()


def _validate(mode: str, op: OpFamily = OP) -> int:
    return validate(op, SPEC, lambda spec, config: _launcher(mode), None, "cpu", lambda: None)


def test_a_declared_write_done_right_passes_validation() -> None:
    assert _validate("right") > 0


def test_the_declared_input_is_in_its_written_state_after_the_call() -> None:
    inputs = list(OP.make_inputs(SPEC, 3))
    before = [t.clone() for t in inputs]
    run_checked(_launcher("right"), inputs, allocate_outputs(OP, SPEC, "cpu"), lambda: None, OP, SPEC)
    pos = int(before[2])
    assert torch.equal(inputs[1][pos], before[0])  # the row is there...
    rest = [r for r in range(ROWS) if r != pos]
    assert torch.equal(inputs[1][rest], before[1][rest])  # ...and nothing else moved


def test_a_repeated_call_on_the_written_state_passes() -> None:
    """Idempotence: the second run (rule 9's, the timing rounds') starts from the written state
    and must leave the same state, which is what its own expectation says."""
    inputs = list(OP.make_inputs(SPEC, 4))
    for _ in range(3):
        run_checked(_launcher("right"), inputs, allocate_outputs(OP, SPEC, "cpu"), lambda: None, OP, SPEC)


@pytest.mark.parametrize(
    ("mode", "kind", "says"),
    [
        ("skip", "validate", "input 1, which the op writes, wrong in 24 elements"),
        ("elsewhere", "validate", "input 1, which the op writes, wrong in 48 elements"),
        ("half", "validate", "input 1, which the op writes, wrong in 12 elements"),
        ("undeclared", "cheat", "input 0, which the op does not write"),
    ],
)
def test_a_wrong_write_is_rejected_with_the_input_named(mode: str, kind: str, says: str) -> None:
    with pytest.raises(Rejected) as caught:
        _validate(mode)
    assert caught.value.kind == kind
    assert says in str(caught.value)


def test_without_the_declaration_the_write_is_a_cheat() -> None:
    """A family that declares nothing (every family but the few that write) keeps rule 2 as it
    was: the same correct kernel that writes the row is rejected for modifying its inputs."""

    class _Undeclared(_AppendRow):
        declares = ()

    with pytest.raises(Rejected) as caught:
        _validate("right", _Undeclared())
    assert caught.value.kind == "cheat"
    assert "input 1, which the op does not write" in str(caught.value)


def test_run_checked_without_the_family_allows_no_write() -> None:
    inputs = list(OP.make_inputs(SPEC, 5))
    with pytest.raises(Rejected, match="modified its inputs"):
        run_checked(_launcher("right"), inputs, allocate_outputs(OP, SPEC, "cpu"), lambda: None)


def test_the_declaration_cannot_be_widened_during_the_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The declaration and the expected state are the family's, taken before the candidate runs:
    a launcher that widens the declaration while it runs still fails for what it wrote."""
    scribble = _launcher("undeclared")

    def widening(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        monkeypatch.setattr(_AppendRow, "declares", (0, 1))
        monkeypatch.setattr(_AppendRow, "reference_written", _accept_anything)
        scribble(inputs, outputs)

    inputs = list(OP.make_inputs(SPEC, 6))
    with pytest.raises(Rejected) as caught:
        run_checked(widening, inputs, allocate_outputs(OP, SPEC, "cpu"), lambda: None, OP, SPEC)
    assert caught.value.kind == "cheat"
    assert "input 0" in str(caught.value)


def _accept_anything(self: Any, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [t for t in inputs[:2]]


def test_expected_inputs_leaves_its_clones_untouched() -> None:
    inputs = list(OP.make_inputs(SPEC, 7))
    before = [t.clone() for t in inputs]
    expected = expected_inputs(OP, SPEC, before)
    assert expected[0] is before[0] and expected[2] is before[2]
    assert not torch.equal(expected[1], before[1])
    assert torch.equal(before[1], inputs[1])



def test_timing_checks_the_input_sets_against_their_pre_call_state() -> None:
    """The worker's check after its timed rounds: each shared input set must be in the state one
    call from its refill gives; a row left stale (or written elsewhere) is reported."""
    from kernelsmith.evaluate._worker_timing import _written_state_problem

    before = OP.make_inputs(SPEC, 8)
    right = [t.clone() for t in before]
    _launcher("right")(right, [torch.empty(WIDTH)])
    assert _written_state_problem(OP, SPEC, [right], [before]) is None
    stale = [t.clone() for t in before]  # (nothing written: the row at pos is still the old one)
    problem = _written_state_problem(OP, SPEC, [right, stale], [before, before])
    assert problem is not None and "input set 1" in problem and "input 1, which the op writes" in problem
