"""How a decode_matmul spec and config become launches: the decode-only fusions of a spec, the
config spaces of the three variants (with the validity and pruning constraints the module
docstring of :mod:`kernelsmith.ops.decode_matmul` explains, enumerated stage by stage) and their
launchers. The kernels are in :mod:`kernelsmith.ops._decode_matmul_kernels`; the geometry of a
workload is the matmul family's (:mod:`kernelsmith.ops._matmul_launch`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import triton

from kernelsmith.ops._base import Launcher
from kernelsmith.ops._decode_matmul_kernels import _decode_gemv_kernel, _decode_split_k_kernel, _zero_kernel
from kernelsmith.ops._elementwise import checked, multiprocessor_count
from kernelsmith.ops._launch import direct_launch
from kernelsmith.ops._matmul_kernels import _matmul_split_k_reduce_kernel
from kernelsmith.ops._matmul_launch import SHARED_MEMORY_BUDGET, _Geometry, _geometry, _operands, _reduce_tile
from kernelsmith.space import Config, Constraint, Param, Space, next_power_of_two
from kernelsmith.spec import OpSpec, TensorSpec

log = logging.getLogger(__name__)

# =================================================================================================
# Spaces and builders
# =================================================================================================

BLOCKS_M = (1, 2, 4, 8, 16, 32, 64)
DOT_MIN_M = 16  # BLOCK_M from here up multiplies on the tensor cores (tl.dot's smallest block)
BLOCKS_N = (4, 8, 16, 32, 64, 128, 256)
BLOCKS_K = (32, 64, 128, 256, 512, 1024, 2048)
WARPS = (1, 2, 4, 8)
STAGES = (1, 2, 4)
# Partial sums of the CUDA-core loop: one per weight element (1) or one per 16-byte vector (8
# elements of 16 bits, 4 of 32).
FOLDS = (1, 4, 8)
VECTOR_BYTES = 16
SPLITS = (2, 4, 8, 16)
PERSISTENT_SPLITS = (1, 2, 4, 8)
PROGRAMS_PER_SM = (1, 2)
# Who sums a split output block's partials: its last program ("last_program", one launch) or a
# second kernel ("kernel").
REDUCTIONS = ("last_program", "kernel")
ZERO_BLOCK = 1024
# 32-bit registers a thread gives the CUDA-core loop: its float32 partial sums, the weight block it
# loads (two 16-bit elements a register) and its share of the x block.
MAX_FMA_VALUES_PER_THREAD = 128
MAX_ACCUMULATORS_PER_THREAD = 128  # on the tensor cores, as in the matmul family
MIN_LOAD_BYTES = 16  # weight bytes a thread loads a step: one 128-bit vector load at least
# Split-K only pays while the weight-row blocks alone are too few programs to fill the GPU, and up
# to a point: more programs than this a multiprocessor only add partial sums to write and read.
SPLIT_BELOW_PROGRAMS_PER_SM = 4
MAX_SPLIT_PROGRAMS_PER_SM = 16
# Weight bytes a program's step moves at least (for weights of 64 KiB and more): fewer,
# and a multiprocessor cannot hold enough programs to keep ~40 KiB in flight.
MIN_STEP_BYTES = 8192
PRUNING_MULTIPROCESSORS = 132  # an H200's, for pruning where no GPU is present (the interpreter)


# The constant ``weights="qkv"``: the fused QKV projection's weight given as Llama's three tensors
# q_proj, k_proj and v_proj (inputs 1, 2 and 3) instead of their concatenation (decode_matmul's
# docstring). Specs and spaces are those of the concatenated form (_one_weight); only the kernels'
# weight pointers differ (_segment_weight).
WEIGHTS_QKV = "qkv"


def _one_weight(spec: OpSpec) -> OpSpec:
    """A ``weights="qkv"`` spec as the one-weight spec it computes the same output as: the three
    weights replaced by one of their rows together (the geometry, spaces, flops and inputs of the
    concatenated form); any other spec as it is."""
    if spec.constants.get("weights") != WEIGHTS_QKV:
        return spec
    wq, wk, wv = spec.inputs[1:4]
    w = TensorSpec((wq.shape[0] + wk.shape[0] + wv.shape[0], *wq.shape[1:]), wq.dtype)
    constants = {k: v for k, v in spec.constants.items() if k != "weights"}
    return OpSpec(spec.op, (spec.inputs[0], w, *spec.inputs[4:]), constants)


def _decode_geometry(spec: OpSpec) -> _Geometry:
    """The matmul family's geometry of the spec (of its one-weight form: N is all the columns)."""
    return _geometry(_one_weight(spec))


@dataclass(frozen=True)
class _Fusions:
    """The decode-only fusions of a spec (module docstring): the RMSNorm prologue and RoPE."""

    rms: bool
    eps: float
    rope_dim: int  # the head dim when the q and k columns are rotated, else 0
    rope_cols: int  # (heads + kv_heads) * head dim: the columns that rotate (q's and k's)
    extra: int  # the index of the first decode-only input (gamma, then cos and sin)
    # weights="qkv": the first output columns of k's and v's weights (q's start at 0); else 0, 0
    k_start: int = 0
    v_start: int = 0


def _fusions(spec: OpSpec) -> _Fusions:
    rms = spec.constants.get("prologue", "none") == "rmsnorm"
    heads, kv_heads = spec.constants.get("rope", (0, 0))
    n = _decode_geometry(spec).n
    rope_dim = n // (heads + 2 * kv_heads) if heads else 0
    extra = len(spec.inputs) - rms - (2 if heads else 0)
    k_start = v_start = 0
    if spec.constants.get("weights") == WEIGHTS_QKV:
        k_start = spec.inputs[1].shape[0]
        v_start = k_start + spec.inputs[2].shape[0]
    rope_cols = (heads + kv_heads) * rope_dim
    return _Fusions(rms, float(spec.constants.get("eps", 0.0)), rope_dim, rope_cols, extra, k_start, v_start)


def _is_dot(config: Config) -> bool:
    return int(config["BLOCK_M"]) >= DOT_MIN_M


def _validity(g: _Geometry, f: _Fusions, extra: Sequence[Constraint] = ()) -> list[Constraint]:
    """Constraints every config a build accepts satisfies: they look at N, K, the dtype, the
    epilogue and the fusions, never at M, so a config is correct at every row count."""
    widest_n = max(BLOCKS_N[0], next_power_of_two(g.n))
    deepest_k = max(BLOCKS_K[0], next_power_of_two(g.k))
    vector = VECTOR_BYTES // g.itemsize

    def registers_fit(c: Config) -> bool:
        threads = 32 * int(c["num_warps"])
        if _is_dot(c):
            return g.weights * c["BLOCK_M"] * c["BLOCK_N"] <= MAX_ACCUMULATORS_PER_THREAD * threads
        block = c["BLOCK_N"] * c["BLOCK_K"]
        values = g.weights * (c["BLOCK_M"] * block // c["FOLD"] + block * g.itemsize // 4) + c["BLOCK_M"] * c["BLOCK_K"]
        return values <= MAX_FMA_VALUES_PER_THREAD * threads

    def shared_memory_fits(c: Config) -> bool:
        stage = (c["BLOCK_M"] + g.weights * c["BLOCK_N"]) * c["BLOCK_K"] * g.itemsize
        return c["num_stages"] == 1 or c["num_stages"] * stage <= SHARED_MEMORY_BUDGET

    constraints = [
        Constraint("BLOCK_N is no wider than the padded N", lambda c: c["BLOCK_N"] <= widest_n),
        Constraint("BLOCK_K is no deeper than the padded K", lambda c: c["BLOCK_K"] <= deepest_k),
        Constraint(f"tensor-core blocks (BLOCK_M >= {DOT_MIN_M}) are at least 16 weight rows",
                   lambda c: not _is_dot(c) or c["BLOCK_N"] >= 16),
        Constraint(f"FOLD is 1 or one {VECTOR_BYTES}-byte vector ({vector} elements); 1 on the tensor cores",
                   lambda c: c["FOLD"] == 1 or (c["FOLD"] == vector and not _is_dot(c))),
        Constraint(f"the float32 partial sums and the weight block fit in registers "
                   f"({MAX_FMA_VALUES_PER_THREAD} a thread; tensor cores: {MAX_ACCUMULATORS_PER_THREAD} "
                   "accumulators)", registers_fit),
        Constraint(f"num_stages blocks of x and the weight fit in shared memory ({SHARED_MEMORY_BUDGET} bytes)",
                   shared_memory_fits),
        *extra,
    ]  # fmt: skip
    if f.rope_dim:
        constraints.append(Constraint(f"RoPE: a weight-row block lies within one head ({f.rope_dim} a multiple "
                                      "of BLOCK_N)", lambda c: f.rope_dim % c["BLOCK_N"] == 0))  # fmt: skip
    return constraints


def _multiprocessors_for_pruning() -> int:
    return multiprocessor_count() if torch.cuda.is_available() else PRUNING_MULTIPROCESSORS


def _pruning(g: _Geometry, kind: str) -> list[Constraint]:
    """Constraints that only save search time, looking at M: a config they exclude is still
    correct (and accepted by build) at this M. ``kind``: gemv, split_k or persistent."""
    padded = next_power_of_two(g.m)
    fma_m = min(padded, DOT_MIN_M // 2)
    multiprocessors = _multiprocessors_for_pruning()
    # (an eighth of the padded weight, if smaller: a tiny weight still splits)
    step_bytes = min(MIN_STEP_BYTES, next_power_of_two(g.n) * next_power_of_two(g.k) * g.itemsize // 8)
    # split-N programs cover every multiprocessor, where the narrowest weight-row blocks can
    fill = min(multiprocessors, triton.cdiv(g.m, DOT_MIN_M) * triton.cdiv(g.n, BLOCKS_N[0]))
    split_below = SPLIT_BELOW_PROGRAMS_PER_SM * multiprocessors
    most_programs = MAX_SPLIT_PROGRAMS_PER_SM * multiprocessors

    def useful_m(c: Config) -> bool:
        if _is_dot(c):
            return c["BLOCK_M"] <= max(DOT_MIN_M, padded)
        return c["BLOCK_M"] == fma_m

    constraints = [
        Constraint(f"CUDA-core blocks are the padded M (at most {fma_m} rows), tensor-core blocks no taller "
                   "than needed", useful_m),
        Constraint(f"every thread loads at least {MIN_LOAD_BYTES} bytes of weight a step",
                   lambda c: c["BLOCK_N"] * c["BLOCK_K"] * g.itemsize >= MIN_LOAD_BYTES * 32 * c["num_warps"]),
        Constraint(f"a step moves at least {step_bytes} bytes of weight",
                   lambda c: g.weights * c["BLOCK_N"] * c["BLOCK_K"] * g.itemsize >= step_bytes),
    ]  # fmt: skip
    if kind == "gemv":
        constraints.append(Constraint(f"at least {fill} programs (one a multiprocessor, where N allows)",
                                      lambda c: _tiles(g, c) >= fill))  # fmt: skip
    if kind == "split_k":
        constraints.append(Constraint(f"at least {fill} programs (one a multiprocessor, where N allows)",
                                      lambda c: _tiles(g, c, c["SPLIT_K"]) >= fill))  # fmt: skip
    if kind != "gemv":
        constraints += [
            Constraint(f"split K only while the output blocks are fewer than {SPLIT_BELOW_PROGRAMS_PER_SM} a "
                       "multiprocessor", lambda c: c["SPLIT_K"] == 1 or _tiles(g, c) < split_below),
            Constraint(f"split K into at most {MAX_SPLIT_PROGRAMS_PER_SM} tiles a multiprocessor",
                       lambda c: c["SPLIT_K"] == 1 or _tiles(g, c, c["SPLIT_K"]) <= most_programs),
        ]  # fmt: skip
    return constraints


class _StagedSpace(Space):
    """A :class:`~kernelsmith.space.Space` that enumerates its product parameter by parameter,
    dropping a partial config as soon as a constraint that can already be evaluated on it fails
    (one that reads a parameter not chosen yet raises KeyError and waits). The same configs in the
    same order as the plain product filter, which at 10**5 candidates takes seconds a space; every
    survivor is checked again whole. (So a constraint reads parameters as ``c[name]``, never
    ``c.get``, whose default would judge a partial config as if the parameter had it.)"""

    def configs(self) -> tuple[Config, ...]:
        if self._valid is None:
            partial: list[dict[str, Any]] = [{}]
            for param in self.params:
                partial = [grown for values in partial for v in param.choices
                           if self._plausible(grown := {**values, param.name: v})]  # fmt: skip
            whole = (Config(values) for values in partial)
            self._valid = tuple(c for c in whole if all(k.check(c) for k in self.constraints))
        return self._valid

    def _plausible(self, values: dict[str, Any]) -> bool:
        for constraint in self.constraints:
            try:
                if not constraint.check(values):  # type: ignore[arg-type]
                    return False
            except KeyError:
                continue
        return True


def _space(params: list[Param], spec: OpSpec, prune: bool, kind: str, extra: Sequence[Constraint] = ()) -> Space:
    g = _decode_geometry(spec)
    validity = _validity(g, _fusions(spec), extra)
    if prune:
        pruned = _StagedSpace(params, [*validity, *_pruning(g, kind)])
        if pruned.configs():
            return pruned
        # On a small weight the pruning rules can contradict each other (enough programs for every
        # multiprocessor, yet enough weight bytes a step: N=1000, K=129): they only save search
        # time, so the variant is then searched over every valid config rather than offered none.
        log.debug("decode_matmul %s at %s: the pruning rules leave no config; searching every valid one",
                  kind, spec.describe())
    return _StagedSpace(params, validity)


def _block_params() -> list[Param]:
    return [Param("BLOCK_M", BLOCKS_M), Param("BLOCK_N", BLOCKS_N), Param("BLOCK_K", BLOCKS_K),
            Param("FOLD", FOLDS), Param("num_warps", WARPS), Param("num_stages", STAGES)]  # fmt: skip


def _flags(g: _Geometry, f: _Fusions, config: Config) -> dict[str, object]:
    """The compile-time flags every decode kernel takes."""
    block_n, block_k = int(config["BLOCK_N"]), int(config["BLOCK_K"])
    return {
        "HAS_BIAS": g.has_bias,
        "EPILOGUE": g.epilogue,
        "BLOCK_M": int(config["BLOCK_M"]),
        "BLOCK_N": block_n,
        "BLOCK_K": block_k,
        "EVEN_N": g.n % block_n == 0,
        "EVEN_K": g.k % block_k == 0,
        "DOT": _is_dot(config),
        "IEEE": g.ieee,
        "UPCAST": g.upcast,
        "FOLD": int(config["FOLD"]),
        "STAGES": int(config["num_stages"]),
        "RMS": f.rms,
        "ROPE_DIM": f.rope_dim,
        "K_START": f.k_start,
        "V_START": f.v_start,
    }


def _decode_operands(g: _Geometry, f: _Fusions, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """(x, w, w3, bias, residual, gamma, cos, sin, wk, wv), unused pointers standing in as x or w
    (never read). With ``weights="qkv"`` w is q's weight, wk and wv k's and v's."""
    x = inputs[0]
    gamma = inputs[f.extra] if f.rms else x
    cos, sin = (inputs[f.extra + f.rms], inputs[f.extra + f.rms + 1]) if f.rope_dim else (x, x)
    if f.k_start:
        wk, wv = inputs[2], inputs[3]
        return (*_operands(g, inputs[:2]), gamma, cos, sin, wk, wv)
    operands = _operands(g, inputs[: f.extra])
    return (*operands, gamma, cos, sin, operands[1], operands[1])


def _tiles(g: _Geometry, config: Config, splits: int = 1) -> int:
    return triton.cdiv(g.m, int(config["BLOCK_M"])) * triton.cdiv(g.n, int(config["BLOCK_N"])) * splits


def _split_constraints(g: _Geometry, f: _Fusions) -> list[Constraint]:
    return [
        Constraint("every split gets at least one K block", lambda c: c["SPLIT_K"] <= triton.cdiv(g.k, c["BLOCK_K"])),
        Constraint("the matmul family's reduction kernel (REDUCE=kernel) knows no RMSNorm prologue or RoPE",
                   lambda c: c["REDUCE"] == "last_program" or not (f.rms or f.rope_dim)),
    ]  # fmt: skip


# ---- gemv ---------------------------------------------------------------------------------------


def _gemv_space(spec: OpSpec, prune: bool = True) -> Space:
    return _space(_block_params(), spec, prune, "gemv")


def _gemv_build(spec: OpSpec, config: Config) -> Launcher:
    checked(_gemv_space(spec, prune=False), config)
    g, f = _decode_geometry(spec), _fusions(spec)
    flags = _flags(g, f, config)
    kernel = direct_launch(_decode_gemv_kernel, (_tiles(g, config),))
    num_warps, num_stages = int(config["num_warps"]), int(config["num_stages"])

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        x, w, w3, bias, residual, gamma, cos, sin, wk, wv = _decode_operands(g, f, inputs)
        kernel(x, w, w3, wk, wv, bias, residual, gamma, cos, sin, outputs[0], g.m, g.n, g.k, f.eps, f.rope_cols,
               **flags, num_warps=num_warps, num_stages=num_stages)  # fmt: skip

    return launch


# ---- split_k and persistent ---------------------------------------------------------------------


def _split_k_space(spec: OpSpec, prune: bool = True) -> Space:
    params = [*_block_params(), Param("SPLIT_K", SPLITS), Param("REDUCE", REDUCTIONS)]
    return _space(params, spec, prune, "split_k", _split_constraints(_decode_geometry(spec), _fusions(spec)))


def _persistent_space(spec: OpSpec, prune: bool = True) -> Space:
    params = [*_block_params(), Param("SPLIT_K", PERSISTENT_SPLITS), Param("PROGRAMS_PER_SM", PROGRAMS_PER_SM),
              Param("REDUCE", REDUCTIONS[:1])]  # (one launch: a persistent grid is about launches saved)  # fmt: skip
    return _space(params, spec, prune, "persistent",
                  [*_split_constraints(_decode_geometry(spec), _fusions(spec)),
                   _persistent_block_fits(_decode_geometry(spec))])  # fmt: skip


def _persistent_block_fits(g: _Geometry) -> Constraint:
    """Observed on the H200 (Triton 3.6, 2026-12-01): persistent configs whose weight block
    (BLOCK_N x BLOCK_K) is larger than the budget asked for 256-320 KiB of shared memory even at
    num_stages = 1, which the pipelining model exempts, and failed to launch (BLOCK_N 64 or 256,
    BLOCK_K 2048). This bound excludes every failure seen; the compiler's reason is not established."""
    return Constraint(f"a persistent program's weight block fits in shared memory ({SHARED_MEMORY_BUDGET} bytes)",
                      lambda c: c["BLOCK_N"] * c["BLOCK_K"] * g.itemsize <= SHARED_MEMORY_BUDGET)


def _split_k_build(spec: OpSpec, config: Config) -> Launcher:
    checked(_split_k_space(spec, prune=False), config)
    g = _decode_geometry(spec)
    splits = int(config["SPLIT_K"])
    return _split_launcher(g, _fusions(spec), config, splits, _tiles(g, config, splits))


def _persistent_build(spec: OpSpec, config: Config) -> Launcher:
    checked(_persistent_space(spec, prune=False), config)
    g = _decode_geometry(spec)
    splits = int(config["SPLIT_K"])
    programs = min(_tiles(g, config, splits), int(config["PROGRAMS_PER_SM"]) * multiprocessor_count())
    return _split_launcher(g, _fusions(spec), config, splits, programs)


def _split_launcher(g: _Geometry, f: _Fusions, config: Config, splits: int, programs: int) -> Launcher:
    """The split-K kernel on ``programs`` programs, the partials reduced in order (bitwise
    reproducible, see the module docstring) by the last program of each output block
    (``REDUCE="last_program"``: one launch) or by the matmul family's reduction kernel
    (``REDUCE="kernel"``: two launches, no counters)."""
    flags = _flags(g, f, config)
    last_reduces = config["REDUCE"] == "last_program"
    partial_kernel = direct_launch(_decode_split_k_kernel, (programs,))
    reduce_m, reduce_n = _reduce_tile(g.m)
    reduce_grid = (triton.cdiv(g.m, reduce_m), triton.cdiv(g.n, reduce_n))
    reduce_kernel = direct_launch(_matmul_split_k_reduce_kernel, reduce_grid)
    num_warps, num_stages = int(config["num_warps"]), int(config["num_stages"])
    scratch_shape = (g.weights * splits, g.m, g.n)
    # One arrival counter per output block, allocated and zeroed for every call like the partials.
    # A launcher must not keep device memory across calls: under torch.compile's CUDA graphs
    # (mode="reduce-overhead") the first call runs inside the graphs' private memory pool, which
    # reuses the memory of every tensor it does not see returned, so a counter kept from that call
    # would be overwritten by later graphs' tensors, and its resets would write into theirs.
    blocks = _tiles(g, config)
    zero_counters = direct_launch(_zero_kernel, (triton.cdiv(blocks, ZERO_BLOCK),))

    def launch(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        x, w, w3, bias, residual, gamma, cos, sin, wk, wv = _decode_operands(g, f, inputs)
        y = outputs[0]
        partial = y.new_empty(scratch_shape, dtype=torch.float32)  # every element is written
        counter = y  # unused without LAST_REDUCES
        if last_reduces:
            counter = y.new_empty(blocks, dtype=torch.int32)
            zero_counters(counter, blocks, BLOCK=ZERO_BLOCK)
        partial_kernel(x, w, w3, wk, wv, gamma, cos, sin, partial, counter, y, bias, residual, g.m, g.n, g.k, f.eps,
                       f.rope_cols, SPLIT_K=splits, **flags, LAST_REDUCES=last_reduces, num_warps=num_warps,
                       num_stages=num_stages)  # fmt: skip
        if not last_reduces:
            reduce_kernel(partial, y, bias, residual, g.m, g.n, g.n, g.n, SPLIT_K=splits, HAS_BIAS=g.has_bias,
                          EPILOGUE=g.epilogue, BLOCK_M=reduce_m, BLOCK_N=reduce_n, num_warps=4)  # fmt: skip

    return launch

