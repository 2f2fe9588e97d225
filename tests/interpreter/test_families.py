"""What the elementwise families' interpreter tests share, once, parametrized over family, variant
and layout: GELU (``gelu``, ``gelu_tanh``), SwiGLU and GeGLU (``swiglu``, ``geglu`` with each GELU
formula) and their backwards.

- every variant's config classes (every value of every parameter of its spaces) on small and odd
  shapes in every dtype, against the float64 reference under the harness's own tolerance;
- every variant through the harness (``validate``), with the run counts its blind data allow;
- the two layouts of the gated families computing the same function;
- the variants' names, summaries and source hashes.

Kernel outputs are pre-filled with NaN and followed by a NaN guard, so a kernel that skips an
element or writes past the end is caught, and the inputs must come back unchanged. What is
peculiar to a family (its specs, inputs, references, spaces' budgets, special values) stays in
its own file: test_gelu_kernels.py, test_gated_kernels.py, test_gated_backward_kernels.py.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch
from real_compiler_run import assert_every_kernel_lowers

from kernelsmith.evaluate.validate import validate
from kernelsmith.ops import _elementwise
from kernelsmith.ops._base import OpFamily, Variant
from kernelsmith.ops.gated import GEGLU, SWIGLU
from kernelsmith.ops.gated_backward import GEGLU_BACKWARD, SWIGLU_BACKWARD
from kernelsmith.ops.gelu import GELU, GELU_TANH
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec
from kernelsmith.testing.kernels import assert_guarded_outputs, launch_guarded
from kernelsmith.testing.validation_runs import validation_runs

DTYPES = ("float16", "bfloat16", "float32")
LAYOUTS = ("pair", "concat")
Shape = tuple[int, ...]


def rotated(shapes: tuple[Shape, ...]) -> tuple[tuple[Shape, str], ...]:
    """``len(DTYPES) * len(shapes)`` (shape, dtype) cases, both rotating: every pair once when the
    counts are coprime, each of ``len(shapes)`` pairs three times when not (with other seeds)."""
    return tuple((shapes[i % len(shapes)], dtype) for i, dtype in enumerate(DTYPES * len(shapes)))


# GELU: numel 1, 7, 1000 and 4097, 1-D, 2-D and 3-D.
GELU_SHAPES: tuple[Shape, ...] = ((1,), (7,), (8, 125), (17, 241), (2, 4, 125))
# Gated activation shapes (..., H): numel 1, 7 (as 7 columns and as 7 rows of 1), 1000, 4097 (one
# row wider than the widest column block), 1-D, 2-D and 3-D; rows never a multiple of BLOCK_M > 1.
GATED_SHAPES: tuple[Shape, ...] = ((1,), (7,), (7, 1), (8, 125), (1, 4097), (2, 3, 241))
# The backwards: every (rows, H) once, the dtype rotating so that each dtype meets every row
# count and every width; then one 3-D activation.
BACKWARD_ROWS = (1, 7, 33)
BACKWARD_WIDTHS = (1, 3, 341, 1000)
BACKWARD_CASES: tuple[tuple[Shape, str], ...] = (
    *(((r, h), DTYPES[(i + j) % 3]) for i, r in enumerate(BACKWARD_ROWS) for j, h in enumerate(BACKWARD_WIDTHS)),
    ((2, 3, 341), "bfloat16"),
)


def _gelu_runs(op: OpFamily, spec: OpSpec, layout: str | None) -> set[int]:
    # the target on every distribution of the family, each tail on one, two runs apiece; the tail
    # drawing spikes also draws the next when a spike is positive (gelu(x) is then about x where
    # x dominates the row, so the identity canary passes: blind)
    return validation_runs(op, spec, maybe_blind=("spikes",))


def _gated_runs(op: OpFamily, spec: OpSpec, layout: str | None) -> set[int]:
    # denormal data is blind on every draw, not some: a and b both lie within 2^16 of bfloat16's
    # smallest normal, so act(a) * b rounds to zero and a zeros output passes; the tail that
    # starts on it always draws the next distribution too
    return {max(validation_runs(op, spec, maybe_blind=("denormal",)))}


def _backward_runs(op: OpFamily, spec: OpSpec, layout: str | None) -> set[int]:
    # pair: denormal data stresses dy, a and b (all shaped alike), and their products round to
    # zero on every draw (each lies within 2^16 of bfloat16's smallest normal): blind, so each
    # tail starting on it always draws once more; concat stresses dy alone (x is twice as wide)
    return {max(validation_runs(op, spec, ("denormal",) if layout == "pair" else ()))}


@dataclass(frozen=True)
class Family:
    """A family (with its constants) as the shared tests run it."""

    id: str
    op: OpFamily
    constants: dict[str, str] = field(default_factory=dict)
    layouts: tuple[str | None, ...] = (None,)  # None: the family has no layout constant
    # The (activation shape, dtype) cases of the config-class runs, in order.
    cases: tuple[tuple[Shape, str], ...] = ()
    # The harness: its target shape (bfloat16), the layouts it runs, the run counts it may return.
    harness_shape: Shape = (9, 200)
    harness_layouts: tuple[str | None, ...] = ()
    harness_runs: Callable[[OpFamily, OpSpec, str | None], set[int]] = _gated_runs

    def spec(self, shape: Shape, dtype: str, layout: str | None) -> OpSpec:
        layout_constant = {} if layout is None else {"layout": layout}
        return self.op.spec(shape, dtype, **layout_constant, **self.constants)

    def activation_shape(self, spec: OpSpec) -> Shape:
        """The shape a spec was made of: the forward's output's (a backward's dy is shaped so)."""
        if self.op.name.endswith("_backward"):
            return spec.inputs[0].shape
        (out,) = self.op.output_specs(spec)
        return out.shape


FAMILIES = {
    f.id: f
    for f in (
        Family("gelu", GELU, cases=rotated(GELU_SHAPES), harness_shape=(5, 200), harness_layouts=(None,),
               harness_runs=_gelu_runs),
        Family("gelu_tanh", GELU_TANH, cases=rotated(GELU_SHAPES), harness_shape=(5, 200), harness_layouts=(None,),
               harness_runs=_gelu_runs),
        Family("swiglu", SWIGLU, layouts=LAYOUTS, cases=rotated(GATED_SHAPES), harness_layouts=LAYOUTS),
        Family("geglu-tanh", GEGLU, {"approximate": "tanh"}, LAYOUTS, rotated(GATED_SHAPES),
               harness_layouts=("concat",)),
        Family("geglu-none", GEGLU, {"approximate": "none"}, LAYOUTS, rotated(GATED_SHAPES), harness_layouts=("pair",)),
        Family("swiglu_backward", SWIGLU_BACKWARD, layouts=LAYOUTS, cases=BACKWARD_CASES,
               harness_layouts=("concat",), harness_runs=_backward_runs),
        Family("geglu_backward-tanh", GEGLU_BACKWARD, {"approximate": "tanh"}, LAYOUTS, BACKWARD_CASES,
               harness_layouts=("pair",), harness_runs=_backward_runs),
        Family("geglu_backward-none", GEGLU_BACKWARD, {"approximate": "none"}, LAYOUTS, BACKWARD_CASES,
               harness_layouts=("concat",), harness_runs=_backward_runs),
    )
}  # fmt: skip


def _params(layouts: Callable[[Family], tuple[str | None, ...]]) -> list[object]:
    """(family, variant, layout) of every family, each variant, each of ``layouts(family)``."""
    return [
        pytest.param(f.id, v.name, layout, id="-".join(filter(None, (f.id, v.name, layout))))
        for f in FAMILIES.values()
        for v in f.op.variants
        for layout in layouts(f)
    ]


def plan(variant: Variant, specs: list[OpSpec]) -> list[tuple[OpSpec, Config]]:
    """(spec, config) runs: each spec once, with the config that adds the most (parameter, value)
    pairs not seen yet, then further runs until every pair of every spec's space has been seen."""
    runs: list[tuple[OpSpec, Config]] = []
    seen: set[tuple[str, object]] = set()
    for spec in specs:
        configs = variant.space(spec).configs()
        assert configs, f"{variant.name} has no config for {spec.describe()}"
        best = max(configs, key=lambda c: len(set(c.items()) - seen))
        runs.append((spec, best))
        seen |= set(best.items())
    for spec in specs:
        for config in variant.space(spec).configs():
            if set(config.items()) - seen:
                runs.append((spec, config))
                seen |= set(config.items())
    return runs


def run_and_check(op: OpFamily, variant: str, spec: OpSpec, config: Config, inputs: tuple[torch.Tensor, ...],
                  what: str) -> list[torch.Tensor]:  # fmt: skip
    """Launch into guarded NaN-filled outputs; every output fully written, nothing past its end,
    the inputs unchanged, and within the family's tolerance of the float64 reference."""
    before = [t.clone() for t in inputs]
    outs, guards = launch_guarded(op, variant, spec, config, inputs)
    assert all(torch.equal(t, b) for t, b in zip(inputs, before, strict=True)), f"{what}: modified its inputs"
    assert_guarded_outputs(op, spec, inputs, outs, guards, [f"output {k}" for k in range(len(outs))], what)
    return outs


# ---- every variant, every config class, small and odd shapes, every dtype ------------------------


@pytest.mark.parametrize(("family", "variant", "layout"), _params(lambda f: f.layouts))
def test_every_config_class_matches_the_reference(family: str, variant: str, layout: str | None, device: str) -> None:
    f = FAMILIES[family]
    op = f.op
    specs = [f.spec(shape, dtype, layout) for shape, dtype in f.cases]
    runs = plan(op.variant(variant), specs)
    for i, (spec, config) in enumerate(runs):
        distribution = op.distributions[i % len(op.distributions)]
        inputs = op.make_inputs(spec, seed=i, distribution=distribution, device=device)
        run_and_check(op, variant, spec, config, inputs, f"{family}/{variant}/{layout} {config.key} "
                      f"{spec.describe()} {distribution}")  # fmt: skip
    # Every value any parameter takes in these spaces was run, on every shape and dtype.
    tested = {(k, v) for _, c in runs for k, v in c.items()}
    possible = {(k, v) for spec in specs for c in op.variant(variant).space(spec) for k, v in c.items()}
    assert tested == possible
    assert {f.activation_shape(s) for s, _ in runs} == {shape for shape, _ in f.cases}
    assert {s.inputs[0].dtype for s, _ in runs} == set(DTYPES)


@pytest.mark.parametrize("variant", ["blocked", "rows", "persistent"])
def test_the_gated_shapes_cover_every_choice(variant: str) -> None:
    """Across GATED_SHAPES the spaces hold every BLOCK, tile and program count the params offer."""
    op = SWIGLU
    values: dict[str, set[object]] = {}
    for shape in GATED_SHAPES:
        for dtype in DTYPES:
            for config in op.variant(variant).space(op.spec(shape, dtype)):
                for k, v in config.items():
                    values.setdefault(k, set()).add(v)
    for param in op.variant(variant).space(op.spec((8, 4096), "bfloat16")).params:
        missing = set(param.choices) - values[param.name]
        assert not missing or param.name == "num_warps", (param.name, missing)
    assert values["num_warps"] >= {2, 4, 8, 16}


# ---- the harness ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("family", "variant", "layout"), _params(lambda f: f.harness_layouts))
def test_every_variant_passes_the_harness(family: str, variant: str, layout: str | None, device: str) -> None:
    f = FAMILIES[family]
    spec = f.spec(f.harness_shape, "bfloat16", layout)
    v = f.op.variant(variant)
    config = v.space(spec).configs()[-1]  # the largest blocks
    runs = validate(f.op, spec, v.build, config, device, lambda: None)
    assert runs in f.harness_runs(f.op, spec, layout), (variant, runs)


# ---- layouts -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("family", "dtype", "pick"),
                         [("swiglu", "float32", 0), ("geglu_backward-none", "bfloat16", -1)])
def test_the_layouts_compute_the_same_function(family: str, dtype: str, pick: int, device: str) -> None:
    """The pair layout's inputs, with a and b concatenated, give bitwise the concat layout's
    outputs (the gradients da and db concatenated, for a backward), in every variant."""
    f = FAMILIES[family]
    pair, concat = f.spec((6, 40), dtype, "pair"), f.spec((6, 40), dtype, "concat")
    inputs = f.op.make_inputs(pair, seed=8, device=device)
    *dy, a, b = inputs
    concat_inputs = (*dy, torch.cat((a, b), dim=-1))
    for variant in f.op.variants:
        config = variant.space(pair).configs()[pick]
        assert config in variant.space(concat)
        pair_outs = run_and_check(f.op, variant.name, pair, config, inputs, f"{family}/{variant.name}/pair")
        (concat_out,) = run_and_check(f.op, variant.name, concat, config, concat_inputs,
                                      f"{family}/{variant.name}/concat")  # fmt: skip
        assert torch.equal(torch.cat(pair_outs, dim=-1), concat_out), variant.name


# ---- the gated families' spaces -------------------------------------------------------------------
@pytest.mark.parametrize(("op", "low"), [(SWIGLU, 130), (SWIGLU_BACKWARD, 100)], ids=["gated", "gated_backward"])
def test_gated_space_sizes_are_modest(op: OpFamily, low: int) -> None:
    for dtype in DTYPES:
        for layout in LAYOUTS:
            spec = op.spec((16384, 8192), dtype, layout=layout)
            sizes = {v.name: len(v.space(spec)) for v in op.variants}
            assert all(size >= 20 for size in sizes.values()), sizes
            assert low <= sum(sizes.values()) <= 200, sizes


@pytest.mark.parametrize(
    ("op", "most", "loaded", "h"),
    [*((GEGLU, 32, 2, h) for h in (1, 3, 64, 125, 4097, 11008)),
     *((GEGLU_BACKWARD, 16, 3, h) for h in (1, 3, 64, 341, 1000, 4097, 14336))],
)  # fmt: skip
def test_every_gated_config_respects_its_budgets(op: OpFamily, most: int, loaded: int, h: int) -> None:
    for dtype in DTYPES:
        spec = op.spec((4, h), dtype, layout="concat")
        itemsize = spec.inputs[0].torch_dtype.itemsize
        for variant in op.variants:
            space = variant.space(spec)
            assert len(space) > 0, (variant.name, h)
            for config in space:
                elements = config.get("BLOCK") or config.get("TILE") or config["BLOCK_M"] * config["BLOCK_N"]
                assert 4 <= elements / (32 * config["num_warps"]) <= most
                assert ("num_stages" in config) == (variant.name == "persistent")  # only loops pipeline
                if variant.name == "rows":
                    assert config["BLOCK_N"] <= max(64, 1 << (h - 1).bit_length())
                if variant.name == "persistent":
                    assert config["PROGRAMS_PER_SM"] * config["num_warps"] <= 64
                    tiles_in_flight = config["PROGRAMS_PER_SM"] * (config["num_stages"] - 1) * loaded
                    assert tiles_in_flight * config["TILE"] * itemsize <= 192 * 1024


@pytest.mark.parametrize(
    ("op", "blocked"),
    [(SWIGLU, Config(BLOCK=256, num_warps=4)),  # no EVICT
     (SWIGLU_BACKWARD, Config(BLOCK=8192, num_warps=1, EVICT=""))],  # 256 a thread
    ids=["gated", "gated_backward"],
)  # fmt: skip
def test_gated_build_rejects_a_config_outside_the_space(op: OpFamily, blocked: Config) -> None:
    spec = op.spec((4, 100), "float32")
    with pytest.raises(ValueError, match="not in the space"):
        op.variant("rows").build(spec, Config(BLOCK_M=1, BLOCK_N=4096, num_warps=4))  # wider than the row
    with pytest.raises(ValueError, match="not in the space"):
        op.variant("blocked").build(spec, blocked)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("op", [SWIGLU, SWIGLU_BACKWARD], ids=["gated", "gated_backward"])
def test_gated_make_inputs_is_deterministic_by_seed(op: OpFamily, layout: str, device: str) -> None:
    spec = op.spec((2, 5, 48), "bfloat16", layout=layout)
    for distribution in op.distributions:
        first = op.make_inputs(spec, seed=11, distribution=distribution, device=device)
        again = op.make_inputs(spec, seed=11, distribution=distribution, device=device)
        other = op.make_inputs(spec, seed=12, distribution=distribution, device=device)
        assert all(torch.equal(p, q) for p, q in zip(first, again, strict=True))
        assert not any(torch.equal(p, q) for p, q in zip(first, other, strict=True))
        assert [tuple(t.shape) for t in first] == [t.shape for t in spec.inputs]
        assert all(t.dtype == torch.bfloat16 and t.is_contiguous() for t in first)
        assert all(t.device.type == torch.device(device).type for t in first)
    with pytest.raises(ValueError, match="distribution"):
        op.make_inputs(spec, seed=0, distribution="cauchy", device=device)


# ---- variants ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "sibling", "names", "uses"),
    [
        (GELU, GELU_TANH, ("blocked", "multi_block", "persistent"), ()),
        # the activations are kernelsmith.ops.gelu's
        (SWIGLU, GEGLU, ("blocked", "rows", "persistent"), ("kernelsmith.ops.gelu",)),
        # and the derivatives, with the forward's activations and concat offsets
        (SWIGLU_BACKWARD, GEGLU_BACKWARD, ("blocked", "rows", "persistent"), ("kernelsmith.ops.gated",
                                                                              "kernelsmith.ops.gelu")),
    ],
    ids=["gelu", "gated", "gated_backward"],
)  # fmt: skip
def test_variants_are_described(op: OpFamily, sibling: OpFamily, names: tuple[str, ...], uses: tuple[str, ...]) -> None:
    assert tuple(v.name for v in op.variants) == names
    assert op.variants is sibling.variants  # one family class, two formulas
    assert len({v.source_hash for v in op.variants}) == len(names)
    assert all(v.summary for v in op.variants)
    for v in op.variants:
        # built by the skeleton; the hash covers the family's module, the skeletons' and the math it calls
        assert inspect.getmodule(v.build) is _elementwise
        assert set(v.modules) == {type(op).__module__, "kernelsmith.ops._rowwise", *uses}
        assert v.source_hash != Variant(v.name, v.summary, v.space, v.build).source_hash


# ---- the real compiler ---------------------------------------------------------------------------


def real_compiler_cases() -> list[tuple[OpFamily, str, OpSpec, Config]]:
    """Every family, layout and variant at the first config of its space (the smallest blocks),
    and GELU's exact form also at the last (the polynomial erf); the dtype rotating over the
    families. Every kernel and constexpr branch of the skeleton and the families' math is lowered."""
    cases = []
    for i, f in enumerate(FAMILIES.values()):
        for layout in f.layouts:
            spec = f.spec((7, 241), DTYPES[i % len(DTYPES)], layout)
            for variant in f.op.variants:
                configs = variant.space(spec).configs()
                picked = {configs[0], configs[-1]} if f.op is GELU else {configs[0]}
                cases += [(f.op, variant.name, spec, c) for c in picked]
    return cases


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the other tests compile for real")
def test_every_variant_compiles_under_the_real_triton_compiler() -> None:
    """The interpreter accepts what the compiler may not (module docstring of real_compiler.py):
    every kernel, as its launchers launch it, is lowered to Triton IR by the real front end."""
    assert_every_kernel_lowers("test_families:real_compiler_cases")
