"""Register ``kernelsmith::kernel`` on ``import kernelsmith``, without importing torch for it.

A program exported or compiled with kernelsmith kernels names the op ``kernelsmith::kernel``; the
process that loads it (``torch.export.load``) must have it registered, and ``import kernelsmith``
is what a user can be asked to write. Importing torch takes seconds, and ``import kernelsmith``
is meant to stay instant (the CLI's ``--help``, a settings check). So: when torch is already
imported, the op is registered now (:mod:`kernelsmith.frontends.torch_op` imports only torch);
otherwise a one-shot import hook registers it right after torch's own import finishes, whichever
code imports torch later. No GPU is touched either way.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import logging
import sys
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)

_OP_MODULE = "kernelsmith.frontends.torch_op"


def register_op() -> None:
    """Register the op now if torch is imported, else as soon as it is."""
    if "torch" in sys.modules:
        _import_op()
    elif not any(isinstance(f, _AfterTorch) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTorch())


def _import_op() -> None:
    try:
        importlib.import_module(_OP_MODULE)
    except Exception:  # a torch too old or broken must not make ``import kernelsmith`` fail
        log.warning("kernelsmith could not register its torch.library op", exc_info=True)


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps torch's own loader so the op is registered after it ran."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != "torch":
            return None
        sys.meta_path.remove(self)  # one shot; torch's real finder answers from here on
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _import_op()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
