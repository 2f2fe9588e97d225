"""Kernel files under compiled Triton: the files of tests/test_kernel_file.py, loaded in their
restricted namespace, compile and compute the op on a GPU (the interpreter runs the same bodies
as Python; compiled Triton takes builtins from its own table and needs nothing more), directly
and through GPU workers."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch

from kernelsmith.evaluate.errors import check_close
from kernelsmith.evaluate.kernel_file import parse_kernel_file
from kernelsmith.evaluate.pool import Evaluator
from kernelsmith.evaluate.protocol import Candidate
from kernelsmith.ops import get_op

pytestmark = pytest.mark.gpu


def _cases() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "test_kernel_file.py"
    spec = importlib.util.spec_from_file_location("kernel_file_cases", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CASES = _cases()
FILES = {"rmsnorm": ("rmsnorm", CASES.RMSNORM_FILE), "softmax": ("softmax", CASES.SOFTMAX_FILE),
         "two_launch": ("rmsnorm", CASES.TWO_LAUNCH_FILE)}


@pytest.mark.parametrize("name", list(FILES))
@pytest.mark.parametrize("shape, dtype", [((4096, 4096), "bfloat16"), ((3, 1000), "float32"), ((17, 7), "float16")])
def test_kernel_files_compile_and_compute(name: str, shape: tuple[int, int], dtype: str) -> None:
    op_name, source = FILES[name]
    op = get_op(op_name)
    kernel_file = parse_kernel_file(source)
    spec = op.spec(shape, dtype)
    configs = kernel_file.space(spec).configs()
    assert configs
    for config in (configs[0], configs[-1]):
        launcher = kernel_file.build(spec, config)
        inputs = op.make_inputs(spec, seed=1, distribution=op.distributions[0], device="cuda")
        for _ in range(3):  # the first call goes through Triton, later ones launch directly
            outputs = [torch.full(t.shape, float("nan"), dtype=t.torch_dtype, device="cuda")
                       for t in op.output_specs(spec)]
            launcher(inputs, outputs)
            torch.cuda.synchronize()
            for out, ref64, lowp in zip(outputs, op.reference_fp64(spec, inputs), op.reference(spec, inputs),
                                        strict=True):
                assert check_close(out, ref64, lowp, op.tolerance) is None, (spec.describe(), config)


def test_a_kernel_file_is_timed_by_gpu_workers() -> None:
    spec = get_op("rmsnorm").spec((4096, 4096), "bfloat16")
    kernel_file = parse_kernel_file(CASES.RMSNORM_FILE)
    config = kernel_file.space(spec).configs()[-1]
    with Evaluator("gpu", workers=1) as evaluator:
        (result,) = evaluator.evaluate(spec, [Candidate("doc_rmsnorm", config, CASES.RMSNORM_FILE)])
    assert result.status == "ok", result.error
    assert result.metrics["timer"] == "cuda-events" and result.metrics["median_us"] > 0
