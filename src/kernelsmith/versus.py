"""Every speedup kernelsmith shows, said against what: the path the user would otherwise run.

A tuning decision (:mod:`kernelsmith.tuner`, :mod:`kernelsmith.decide`) times each candidate
interleaved with the op family's PyTorch reference run *eagerly* in the same worker: its
``speedup`` (with ``ci_low``/``ci_high``) is a speedup over eager PyTorch. For a user who would
otherwise run ``torch.compile``, eager is the wrong yardstick: an RMSNorm 11.7x faster than eager
can tie what Inductor generates. So a speedup is never shown bare: it is shown with the name of
its baseline, and where the record holds no torch.compile time for the workload, the text says
"torch.compile not measured" instead of letting the eager figure pass for a win over it.

A decision's metrics may carry a torch.compile measurement under :data:`COMPILE_KEYS`
(``compile_median_us``, and a paired ``compile_speedup`` with ``compile_ci_low``/``compile_ci_high``
where one was timed interleaved): the tuner measures one on a GPU (``KERNELSMITH_COMPILE_BASELINE``),
so decisions made in the interpreter, or stored before it did, read "vs eager; torch.compile not
measured". Where nothing replaces the user's code (the
baseline won, nothing was tuned), there is no speedup to show, and none is shown.

>>> speedup_text("kernel", {"speedup": 11.7, "ci_low": 11.5, "ci_high": 11.9})
'11.70x vs eager (95% CI 11.50-11.90); torch.compile not measured'
>>> speedup_text("kernel", {"speedup": 11.7, "median_us": 10.0, "compile_median_us": 10.2})
'1.02x vs torch.compile; 11.70x vs eager'
>>> speedup_text("baseline", {"speedup": 0.97})
'none: the baseline (eager PyTorch) is kept'
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

EAGER = "eager"
TORCH_COMPILE = "torch.compile"
COMPILE_NOT_MEASURED = "torch.compile not measured"
NOTHING_REPLACED = "none: the baseline (eager PyTorch) is kept"
COMPILE_KEYS = ("compile_median_us", "compile_speedup", "compile_ci_low", "compile_ci_high")


def _number(metrics: dict[str, Any], key: str) -> float | None:
    value = metrics.get(key)
    return float(value) if isinstance(value, int | float) and math.isfinite(value) and value > 0 else None


@dataclass(frozen=True)
class Versus:
    """A decision's speedups: over eager (always measured) and over torch.compile (None when the
    record holds no torch.compile time), each with its 95% interval where one was computed."""

    replaced: bool  # a kernel won: something replaces the user's code
    eager: float | None
    eager_ci: tuple[float, float] | None
    compile: float | None
    compile_ci: tuple[float, float] | None

    @property
    def against(self) -> str:
        """The best existing path the headline speedup is measured against."""
        return TORCH_COMPILE if self.compile is not None else EAGER

    @property
    def headline(self) -> float | None:
        """The speedup over the best measured path (None where nothing was replaced)."""
        if not self.replaced:
            return None
        return self.compile if self.compile is not None else self.eager

    def text(self, digits: int = 2, ci: bool = True) -> str:
        """The speedup with its baseline named (module docstring)."""
        if not self.replaced:
            return NOTHING_REPLACED
        if self.eager is None and self.compile is None:
            return "-"
        eager = f"{self.eager:.{digits}f}x vs {EAGER}" if self.eager is not None else ""
        if ci and self.eager_ci is not None and eager:
            eager += f" (95% CI {self.eager_ci[0]:.{digits}f}-{self.eager_ci[1]:.{digits}f})"
        if self.compile is None:
            return f"{eager}; {COMPILE_NOT_MEASURED}"
        head = f"{self.compile:.{digits}f}x vs {TORCH_COMPILE}"
        if ci and self.compile_ci is not None:
            head += f" (95% CI {self.compile_ci[0]:.{digits}f}-{self.compile_ci[1]:.{digits}f})"
        return f"{head}; {eager}" if eager else head

    def cell(self, digits: int = 2) -> str:
        """A short table cell: ``"11.70x vs eager"``, ``"1.02x vs torch.compile"`` or ``"none"``."""
        if not self.replaced:
            return "none"
        value = self.headline
        return "-" if value is None else f"{value:.{digits}f}x vs {self.against}"


def versus(winner: str, metrics: dict[str, Any]) -> Versus:
    """The speedups a decision's ``metrics`` record, for a decision whose winner is ``winner``."""
    eager = _number(metrics, "speedup")
    low, high = _number(metrics, "ci_low"), _number(metrics, "ci_high")
    compile_speedup = _number(metrics, "compile_speedup")
    compile_us, median_us = _number(metrics, "compile_median_us"), _number(metrics, "median_us")
    if compile_speedup is None and compile_us is not None and median_us is not None:
        compile_speedup = compile_us / median_us
    c_low, c_high = _number(metrics, "compile_ci_low"), _number(metrics, "compile_ci_high")
    return Versus(
        replaced=winner == "kernel",
        eager=eager,
        eager_ci=(low, high) if low is not None and high is not None else None,
        compile=compile_speedup,
        compile_ci=(c_low, c_high) if c_low is not None and c_high is not None else None,
    )


def speedup_text(winner: str, metrics: dict[str, Any], digits: int = 2, ci: bool = True) -> str:
    """:meth:`Versus.text` of a decision."""
    return versus(winner, metrics).text(digits, ci)


def caption(versions: list[Versus]) -> str:
    """One line under a table of decisions: which baselines its speedups are against ("" if none)."""
    replaced = [v for v in versions if v.replaced]
    if not replaced:
        return ""
    if all(v.compile is None for v in replaced):
        return f"speedups are against eager PyTorch; {COMPILE_NOT_MEASURED} for these workloads"
    if any(v.compile is None for v in replaced):
        return f"speedups are against torch.compile where it was measured, else eager PyTorch ({COMPILE_NOT_MEASURED})"
    return "speedups are against torch.compile"


__all__ = ["COMPILE_KEYS", "COMPILE_NOT_MEASURED", "Versus", "caption", "speedup_text", "versus"]
