"""Every kernel of every family lowers when its Python float arguments are typed ``fp64``.

Triton's own launch types a Python float argument (an eps, a softmax scale, a label smoothing, a
soft-cap, RMSNorm's weight offset) as ``fp32``. Under ``kernelsmith::triton_kernel``
(:mod:`kernelsmith.frontends.triton_ops`) Inductor compiles our kernels as user-defined Triton
kernels and types the same argument ``fp64`` (``torch/_inductor/codegen/triton_utils.py``,
``signature_of``). A kernel that multiplies a float32 block by that scalar then computes in
float64, which fails to compile where the type matters (a ``tl.dot`` accumulator, a loop-carried
value that changes type, a bitcast, a float32-only intrinsic) and is slow where it does not.
The kernels cast such a scalar to float32 at their top, which is exactly what Triton's own launch
does to it. This test lowers every variant of every family, at both ends of its space on small
odd shapes in a few dtypes, with Triton's real front end (real_compiler.py, no GPU needed), once
with the float arguments ``fp32`` and once ``fp64``: every kernel must lower both times, and hold
float64 ops (counted in its Triton IR) with fp64 floats exactly where it does with fp32.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from kernelsmith.ops import get_op, op_names
from kernelsmith.ops._base import OpFamily
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec

# name -> (shape, dtype, constants) specs. Every float constant a family takes is set to a value
# that its kernels receive as a float argument (not 0.0, which some turn into a constexpr branch),
# and the constants choosing kernels (forms, reductions, caches, epilogues) vary over the specs.
ROWS = (7, 241)
WIDE = (2, 4097)  # split_row's: rows of more than 8 KB, split over programs
SMOOTH = {"label_smoothing": 0.1}
SPECS: dict[str, tuple[tuple[tuple[int, ...], str, dict[str, Any]], ...]] = {
    "rmsnorm": ((ROWS, "bfloat16", {"weight_offset": 1.0}), (ROWS, "float32", {}), (WIDE, "float16", {})),
    "rmsnorm_backward": ((ROWS, "float16", {"weight_offset": 1.0}), ((3, 5), "float32", {}),
                         (WIDE, "bfloat16", {"weight_offset": 1.0})),
    "add_rmsnorm": ((ROWS, "bfloat16", {"weight_offset": 1.0}), (ROWS, "float32", {}), (WIDE, "bfloat16", {})),
    "add_rmsnorm_backward": ((ROWS, "float16", {"weight_offset": 1.0}), ((3, 5), "float32", {}),
                             (WIDE, "float16", {})),
    "layernorm": (*((ROWS, d, {"affine": a}) for d, a in (("bfloat16", "weight_bias"), ("float32", "weight"),
                                                          ("float16", "none"))), (WIDE, "bfloat16", {})),
    "layernorm_backward": tuple((ROWS, d, {"affine": a}) for d, a in (("bfloat16", "weight_bias"),
                                                                      ("float32", "weight"), ("float16", "none"))),
    "softmax": ((ROWS, "bfloat16", {"scale": 1 / 0.7}), (ROWS, "float32", {}), (WIDE, "float32", {"scale": 0.5})),
    "sum": ((ROWS, "bfloat16", {}), (WIDE, "float32", {})),
    "mean": ((ROWS, "float32", {}), ((2, 3, 5), "float16", {}), (WIDE, "float32", {})),
    "max": ((ROWS, "bfloat16", {}), (WIDE, "float32", {})),
    "gelu": ((ROWS, "bfloat16", {}),),
    "gelu_tanh": ((ROWS, "float16", {}),),
    "swiglu": ((ROWS, "bfloat16", {"layout": "concat"}),),
    "geglu": ((ROWS, "float32", {"approximate": "none"}), (ROWS, "bfloat16", {"approximate": "tanh"})),
    "swiglu_backward": ((ROWS, "bfloat16", {}),),
    "geglu_backward": ((ROWS, "float16", {"approximate": "none"}), (ROWS, "float32", {"approximate": "tanh"})),
    "cross_entropy": tuple((ROWS, d, {"reduction": r, **SMOOTH}) for d, r in (("bfloat16", "mean"),
                                                                              ("float32", "none"),
                                                                              ("float16", "sum"))),
    "cross_entropy_backward": tuple((ROWS, d, {"reduction": r, **SMOOTH}) for d, r in (("bfloat16", "mean"),
                                                                                       ("float32", "none"))),
    "cross_entropy_fused": tuple((ROWS, d, {"reduction": r, **SMOOTH}) for d, r in (("bfloat16", "mean"),
                                                                                    ("float16", "sum"))),
    **{name: (((9, 16, 50), "bfloat16", {"reduction": "mean", "softcap": 30.0, "bias": True, **SMOOTH}),
              ((9, 16, 50), "float32", {"reduction": "none", "softcap": 15.0, **SMOOTH}))
       for name in ("linear_cross_entropy", "linear_cross_entropy_backward", "linear_cross_entropy_fused")},
    "attention": (((1, 2, 7, 32), "bfloat16", {"causal": True}), ((2, 2, 5, 16), "float16", {})),
    "decode_attention": (((2, 4, 37, 32), "bfloat16", {"kv_heads": 2}),
                         ((2, 4, 37, 32), "float32", {"kv_heads": 2, "q_len": 3, "cache": "dynamic"}),
                         ((2, 4, 37, 32), "float16", {"kv_heads": 2, "q_len": 2, "cache": "masked"}),
                         ((2, 4, 37, 32), "bfloat16", {"kv_heads": 2, "write_kv": True})),
    "rope": (((1, 2, 5, 32), "bfloat16", {}), ((1, 2, 5, 32), "float32", {"style": "interleaved"})),
    "matmul": (((9, 40, 72), "bfloat16", {"epilogue": "bias+gelu"}), ((9, 40, 72), "float16", {"epilogue": "swiglu"})),
    "decode_matmul": (((3, 50, 160), "bfloat16", {"epilogue": "bias+gelu"}),
                      ((17, 24, 40), "float16", {"epilogue": "swiglu", "prologue": "rmsnorm", "eps": 1e-5}),
                      ((3, 80, 72), "bfloat16", {"epilogue": "bias+rope", "rope": (3, 1), "prologue": "rmsnorm"})),
}  # fmt: skip


def _configs(op: OpFamily, variant: str, spec: OpSpec) -> list[Config]:
    """The first and the last config of the variant's space for ``spec`` (the smallest and the
    largest blocks, in the spaces' order); none where the space is empty for that spec."""
    configs = op.variant(variant).space(spec).configs()
    return list({c.key: c for c in configs[:1] + configs[-1:]}.values())


def float_scalar_cases() -> list[tuple[OpFamily, str, OpSpec, Config]]:
    """Every variant of every family, on each of its SPECS, at the ends of its space."""
    cases = []
    for name, specs in SPECS.items():
        op = get_op(name)
        for shape, dtype, constants in specs:
            spec = op.spec(shape, dtype, **constants)
            cases += [(op, v.name, spec, c) for v in op.variants for c in _configs(op, v.name, spec)]
    return cases


def _lower(target: str, floats: str) -> dict[str, int]:
    """real_compiler.py on ``target`` with float arguments typed ``floats``: every kernel must
    lower; returns the float64 op count of each kernel specialization that has any."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"REAL_COMPILER_FLOATS": floats}
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("real_compiler.py")), target], env=env,
                          capture_output=True, text=True, timeout=240, check=False)  # fmt: skip
    assert done.returncode == 0 and ", 0 failed" in done.stdout, f"{floats}: {done.stderr[-6000:]}"
    # lines "f64: <variant> <config> <spec>: <kernel>: <count> float64 ops"
    counts = {}
    for line in done.stdout.splitlines():
        if line.startswith("f64: "):
            where, _, count = line.removeprefix("f64: ").rpartition(": ")
            counts[where] = int(count.split()[0])
    return counts


def _assert_float32_math(target: str) -> None:
    """Every kernel lowers with fp32 and with fp64 float arguments, and computes in float64 with
    fp64 floats exactly where it does with fp32 (the cross-entropy losses' deliberate float64 sums)."""
    in_fp32, in_fp64 = _lower(target, "fp32"), _lower(target, "fp64")
    promoted = {k: (in_fp32.get(k, 0), n) for k, n in in_fp64.items() if n != in_fp32.get(k, 0)}
    assert not promoted, "float64 ops (with fp32 floats, with fp64): " + "\n".join(f"{k}: {v}" for k, v in
                                                                              promoted.items())  # fmt: skip


def test_the_cases_cover_every_family_and_variant() -> None:
    """A family added to the registry is added here too, and every variant has a config on some
    spec. (The TMA variants have none in real_compiler.py's process, which has neither the
    interpreter nor a GPU and so no tensor descriptors: their kernels lower on the H200, where
    every test compiles for real.)"""
    assert set(SPECS) == set(op_names())
    covered = {(op.name, variant) for op, variant, _, _ in float_scalar_cases()}
    assert covered == {(name, v.name) for name in op_names() for v in get_op(name).variants}


# As real_compiler.py's other users: it records launchers built on CPU tensors, where no GPU is.
@pytest.mark.skipif(torch.cuda.is_available(), reason="real_compiler.py runs where there is no GPU")
def test_every_kernel_keeps_float32_math_with_fp64_float_scalars() -> None:
    """The real front end lowers every kernel launched by the cases with its float arguments
    typed fp64, as Inductor types them, and into the same float32 math as with fp32 (module docstring)."""
    _assert_float32_math("test_inductor_float_scalars:float_scalar_cases")

