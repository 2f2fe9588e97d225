"""kernelsmith: search, verify and serve faster Triton kernels for PyTorch code.

>>> import kernelsmith
>>> kernelsmith.ops()
['rmsnorm', 'softmax']

Tune one op ahead of time (on a machine without a GPU, set TRITON_INTERPRET=1 to run the
kernels in the Triton interpreter; its timings are not performance):

>>> x = torch.randn(8192, 4096, dtype=torch.bfloat16, device="cuda")  # doctest: +SKIP
>>> result = kernelsmith.tune("softmax", x, budget=50)                # doctest: +SKIP
>>> result.winner, result.speedup_vs_baseline, result.pct_of_copy_bandwidth  # doctest: +SKIP
('kernel', 1.6, 93.0)

Importing kernelsmith needs no GPU; the engine's modules load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from kernelsmith.tuner import TuneResult


def tune(
    op: str, *example_inputs: Any, budget: int = 50, strategy: str = "random", db: Any = None, **kwargs: Any
) -> TuneResult:
    """Search kernels for ``op`` on the workload of ``example_inputs``; see :mod:`kernelsmith.tuner`."""
    from kernelsmith.tuner import tune as _tune

    return _tune(op, *example_inputs, budget=budget, strategy=strategy, db=db, **kwargs)


def ops() -> list[str]:
    """Names of the op families kernelsmith can tune."""
    from kernelsmith.ops import op_names

    return op_names()


__all__ = ["__version__", "ops", "tune"]
