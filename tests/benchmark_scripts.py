"""Import a script of ``benchmarks/`` as a module, for tests of its pure parts.

The scripts import their siblings (``_common``, ``record_space``) by plain name, as they do when
run from the command line, so ``benchmarks/`` is on ``sys.path`` while one loads; the module is
registered in ``sys.modules`` first because dataclasses look their module up while it executes.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(script: str) -> ModuleType:
    """``benchmarks/{script}.py`` as the module ``bench_{script}``."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{script}", BENCHMARKS / f"{script}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))
