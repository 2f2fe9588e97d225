"""kernelsmith: search, verify and serve faster Triton kernels for PyTorch code.

>>> import kernelsmith
>>> kernelsmith.ops()[:4]
['add_rmsnorm', 'cross_entropy', 'geglu', 'gelu']

Decorate the function you already wrote; calls on CUDA tensors tune once, store the winner, and
run it from then on (falling back to your function wherever a kernel does not win):

>>> @kernelsmith.optimize(budget=50)
... def softmax(x):
...     return torch.softmax(x, dim=-1)

Tune one op ahead of time (on a machine without a GPU, set TRITON_INTERPRET=1 to run the
kernels in the Triton interpreter; its timings are not performance):

>>> x = torch.randn(8192, 4096, dtype=torch.bfloat16, device="cuda")  # doctest: +SKIP
>>> result = kernelsmith.tune("softmax", x, budget=50)                # doctest: +SKIP
>>> result.winner, result.speedup_vs_baseline, result.pct_of_copy_bandwidth  # doctest: +SKIP
('kernel', 1.6, 93.0)

Importing kernelsmith needs no GPU; the engine's modules load on first use.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from kernelsmith import settings as _settings

__version__ = "0.1.0"

# KERNELSMITH_INTERPRET=1 asks for kernels on CPU tensors through the Triton interpreter. Triton
# reads TRITON_INTERPRET when a kernel is defined, so it is set here, before any op module loads;
# it is never switched on without the user asking (a value that is not true or false is an error
# naming the variable, as for every setting: kernelsmith.settings).
if _settings.get("KERNELSMITH_INTERPRET"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The torch.library op kernelsmith's compiled and exported programs call: registered now if torch
# is imported, else right after it is (so torch.export.load finds it), without importing torch.
from kernelsmith.frontends.register import register_op  # noqa: E402

register_op()

if TYPE_CHECKING:
    from kernelsmith.tuner import TuneResult


def tune(
    op: str, *example_inputs: Any, budget: int = 50, strategy: str = "auto", db: Any = None, **kwargs: Any
) -> TuneResult:
    """Search kernels for ``op`` on the workload of ``example_inputs``; see :mod:`kernelsmith.tuner`."""
    from kernelsmith.tuner import tune as _tune

    return _tune(op, *example_inputs, budget=budget, strategy=strategy, db=db, **kwargs)


def optimize(fn: Any = None, **options: Any) -> Any:
    """Decorate a function so its calls run a tuned kernel where one wins; see
    :mod:`kernelsmith.frontends.decorator`. Use as ``@optimize`` or ``@optimize(budget=50)``."""
    from kernelsmith.frontends.decorator import optimize as _optimize

    return _optimize(fn, **options)


def optimize_model(model: Any, example_inputs: Any, **options: Any) -> tuple[Any, dict[str, Any]]:
    """Profile a model, tune its top ops within ``budget``, return ``(compiled_model, report)``;
    see :mod:`kernelsmith.whole_model.optimize`."""
    from kernelsmith.whole_model.optimize import optimize_model as _optimize_model

    return _optimize_model(model, example_inputs, **options)


def backend(**options: Any) -> Any:
    """A ``torch.compile`` backend with options (``tune``, ``budget``, ``db``...):
    ``torch.compile(model, backend=kernelsmith.backend(db="runs.db"))``; see
    :mod:`kernelsmith.frontends.backend`. ``backend="kernelsmith"`` is the same with defaults."""
    from kernelsmith.frontends.backend import backend as _backend

    return _backend(**options)


def ops() -> list[str]:
    """Names of the op families kernelsmith can tune."""
    from kernelsmith.ops import op_names

    return op_names()


__all__ = ["__version__", "backend", "ops", "optimize", "optimize_model", "tune"]
