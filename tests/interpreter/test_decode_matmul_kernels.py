"""The ``decode_matmul`` family (a few rows of x against an nn.Linear weight): every variant and
config class in the Triton interpreter on small and odd shapes against the float64 reference, the
harness, split-K's bitwise reproducibility, specs and spaces.

Kernel outputs are pre-filled with NaN and followed by a NaN guard (a kernel that skips an element
or writes past the end is caught) and compared with the float64 reference under the harness's own
tolerance. Configs come from each variant's *validity* space (what ``build`` accepts at any M), so
that tall blocks run on one row too. The interpreter ignores ``num_warps`` and ``num_stages``, so
the test covers the parameters that change what the kernels compute (block sizes, and with them
CUDA cores or tensor cores, masked or even K and N; the splits; who reduces) and takes the fewest
warps a config allows.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
import torch
from real_compiler_run import assert_every_kernel_lowers

from kernelsmith.evaluate.validate import validate
from kernelsmith.ops import UnsupportedWorkload, get_op
from kernelsmith.ops.decode_matmul import (
    MAX_M,
    OP,
    DecodeMatmul,
    _gemv_space,
    _persistent_space,
    _split_k_space,
)
from kernelsmith.space import Config, Space
from kernelsmith.spec import OpSpec
from kernelsmith.testing.kernels import assert_matches_fp64, assert_source_hash_covers, run_single_output
from kernelsmith.testing.validation_runs import validation_runs

VARIANTS = ("gemv", "split_k", "persistent")
DTYPES = ("bfloat16", "float16", "float32")
EPILOGUES = ("none", "bias", "residual", "bias+residual", "swiglu", "bias+gelu")
# (M, N, K) with M of 1, 3 and 17, N of 1, 7 and 129, K of 1, 33, 257 (and 1025, where 32 splits
# of 32 fit; 4097 for split-K, where 2 splits of 2048 fit): nothing a multiple of a block, so every
# mask and modulo runs; 129 and 257 make the widest blocks (256 and 512) valid. Split-K needs two K
# blocks: no K = 1 there.
SHAPES = ((1, 7, 33), (3, 129, 1), (17, 1, 257), (1, 129, 257), (3, 7, 1025))
SPLIT_SHAPES = ((1, 7, 33), (3, 129, 257), (17, 1, 257), (1, 7, 4097), (3, 1, 33))
# What changes the computed values: everything but num_warps and num_stages.
SEMANTIC = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "FOLD", "SPLIT_K", "REDUCE", "PROGRAMS_PER_SM")
SPACES = {"gemv": _gemv_space, "split_k": _split_k_space, "persistent": _persistent_space}


def validity_space(variant: str, spec: OpSpec) -> Space:
    return SPACES[variant](spec, prune=False)


def semantic(config: Config) -> frozenset[tuple[str, object]]:
    return frozenset((k, v) for k, v in config.items() if k in SEMANTIC)


def interpreter_cost(spec: OpSpec, config: Config) -> float:
    """About how long the interpreter takes: one step per (program, K block), plus the elements."""
    x, w = spec.inputs[0], spec.inputs[1]
    m, (n, k) = x.numel // x.shape[-1], w.shape
    splits = int(config.get("SPLIT_K", 1))
    programs = math.ceil(m / config["BLOCK_M"]) * math.ceil(n / config["BLOCK_N"]) * splits
    steps = programs * math.ceil(math.ceil(k / config["BLOCK_K"]) / splits)
    return steps + steps * config["BLOCK_M"] * config["BLOCK_N"] * config["BLOCK_K"] / 2000


def plan(variant: str, specs: list[OpSpec]) -> list[tuple[OpSpec, Config]]:
    """(spec, config) runs: each spec once, with the cheapest config adding the most
    (parameter, value) pairs not seen yet, then more until every pair of every spec's space has
    been seen. Of configs equal in what they compute, the one with the fewest warps and stages."""
    classes: dict[int, dict[frozenset[tuple[str, object]], Config]] = {}
    for i, spec in enumerate(specs):
        by_class: dict[frozenset[tuple[str, object]], Config] = {}
        for config in validity_space(variant, spec):
            by_class.setdefault(semantic(config), config)  # the product order puts fewer warps first
        assert by_class, f"{variant} has no config for {spec.describe()}"
        classes[i] = by_class
    runs: list[tuple[OpSpec, Config]] = []
    seen: set[tuple[str, object]] = set()

    def pick(i: int) -> Config:
        spec = specs[i]
        return min(classes[i].values(), key=lambda c: (-len(semantic(c) - seen), interpreter_cost(spec, c)))

    for i, spec in enumerate(specs):
        config = pick(i)
        runs.append((spec, config))
        seen |= semantic(config)
    possible = {pair for by_class in classes.values() for cls in by_class for pair in cls}
    while possible - seen:
        i = max(classes, key=lambda j: len(semantic(pick(j)) - seen))
        config = pick(i)
        runs.append((specs[i], config))
        seen |= semantic(config)
    return runs


def run(spec: OpSpec, variant: str, config: Config, inputs: tuple[torch.Tensor, ...], launcher: Any = None) -> Any:
    return run_single_output(OP, spec, variant, config, inputs, launcher)


def assert_matches(spec: OpSpec, inputs: tuple[torch.Tensor, ...], y: torch.Tensor, what: str) -> None:
    assert_matches_fp64(OP, spec, inputs, y, what)


def specs_for(variant: str) -> list[OpSpec]:
    """The shapes in turn, with every epilogue and every dtype among them."""
    shapes = SPLIT_SHAPES if variant != "gemv" else SHAPES
    count = max(len(EPILOGUES), len(shapes))
    pairs = itertools.islice(zip(itertools.cycle(EPILOGUES), itertools.cycle(DTYPES)), count)
    return [OP.spec(shapes[i % len(shapes)], dtype, epilogue=epilogue) for i, (epilogue, dtype) in enumerate(pairs)]


# ---- every variant and config class on small and odd shapes ---------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_config_class_matches_the_reference(variant: str, device: str) -> None:
    specs = specs_for(variant)
    runs = plan(variant, specs)
    for i, (spec, config) in enumerate(runs):
        inputs = OP.make_inputs(spec, seed=i, distribution=OP.distributions[i % len(OP.distributions)], device=device)
        y = run(spec, variant, config, inputs)
        assert_matches(spec, inputs, y, f"{variant} {config.key} {spec.describe()}")
    tested = {pair for _, c in runs for pair in semantic(c)}
    assert tested == {pair for spec in specs for c in validity_space(variant, spec) for pair in semantic(c)}
    assert {c["BLOCK_M"] >= 16 for _, c in runs} == {False, True}  # CUDA cores and tensor cores
    assert {s.inputs[0].dtype for s, _ in runs} == set(DTYPES)
    assert {(s.const("epilogue"), s.const("bias")) for s, _ in runs} >= {("swiglu", False), ("residual", True)}


def test_the_validity_spaces_offer_every_choice() -> None:
    """Across the test shapes every value of every parameter is in some space: no dead choice."""
    for variant in VARIANTS:
        values: dict[str, set[object]] = {}
        for spec in specs_for(variant):
            for config in validity_space(variant, spec):
                for k, v in config.items():
                    values.setdefault(k, set()).add(v)
        for param in validity_space(variant, OP.spec((8, 4096, 4096), "bfloat16")).params:
            assert set(param.choices) == values[param.name], (variant, param.name)


def real_compiler_cases() -> list[tuple[DecodeMatmul, str, OpSpec, Config]]:
    """The cases real_compiler.py lowers: every variant's plan above, and on each of its test specs
    the smallest and the largest blocks of the CUDA-core and of the tensor-core configs."""
    cases = []
    for variant in VARIANTS:
        specs = specs_for(variant)
        cases += [(OP, variant, spec, config) for spec, config in plan(variant, specs)]
        for spec in specs:
            configs = validity_space(variant, spec).configs()
            for dot in (False, True):
                sized = sorted((c for c in configs if (c["BLOCK_M"] >= 16) == dot),
                               key=lambda c: (c["BLOCK_M"] * c["BLOCK_N"] * c["BLOCK_K"], c.key))  # fmt: skip
                ends = {c.key: c for c in sized[:1] + sized[-1:]}  # (none on the tensor cores where N < 16)
                cases += [(OP, variant, spec, c) for c in ends.values()]
        for shape, constants in FUSED:
            spec = OP.spec(shape, "bfloat16", **constants)
            cases += [(OP, variant, spec, c) for c in fused_configs(variant, spec)]
    return cases


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU every other test here compiles for real")
def test_every_config_class_compiles_under_the_real_triton_compiler() -> None:
    """The interpreter accepts kernels the compiler rejects (numpy broadcasting; it stops at a
    return inside an ``if`` on a constexpr, the compiler compiles on past it): the kernels of each
    variant's config classes are lowered to Triton IR by the installed Triton's real front end, in
    a process without the interpreter. A GPU is not needed for that."""
    assert_every_kernel_lowers("test_decode_matmul_kernels:real_compiler_cases")


# ---- split-K: the order of the sum -----------------------------------------------------------------


def test_split_k_is_bitwise_reproducible_and_the_same_whoever_reduces(device: str) -> None:
    """K = 160 is 5 blocks of 32: 4 splits take 2, 2, 1 and 0 blocks (the last stores zeros). The
    partials are summed in the same order by the last program and by the reduction kernel, and by
    persistent's last program, so all three agree bitwise; the same launcher runs three times (the
    arrival counters must be reset)."""
    spec = OP.spec((3, 50, 160), "bfloat16", epilogue="swiglu")
    inputs = OP.make_inputs(spec, seed=5, distribution="outliers", device=device)
    results = {}
    for variant, reduce, extra in (("split_k", "last_program", {}), ("split_k", "kernel", {}),
                                   ("persistent", "last_program", {"PROGRAMS_PER_SM": 1})):  # fmt: skip
        config = Config(BLOCK_M=4, BLOCK_N=16, BLOCK_K=32, FOLD=1, num_warps=4, num_stages=1, SPLIT_K=4,
                        REDUCE=reduce, **extra)  # fmt: skip
        assert config in validity_space(variant, spec)
        launcher = OP.variant(variant).build(spec, config)
        first = run(spec, variant, config, inputs, launcher)
        assert_matches(spec, inputs, first, f"{variant} REDUCE={reduce}")
        for _ in range(2):
            assert torch.equal(first, run(spec, variant, config, inputs, launcher))
        results[variant, reduce] = first
    assert all(torch.equal(r, results["split_k", "kernel"]) for r in results.values())


def _tensors_held(obj: Any, depth: int = 0) -> list[torch.Tensor]:
    """Tensors a launcher keeps: in its closure's cells, through dicts, lists and tuples."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if depth > 3:
        return []
    if isinstance(obj, dict):
        return [t for value in obj.values() for t in _tensors_held(value, depth + 1)]
    if isinstance(obj, (list, tuple)):
        return [t for value in obj for t in _tensors_held(value, depth + 1)]
    cells = getattr(obj, "__closure__", None) or ()
    return [t for cell in cells for t in _tensors_held(cell.cell_contents, depth + 1)]


@pytest.mark.parametrize("variant", ["split_k", "persistent"])
def test_split_k_launchers_keep_no_device_memory_between_calls(variant: str) -> None:
    """The arrival counters are made (and zeroed) per call, as the partials are: under torch.compile's
    CUDA graphs the first call runs in the graphs' memory pool, which reuses the memory of every
    tensor it does not see returned, so a launcher must not keep one from a call to the next."""
    spec = OP.spec((3, 50, 160), "bfloat16")
    inputs = OP.make_inputs(spec, seed=1, distribution="normal", device="cpu")
    extra = {"PROGRAMS_PER_SM": 1} if variant == "persistent" else {}
    config = Config(BLOCK_M=4, BLOCK_N=16, BLOCK_K=32, FOLD=1, num_warps=4, num_stages=1, SPLIT_K=4,
                    REDUCE="last_program", **extra)  # fmt: skip
    launcher = OP.variant(variant).build(spec, config)
    first = run(spec, variant, config, inputs, launcher)
    assert_matches(spec, inputs, first, variant)
    assert _tensors_held(launcher) == []
    assert torch.equal(first, run(spec, variant, config, inputs, launcher))


def test_persistent_programs_walk_several_tiles(device: str) -> None:
    """K = 300 is 10 blocks of 32. 3 row blocks of 8 x 10 blocks of 4 weight rows x 8 splits (of 2
    blocks; the last 3 empty) is 240 tiles for 4 programs (the interpreter's 4 stand-in SMs); then
    2 row blocks of 16 on the tensor cores x 3 blocks of 16 weight rows x 2 splits of 5 blocks."""
    spec = OP.spec((17, 40, 300), "float16", epilogue="bias+residual")
    inputs = OP.make_inputs(spec, seed=2, device=device)
    for block_m, block_n, splits in ((8, 4, 8), (16, 16, 2)):
        config = Config(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=32, FOLD=1, num_warps=4, num_stages=1,
                        SPLIT_K=splits, PROGRAMS_PER_SM=1, REDUCE="last_program")  # fmt: skip
        assert config in validity_space("persistent", spec)
        assert_matches(spec, inputs, run(spec, "persistent", config, inputs), f"persistent {config.key}")


# ---- the decode fusions: RMSNorm prologue, RoPE epilogue ------------------------------------------

# (shape, constants): RoPE on a fused QKV output of 3 query heads and 1 key/value head of 16 (N = 80;
# blocks of 4 to 16 rows, up to four a head), then with a bias and the RMSNorm prologue, RMSNorm before SwiGLU
# and before the residual add; M of 1, 3 and 17, K not a multiple of any block.
FUSED = (
    ((1, 80, 33), {"epilogue": "rope", "rope": (3, 1)}),
    ((3, 80, 72), {"epilogue": "bias+rope", "rope": (3, 1), "prologue": "rmsnorm"}),
    ((17, 24, 40), {"epilogue": "swiglu", "prologue": "rmsnorm", "eps": 1e-5}),
    ((1, 24, 257), {"epilogue": "residual", "prologue": "rmsnorm"}),
    ((3, 96, 65), {"epilogue": "rope", "rope": (4, 1), "prologue": "rmsnorm"}),
)


def fused_configs(variant: str, spec: OpSpec) -> list[Config]:
    """The cheapest config of each (CUDA or tensor cores, FOLD, split or not) class of the validity
    space: the choices that change the code the fusions run through."""
    by_class: dict[tuple[object, ...], Config] = {}
    for c in sorted(validity_space(variant, spec), key=lambda c: interpreter_cost(spec, c)):
        by_class.setdefault((c["BLOCK_M"] >= 16, c["FOLD"], c.get("SPLIT_K", 1) > 1), c)
    return list(by_class.values())


@pytest.mark.parametrize("variant", VARIANTS)
def test_fused_prologue_and_rope_match_float64(variant: str, device: str) -> None:
    for i, (shape, constants) in enumerate(FUSED):
        dtype = DTYPES[i % len(DTYPES)]
        spec = OP.spec(shape, dtype, **constants)
        configs = fused_configs(variant, spec)
        assert {c["BLOCK_M"] >= 16 for c in configs} == {False, True}
        inputs = OP.make_inputs(spec, seed=i, device=device)
        for config in configs:
            y = run(spec, variant, config, inputs)
            assert_matches(spec, inputs, y, f"{variant} {config.key} {spec.describe()}")


def test_the_references_are_hugging_faces_modules() -> None:
    """RMSNorm, the projection and RoPE as Llama's modules compute them, in float64."""
    spec = OP.spec((2, 96, 64), "float32", epilogue="rope", rope=(4, 1), prologue="rmsnorm", eps=1e-5)
    x, w, gamma, cos, sin = (t.double() for t in OP.make_inputs(spec, seed=3, device="cpu"))
    (y,) = OP.reference_fp64(spec, (x, w, gamma, cos, sin))
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * gamma
    q, k, v = torch.nn.functional.linear(normed, w).split([64, 16, 16], dim=-1)

    def rope(t: torch.Tensor) -> torch.Tensor:  # Hugging Face's apply_rotary_pos_emb, one token per row
        t = t.view(2, -1, 16)
        half = torch.cat((-t[..., 8:], t[..., :8]), dim=-1)
        return (t * cos[:, None] + half * sin[:, None]).reshape(2, -1)

    assert torch.allclose(y, torch.cat((rope(q), rope(k), v), dim=-1))
    assert torch.allclose(cos[:, :8], cos[:, 8:]) and torch.allclose(cos.pow(2) + sin.pow(2), torch.ones_like(cos))


@pytest.mark.parametrize(
    ("constants", "match"),
    [({"epilogue": "rope", "rope": (5, 1)}, "split"), ({"epilogue": "rope"}, "go together"),
     ({"epilogue": "swiglu", "rope": (3, 1)}, "go together"), ({"prologue": "layernorm"}, "prologue"),
     ({"epilogue": "residual+rope", "rope": (3, 1)}, "no other epilogue"),
     ({"epilogue": "rope", "rope": (1, 1)}, "multiple")],
    ids=["heads-do-not-split-N", "rope-without-heads", "heads-without-rope", "unknown-prologue",
         "rope-and-residual", "odd-head-dim"],
)  # fmt: skip
def test_refuses_fusions_it_does_not_know(constants: dict[str, object], match: str) -> None:
    shape = (1, 30 if constants.get("rope") == (1, 1) else 60, 32)
    with pytest.raises(UnsupportedWorkload, match=match):
        OP.spec(shape, "bf16", **constants)


def test_fused_specs_take_the_fused_tensors_and_keep_plain_specs_as_they_were() -> None:
    spec = OP.spec((2, 3, 3072, 2048), "bf16", epilogue="rope", rope=(32, 8), prologue="rmsnorm")
    assert [t.shape for t in spec.inputs] == [(2, 3, 2048), (3072, 2048), (2048,), (2, 3, 64), (2, 3, 64)]
    x, w = torch.zeros(2, 3, 2048, dtype=torch.bfloat16), torch.zeros(3072, 2048, dtype=torch.bfloat16)
    gamma, cos = torch.zeros(2048, dtype=torch.bfloat16), torch.zeros(2, 3, 64, dtype=torch.bfloat16)
    assert OP.spec_for(x, w, gamma, cos, cos, epilogue="rope", rope=(32, 8), prologue="rmsnorm") == spec
    bucket = OP.bucket(spec)  # 6 rows -> 8, cos and sin with them
    assert [t.shape for t in bucket.inputs] == [(8, 2048), (3072, 2048), (2048,), (8, 64), (8, 64)]
    tails = OP.validation_specs(spec)
    assert [math.prod(s.inputs[0].shape[:-1]) for s in tails] == [6, 1, 5]
    assert all(s.inputs[-1].shape[:-1] == s.inputs[0].shape[:-1] for s in tails)  # cos and sin follow x
    assert OP.stressed_inputs(spec) == (0,)
    assert "prologue" not in OP.spec((1, 2048, 2048), "bf16").constants  # stored decisions' specs unchanged


# ---- the harness ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("epilogue", "dtype", "fused"), [
    ("residual", "bfloat16", {}), ("swiglu", "float16", {"prologue": "rmsnorm"}), ("bias", "float32", {}),
    ("rope", "bfloat16", {"rope": (1, 1), "prologue": "rmsnorm"})])  # fmt: skip
def test_one_config_of_each_variant_passes_the_harness(
    epilogue: str, dtype: str, fused: dict[str, object], device: str
) -> None:
    spec = OP.spec((5, 24, 72), dtype, epilogue=epilogue, **fused)
    for variant in OP.variants:
        config = min(variant.space(spec).configs(), key=lambda c: interpreter_cost(spec, c))
        # the target on every distribution (the family's own, and the stress data its two tails, 1
        # and 4 rows, do not take), each tail on one, two runs apiece
        assert {validate(OP, spec, variant.build, config, device, lambda: None)} == validation_runs(OP, spec)


# ---- specs and spaces ----------------------------------------------------------------------------


def test_spec_is_matmuls_at_decode_shapes() -> None:
    assert get_op("decode_matmul") is OP and isinstance(OP, DecodeMatmul)
    spec = OP.spec((1, 2048, 8192), "bf16", epilogue="residual")
    assert spec.op == "decode_matmul"
    assert [t.shape for t in spec.inputs] == [(1, 8192), (2048, 8192), (1, 2048)]
    assert dict(spec.constants) == dict(get_op("matmul").spec((1, 2048, 8192), "bf16", epilogue="residual").constants)
    x, w = torch.zeros(2, 3, 16, dtype=torch.float16), torch.zeros(24, 16, dtype=torch.float16)
    assert OP.spec_for(x, w) == OP.spec((2, 3, 24, 16), "fp16")
    assert OP.spec_for(torch.zeros(16), torch.zeros(8, 16)).inputs[0].shape == (16,)  # a 1-D x is one row
    assert OP.output_specs(OP.spec((MAX_M, 24, 16), "fp32"))[0].shape == (MAX_M, 24)
    # tuned in power-of-two row buckets, validated on fewer rows
    assert OP.bucket(OP.spec((17, 24, 16), "bf16")).inputs[0].shape == (32, 16)
    assert [s.inputs[0].shape[0] for s in OP.validation_specs(OP.spec((17, 24, 16), "bf16"))] == [17, 1, 7, 16]


@pytest.mark.parametrize(
    ("shape", "constants"),
    [((MAX_M + 1, 24, 16), {}), ((2, 40, 24, 16), {}), ((1, 24, 16), {"layout": "matmul"}),
     ((1, 24, 16), {"epilogue": "relu"})],
    ids=["65-rows", "80-rows", "matmul-layout", "relu"],
)  # fmt: skip
def test_refuses_what_is_not_a_decode_projection(shape: tuple[int, ...], constants: dict[str, str]) -> None:
    with pytest.raises(UnsupportedWorkload):
        OP.spec(shape, "bf16", **constants)


def test_pruned_spaces_at_llama_decode_shapes() -> None:
    """At M = 1 and 8 on the projections of Llama-3.2-1B and Llama-3-8B every variant has configs
    on the tensor cores (16 rows; but gemv where 16-row weight blocks are too few programs to fill
    the GPU) and on the CUDA cores (BLOCK_M the padded M; SwiGLU at 8 rows too, its partial sums
    folded by 16-byte vectors); and each is valid (build accepts it)."""
    for m, (n, k) in itertools.product((1, 8), ((2048, 8192), (128256, 2048), (14336, 4096))):
        epilogue = "swiglu" if n == 14336 else "none"
        spec = OP.spec((m, n, k), "bf16", epilogue=epilogue)
        for variant in OP.variants:
            space = variant.space(spec)
            expected = {m, 16}
            if variant.name == "gemv" and n // 16 < 132:  # 16-row blocks: fewer programs than an H200's SMs
                expected -= {16}
            assert {c["BLOCK_M"] for c in space} == expected, (variant.name, m, n, k)
            valid = validity_space(variant.name, spec)
            assert all(c in valid for c in space.configs()[:: max(1, len(space) // 50)])


@pytest.mark.parametrize("shape", [(3, 1000, 129), (1, 7, 5), (64, 24, 40), (17, 300, 33)])
def test_every_variant_offers_configs_on_small_odd_weights(shape: tuple[int, int, int]) -> None:
    """On a small odd weight the pruning rules can contradict each other (enough programs for every
    multiprocessor, yet enough weight bytes a step: on the H200 gemv and split_k offered no config
    at 3 x 1000 x 129): a variant then falls back to every valid config, never to none. (split_k
    has nothing to split where K fits one block: no valid config there, and none offered.)"""
    spec = OP.spec(shape, "bf16")
    for variant in OP.variants:
        configs = variant.space(spec).configs()
        valid = validity_space(variant.name, spec)
        assert bool(configs) == bool(valid.configs()), (variant.name, shape)
        assert configs or variant.name == "split_k", (variant.name, shape)
        assert all(c in valid for c in configs[:: max(1, len(configs) // 50)])


def test_the_source_hash_covers_every_module_a_variant_runs() -> None:
    """The family's kernels and launchers, and the matmul family's dot, epilogue, reduction kernel,
    geometry and specs it borrows (with the activations of kernelsmith.ops.gelu): a change in any
    of them re-validates stored decode decisions."""
    assert_source_hash_covers(OP, ["kernelsmith.ops._decode_matmul_kernels", "kernelsmith.ops._decode_matmul_launch",
                                   "kernelsmith.ops.decode_matmul", "kernelsmith.ops._matmul_kernels",
                                   "kernelsmith.ops._matmul_launch", "kernelsmith.ops.matmul",
                                   "kernelsmith.ops.gelu"])  # fmt: skip
    assert len({v.source_hash for v in OP.variants}) == len(OP.variants)
