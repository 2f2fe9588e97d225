"""kernelsmith: search, verify and serve faster Triton kernels for PyTorch code.

>>> import kernelsmith
>>> 'rmsnorm' in kernelsmith.op_families()
True

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

Importing kernelsmith needs no GPU; the engine's modules load on first use. The public functions
are the engine's own (``kernelsmith.tune`` *is* :func:`kernelsmith.tuner.tune`, with its
signature and documentation), loaded when first looked up. ``kernelsmith.ops`` is the package of
op families; :func:`op_families` lists their names. Every exception kernelsmith raises on purpose
derives from :class:`KernelsmithError`. ``KERNELSMITH_LOG=info`` shows the package's logs on
standard error, from Python as from the command line (:mod:`kernelsmith.logs`).
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

from kernelsmith import settings as _settings
from kernelsmith.exceptions import KernelsmithError
from kernelsmith.logs import configure_from_environment

__version__ = "0.1.0"

# KERNELSMITH_INTERPRET=1 asks for kernels on CPU tensors through the Triton interpreter. Triton
# reads TRITON_INTERPRET when a kernel is defined, so it is set here, before any op module loads;
# it is never switched on without the user asking (a value that is not true or false is an error
# naming the variable, as for every setting: kernelsmith.settings).
if _settings.get("KERNELSMITH_INTERPRET"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

configure_from_environment()  # KERNELSMITH_LOG: a handler on the "kernelsmith" logger, never on the root

# The torch.library op kernelsmith's compiled and exported programs call: registered now if torch
# is imported, else right after it is (so torch.export.load finds it), without importing torch.
from kernelsmith.frontends.register import register_op  # noqa: E402

register_op()

if TYPE_CHECKING:  # what the lazy names below resolve to, for type checkers and editors
    from kernelsmith import ops as ops
    from kernelsmith.agent import WorkspaceError as WorkspaceError
    from kernelsmith.db import BrokenDatabaseError as BrokenDatabaseError
    from kernelsmith.db import DatabaseError as DatabaseError
    from kernelsmith.evaluate.executor import ExecutorUnavailable as ExecutorUnavailable
    from kernelsmith.evaluate.kernel_file import KernelFileError as KernelFileError
    from kernelsmith.frontends.backend import KernelsmithBackend as backend
    from kernelsmith.frontends.decorator import optimize as optimize
    from kernelsmith.llm import LLMError as LLMError
    from kernelsmith.ops import UnknownOpError as UnknownOpError
    from kernelsmith.ops import UnsupportedWorkload as UnsupportedWorkload
    from kernelsmith.settings import SettingError as SettingError
    from kernelsmith.tuner import NotTunedError as NotTunedError
    from kernelsmith.tuner import TuneResult as TuneResult
    from kernelsmith.tuner import tune as tune
    from kernelsmith.whole_model.decode import cuda_graph as cuda_graph
    from kernelsmith.whole_model.optimize import optimize_model as optimize_model

# Public name -> "module:attribute", imported on first use (module __getattr__, PEP 562) so that
# ``import kernelsmith`` stays light and each name is the real object, signature included:
# ``optimize`` (the decorator), ``tune`` (ahead of time), ``optimize_model`` (a whole model),
# ``backend`` (a torch.compile backend with options: ``backend=kernelsmith.backend(db="runs.db")``;
# ``backend="kernelsmith"`` is the same with defaults), the result and the exceptions.
_LAZY: dict[str, str] = {
    "tune": "kernelsmith.tuner:tune",
    "optimize": "kernelsmith.frontends.decorator:optimize",
    "optimize_model": "kernelsmith.whole_model.optimize:optimize_model",
    "backend": "kernelsmith.frontends.backend:KernelsmithBackend",
    "cuda_graph": "kernelsmith.whole_model.decode:cuda_graph",
    "TuneResult": "kernelsmith.tuner:TuneResult",
    "NotTunedError": "kernelsmith.tuner:NotTunedError",
    "UnsupportedWorkload": "kernelsmith.ops:UnsupportedWorkload",
    "UnknownOpError": "kernelsmith.ops:UnknownOpError",
    "DatabaseError": "kernelsmith.db:DatabaseError",
    "BrokenDatabaseError": "kernelsmith.db:BrokenDatabaseError",
    "SettingError": "kernelsmith.settings:SettingError",
    "ExecutorUnavailable": "kernelsmith.evaluate.executor:ExecutorUnavailable",
    "KernelFileError": "kernelsmith.evaluate.kernel_file:KernelFileError",
    "WorkspaceError": "kernelsmith.agent:WorkspaceError",
    "LLMError": "kernelsmith.llm:LLMError",
}


def __getattr__(name: str) -> Any:
    if name == "ops":  # the subpackage, also when looked up before anything imported it
        return importlib.import_module("kernelsmith.ops")
    if name not in _LAZY:
        raise AttributeError(f"module 'kernelsmith' has no attribute {name!r}")
    module, attribute = _LAZY[name].split(":")
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # looked up once
    return value


def op_families() -> list[str]:
    """Names of the op families kernelsmith can tune (``kernelsmith.ops.op_names()``; ``kernelsmith
    ops`` on the command line shows how ``--shape`` maps to each one's inputs)."""
    from kernelsmith.ops import op_names

    return op_names()


__all__ = [
    "BrokenDatabaseError", "DatabaseError", "ExecutorUnavailable", "KernelFileError", "KernelsmithError",
    "LLMError", "NotTunedError", "SettingError", "TuneResult", "UnknownOpError", "UnsupportedWorkload",
    "WorkspaceError",
    "__version__", "backend", "cuda_graph", "op_families", "optimize", "optimize_model", "tune",
]  # fmt: skip
