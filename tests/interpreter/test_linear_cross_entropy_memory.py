"""The fused linear + cross-entropy families' scratch memory (issue 18): the formula each family
exposes against what a call really allocates, the search space's cap on it
(``KERNELSMITH_LCE_SCRATCH_MIB``), the fallback to the smallest-scratch configs where the cap
leaves none, and a capped config still right against float64.

Allocations are counted with a ``TorchDispatchMode`` that records every storage a torch op makes
(views and in-place ops hand back an argument's storage and are not counted) while the Triton
kernels are stubbed out: their work allocates nothing on a GPU, and in the interpreter their
argument copies would be counted, so what is left is exactly the launcher's own host code.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from kernelsmith.evaluate.errors import check_close
from kernelsmith.ops import get_op
from kernelsmith.ops._base import Variant
from kernelsmith.ops._linear_cross_entropy_chunks import (
    SCRATCH_FLOOR_BYTES,
    SCRATCH_FRACTION_OF_LOGITS,
    chunked_scratch_bytes,
)
from kernelsmith.ops._linear_cross_entropy_library import LIBRARY_VARIANT
from kernelsmith.ops.linear_cross_entropy import dtype_of, shape_of
from kernelsmith.settings import SettingError
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec

FORWARD = get_op("linear_cross_entropy")
BACKWARD = get_op("linear_cross_entropy_backward")
FUSED = get_op("linear_cross_entropy_fused")
CAP = "KERNELSMITH_LCE_SCRATCH_MIB"
MIB = 2**20
UNCAPPED_MIB = "1e9"  # a cap no small workload reaches
# The gradient variants: the families' own and the library-GEMM one they do not list yet.
GRADIENT_VARIANTS = [BACKWARD.variants[0], LIBRARY_VARIANT]


class _NewStorages(TorchDispatchMode):
    """The bytes of every storage a torch op creates while the mode is active."""

    def __init__(self) -> None:
        super().__init__()
        self.allocations: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        tensors = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        given = {x.untyped_storage().data_ptr() for x in tensors}
        made = {x.untyped_storage().data_ptr(): x.untyped_storage().nbytes()
                for x in pytree.tree_leaves(out) if isinstance(x, torch.Tensor)}  # fmt: skip
        self.allocations += [(str(func), n) for ptr, n in made.items() if ptr not in given and n > 0]
        return out

    @property
    def total(self) -> int:
        return sum(n for _, n in self.allocations)


@pytest.fixture
def kernels_stubbed(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    """Every interpreted Triton launch does nothing (see the module docstring)."""
    if device != "cpu":
        pytest.skip("counts the interpreter's launches")
    from triton.runtime.interpreter import InterpretedFunction

    monkeypatch.setattr(InterpretedFunction, "run", lambda self, *args, **kwargs: None)


def _allocated(op: Any, spec: OpSpec, config: Config, variant: Variant | None = None) -> _NewStorages:
    """What one call of ``config``'s launcher allocates, inputs and outputs made beforehand."""
    inputs = op.make_inputs(spec, seed=0, device="cpu")
    outputs = [torch.empty(o.shape, dtype=o.torch_dtype) for o in op.output_specs(spec)]
    launch = (variant or op.variants[0]).build(spec, config)
    with _NewStorages() as seen:
        launch(inputs, outputs)
    return seen


def _one_config_per(op: Any, spec: OpSpec, names: tuple[str, ...], variant: Variant | None = None) -> list[Config]:
    """The first config of the family's space for each combination of ``names``' values."""
    firsts: dict[tuple[Any, ...], Config] = {}
    for config in (variant or op.variants[0]).space(spec).configs():
        firsts.setdefault(tuple(config[n] for n in names), config)
    return list(firsts.values())


# (tokens, hidden, vocabulary, dtype, reduction, bias): small and odd
CASES = [
    (37, 48, 131, "bfloat16", "mean", True),
    (37, 48, 131, "float32", "none", True),
    (37, 48, 131, "float16", "sum", False),
    (5, 48, 131, "bfloat16", "none", False),  # one chunk larger than the tokens
]


def _spec(op: Any, case: tuple[Any, ...]) -> OpSpec:
    t, h, v, dtype, reduction, bias = case
    return op.spec((t, h, v), dtype, reduction=reduction, bias=bias)


def test_the_counter_counts_allocations_and_not_views() -> None:
    x = torch.empty(10)
    with _NewStorages() as seen:
        y = x.new_empty((3, 5), dtype=torch.float32)
        y[1:].fill_(1.0)
        x.view(2, 5).add_(1)
        _ = x.double()
    assert [n for _, n in seen.allocations] == [60, 80]


def _off_cuda_copies(spec: OpSpec, config: Config, variant: Variant) -> int:
    """What the library variant allocates off CUDA only, outside the formula: with a float32 dW
    accumulator for 16-bit inputs, float32 copies of each chunk's g.T and h_c (its module's
    docstring: ``out_dtype`` is CUDA's only)."""
    if variant is not LIBRARY_VARIANT or config["DW_ACC"] != "float32" or dtype_of(spec).dtype == "float32":
        return 0
    t, h, v = shape_of(spec)
    chunk = config["CHUNK"]
    return sum(4 * min(chunk, t - start) * (v + h) for start in range(0, t, chunk))


@pytest.mark.parametrize("variant", GRADIENT_VARIANTS, ids=lambda v: v.name)
@pytest.mark.parametrize("op", [BACKWARD, FUSED], ids=lambda op: op.name)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_the_gradient_scratch_formula_is_what_a_call_allocates(op, case, variant, kernels_stubbed, monkeypatch) -> None:
    monkeypatch.setenv(CAP, UNCAPPED_MIB)
    spec = _spec(op, case)
    configs = _one_config_per(op, spec, ("CHUNK", "DW_ACC"), variant)
    assert len(configs) == (3 if case[0] == 37 else 1) * (1 if case[3] == "float32" else 2)
    for config in configs:
        seen = _allocated(op, spec, config, variant)
        expected = op.scratch_bytes(spec, config) + _off_cuda_copies(spec, config, variant)
        assert seen.total == expected, f"{variant.name} {config.key}: {seen.allocations}"
        assert op.scratch_bytes(spec, config) == chunked_scratch_bytes(spec, config)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_the_forward_scratch_formula_is_what_a_call_allocates(case, kernels_stubbed) -> None:
    spec = _spec(FORWARD, case)
    for config in _one_config_per(FORWARD, spec, ("SPLITS", "BLOCK_N")):
        seen = _allocated(FORWARD, spec, config)
        assert seen.total == FORWARD.scratch_bytes(spec, config), f"{config.key}: {seen.allocations}"


def _space(op: Any, spec: OpSpec, variant: Variant | None = None) -> tuple[Config, ...]:
    return (variant or op.variants[0]).space(spec).configs()


@pytest.mark.parametrize("variant", GRADIENT_VARIANTS, ids=lambda v: v.name)
@pytest.mark.parametrize("op", [BACKWARD, FUSED], ids=lambda op: op.name)
def test_the_cap_drops_exactly_the_configs_over_it(op, variant, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = op.spec((37, 48, 131), "bfloat16", reduction="mean", bias=True)
    monkeypatch.setenv(CAP, UNCAPPED_MIB)
    every = _space(op, spec, variant)
    needs = sorted({op.scratch_bytes(spec, c) for c in every})
    assert len(needs) == 6  # CHUNK 16, 32, 64 (37 tokens) x DW_ACC float32, output
    # Caps on each need between the smallest and the largest, and one byte under the largest.
    for cap in (*needs[1:-1], needs[-1] - 1):
        monkeypatch.setenv(CAP, repr(cap / MIB))  # (exact: MIB is a power of two)
        capped = _space(op, spec, variant)
        assert capped == tuple(c for c in every if op.scratch_bytes(spec, c) <= cap)
        assert 0 < len(capped) < len(every)


@pytest.mark.parametrize("variant", GRADIENT_VARIANTS, ids=lambda v: v.name)
@pytest.mark.parametrize("op", [BACKWARD, FUSED], ids=lambda op: op.name)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_cap_below_every_config_keeps_the_smallest_scratch_configs(op, dtype, variant, monkeypatch) -> None:
    spec = op.spec((37, 48, 131), dtype, reduction="sum", bias=True)
    monkeypatch.setenv(CAP, UNCAPPED_MIB)
    every = _space(op, spec, variant)
    smallest = min(op.scratch_bytes(spec, c) for c in every)
    monkeypatch.setenv(CAP, "1e-9")  # 0 bytes: below any config's need
    kept = _space(op, spec, variant)
    assert kept, "the cap left the space empty"
    assert {op.scratch_bytes(spec, c) for c in kept} == {smallest}
    assert kept == tuple(c for c in every if op.scratch_bytes(spec, c) == smallest)
    assert {(c["CHUNK"], c["DW_ACC"]) for c in kept} == {(16, "output" if dtype == "bfloat16" else "float32")}


def test_the_cap_is_for_the_search_only_a_config_over_it_still_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Validation runs a config on fewer tokens than it was chosen for, and a user may lower the cap
    after tuning: the build checks the space without the cap."""
    spec = FUSED.spec((37, 48, 131), "bfloat16", bias=True)
    monkeypatch.setenv(CAP, UNCAPPED_MIB)
    largest = max(_space(FUSED, spec), key=lambda c: FUSED.scratch_bytes(spec, c))
    monkeypatch.setenv(CAP, "1e-9")
    assert largest not in set(_space(FUSED, spec))
    assert callable(FUSED.variants[0].build(spec, largest))


def test_the_default_cap_at_the_issue_shape_and_at_small_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """16k tokens x 128256 x 2048 in bfloat16 (issue 18): every config within 3/16 of the 4 GiB of
    bf16 logits, chunks up to T/16 kept, the float32 dW accumulator (1 GiB) dropped; where the cap
    is unset the whole space of a small workload stays (the 64 MiB floor)."""
    monkeypatch.delenv(CAP, raising=False)
    t, h, v = 16384, 2048, 128256
    spec = FUSED.spec((t, h, v), "bfloat16")
    default = _space(FUSED, spec)
    assert max(FUSED.scratch_bytes(spec, c) for c in default) <= t * v * 2 * SCRATCH_FRACTION_OF_LOGITS
    assert {(c["CHUNK"], c["DW_ACC"]) for c in default} == {(256, "output"), (512, "output"), (1024, "output")}
    monkeypatch.setenv(CAP, UNCAPPED_MIB)
    every = _space(FUSED, spec)
    assert max(c["CHUNK"] for c in every) == 8192 and {c["DW_ACC"] for c in every} == {"float32", "output"}

    small = FUSED.spec((37, 48, 131), "bfloat16", bias=True)
    uncapped_small = _space(FUSED, small)
    assert max(FUSED.scratch_bytes(small, c) for c in uncapped_small) < SCRATCH_FLOOR_BYTES
    monkeypatch.delenv(CAP)
    assert _space(FUSED, small) == uncapped_small


def test_the_library_variant_fits_twice_the_tokens_under_the_default_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its chunk is bfloat16, not float32: at the issue shape chunks up to 2048 tokens (501 MiB)
    stay under the default 752 MiB cap, 4096 (1 GiB) does not, and neither does the float32 dW
    accumulator; uncapped, its whole chunk range and both accumulators are back."""
    monkeypatch.delenv(CAP, raising=False)
    t, h, v = 16384, 2048, 128256
    spec = FUSED.spec((t, h, v), "bfloat16")
    default = _space(FUSED, spec, LIBRARY_VARIANT)
    assert max(FUSED.scratch_bytes(spec, c) for c in default) <= t * v * 2 * SCRATCH_FRACTION_OF_LOGITS
    assert {(c["CHUNK"], c["DW_ACC"]) for c in default} == {(n, "output") for n in (256, 512, 1024, 2048)}
    assert FUSED.scratch_bytes(spec, default[0]) == 2 * min(c["CHUNK"] for c in default) * v + 4 * t + 4
    monkeypatch.setenv(CAP, UNCAPPED_MIB)
    every = _space(FUSED, spec, LIBRARY_VARIANT)
    assert max(c["CHUNK"] for c in every) == 8192 and {c["DW_ACC"] for c in every} == {"float32", "output"}


def test_a_negative_cap_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CAP, "-1")
    with pytest.raises(SettingError, match=CAP):
        _space(FUSED, FUSED.spec((37, 48, 131), "bfloat16"))


def _run(
    op: Any, spec: OpSpec, config: Config, inputs: tuple[torch.Tensor, ...], variant: Variant
) -> list[torch.Tensor]:
    outs = [torch.full(o.shape, math.nan, dtype=o.torch_dtype, device=inputs[0].device) for o in op.output_specs(spec)]
    variant.build(spec, config)(inputs, outs)
    return outs


_WIDEST: Callable[[Config], tuple[int, ...]] = lambda c: (c["BLOCK_M"] * c["BLOCK_N"], -c["BLOCK_K"], -c["num_stages"])


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize(
    ("op", "dtype", "reduction"),
    [(FUSED, "bfloat16", "mean"), (BACKWARD, "float32", "none")],
    ids=["fused-bfloat16-mean", "backward-float32-none"],
)
@pytest.mark.parametrize("variant", GRADIENT_VARIANTS, ids=lambda v: v.name)
def test_a_capped_config_matches_float64(op, dtype, reduction, variant, monkeypatch, device: str) -> None:
    """37 tokens in chunks of 16 (the only chunk the cap leaves), dW accumulated in its own dtype
    for bfloat16: the loss, dh, dW and db against float64 under the family's tolerance."""
    monkeypatch.setenv(CAP, "1e-9")
    spec = op.spec((37, 48, 131), dtype, reduction=reduction, label_smoothing=0.1, bias=True)
    key = _WIDEST if variant is not LIBRARY_VARIANT else (lambda c: (c["BLOCK_V"],))
    config = max(_space(op, spec, variant), key=key)
    assert config["CHUNK"] == 16 and config["DW_ACC"] == ("output" if dtype == "bfloat16" else "float32")
    inputs = op.make_inputs(spec, seed=3, device=device)
    outs = _run(op, spec, config, inputs, variant)
    refs64, lowps = op.reference_fp64(spec, inputs), op.reference(spec, inputs)
    assert len(outs) == len(refs64) == (4 if op is FUSED else 3)
    for k, (out, ref64, lowp) in enumerate(zip(outs, refs64, lowps, strict=True)):
        problem = check_close(out, ref64, lowp, op.tolerance)
        assert problem is None, f"{config.key}: output {k}: {problem}"
