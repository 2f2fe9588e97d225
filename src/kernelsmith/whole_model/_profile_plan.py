"""The plan a profile produces: time per op family and shape, ranked by what tuning could gain.

Part of the profile stage (:mod:`kernelsmith.whole_model.profile`): :func:`build_plan` turns the
samples taken from profiler events into a :class:`Plan` of :class:`PlanRow` (a family, its shapes,
its share of the step and the Amdahl gains of :data:`SPEEDUPS`), written as JSON and read back by
``kernelsmith optimize`` and :func:`kernelsmith.whole_model.optimize.optimize_model`.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kernelsmith.whole_model._profile_families import tunable_families

PLAN_FORMAT = 1
SPEEDUPS = (1.5, 2.0, 3.0)
def amdahl_gain(share: float, speedup: float) -> float:
    """End-to-end speedup when a part taking ``share`` of the time runs ``speedup`` times faster.

    >>> round(amdahl_gain(0.5, 2.0), 4)
    1.3333
    >>> amdahl_gain(0.0, 3.0), amdahl_gain(1.0, 3.0)
    (1.0, 3.0)
    """
    if not 0.0 <= share <= 1.0 or speedup <= 0.0:
        raise ValueError(f"share must be in [0, 1] and speedup positive (got {share}, {speedup})")
    return 1.0 / (1.0 - share + share / speedup)


# ---------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """Time attributed to one family and shape set: a kernel (or a CPU op's self time), summed
    over its ``count`` occurrences in the profiled iterations.

    ``source`` says how the family was found (``"module"``, ``"op"`` or ``"kernel"``, see the
    module docstring); ``label`` is the module class or CPU op that explains it, if any.
    """

    name: str
    time_us: float
    family: str
    shapes: tuple[tuple[int, ...], ...] = ()
    source: str = "kernel"
    label: str = ""
    count: int = 1


@dataclass
class PlanRow:
    """One (family, shapes) of the plan; times and calls are per iteration (one forward)."""

    rank: int
    family: str
    shape: str
    shapes: list[list[int]]
    time_us: float
    calls: float
    share: float
    gain: dict[str, float]
    tunable: bool
    source: str
    ops: list[str]
    kernels: list[str]


@dataclass
class Plan:
    """A ranked Amdahl plan; :meth:`to_dict` is the JSON written by ``kernelsmith profile``."""

    model: str
    mode: str  # "gpu": device kernel timings; "cpu": CPU op self times
    device: str
    dtype: str
    iterations: int
    total_us: float  # attributed time per iteration (sum of the rows)
    rows: list[PlanRow]
    note: str = ""
    batch: int | None = None
    seq: int | None = None
    source: str = ""
    parameters: int | None = None
    compiled: bool = False
    wall_ms: float | None = None  # one forward, unprofiled, host clock around synchronized runs
    peak_memory_bytes: int | None = None  # torch.cuda.max_memory_allocated over the unprofiled forwards
    memory_note: str = ""  # why peak memory is not measured (a CPU)
    families: list[dict[str, Any]] = field(default_factory=list)
    attributed_by: dict[str, float] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    created: str = ""

    @property
    def busy(self) -> float | None:
        """Kernel time over wall time, on a GPU: well below 1 means launch- or host-bound (the
        shares then overstate what faster kernels buy). None for CPU plans."""
        if not self.wall_ms or self.mode != "gpu":
            return None
        return self.total_us / (self.wall_ms * 1000.0)

    def to_dict(self) -> dict[str, Any]:
        data = {"format": PLAN_FORMAT, **asdict(self)}
        data["busy"] = self.busy
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        if data.get("format") != PLAN_FORMAT:
            raise ValueError(f"not a kernelsmith plan of format {PLAN_FORMAT} (format: {data.get('format')!r})")
        values = {k: v for k, v in data.items() if k not in ("format", "busy")}
        values["rows"] = [PlanRow(**row) for row in values["rows"]]
        return cls(**values)

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def read(cls, path: str | Path) -> Plan:
        return cls.from_dict(json.loads(Path(path).read_text()))


def format_shapes(shapes: Sequence[Sequence[int]]) -> str:
    """``[[8, 1024, 768], [768]]`` -> ``"8x1024x768, 768"``; ``"-"`` when unknown."""
    return ", ".join("x".join(map(str, s)) for s in shapes) or "-"


def build_plan(samples: Iterable[Sample], *, iterations: int, model: str, mode: str, **meta: Any) -> Plan:
    """Group samples by (family, shapes), rank by time, and compute shares and Amdahl gains.

    Times and calls are divided by ``iterations``; ``meta`` fills the other :class:`Plan` fields.
    """
    if iterations < 1:
        raise ValueError(f"iterations must be positive (got {iterations})")
    groups: dict[tuple[str, tuple[tuple[int, ...], ...]], list[Sample]] = defaultdict(list)
    by_source: dict[str, float] = defaultdict(float)
    for sample in samples:
        groups[(sample.family, sample.shapes)].append(sample)
        by_source[sample.source] += sample.time_us
    total = sum(s.time_us for group in groups.values() for s in group)
    tunable = tunable_families()

    def top(names: Iterable[tuple[str, float]], n: int = 3) -> list[str]:
        by_time: defaultdict[str, float] = defaultdict(float)
        for name, t in names:
            if name:
                by_time[name] += t
        return sorted(by_time, key=lambda name: -by_time[name])[:n]

    rows: list[PlanRow] = []
    for (family, shapes), group in groups.items():
        time_us = sum(s.time_us for s in group)
        share = min(1.0, time_us / total) if total > 0 else 0.0
        rows.append(
            PlanRow(
                rank=0,
                family=family,
                shape=format_shapes(shapes),
                shapes=[list(s) for s in shapes],
                time_us=time_us / iterations,
                calls=sum(s.count for s in group) / iterations,
                share=share,
                gain={f"{k:g}x": amdahl_gain(share, k) for k in SPEEDUPS},
                tunable=family in tunable,
                source=top((s.source, s.time_us) for s in group)[0],
                ops=top((s.label, s.time_us) for s in group),
                kernels=top((s.name, s.time_us) for s in group),
            )
        )
    rows.sort(key=lambda r: (-r.time_us, r.family, r.shape))
    for rank, row in enumerate(rows, 1):
        row.rank = rank

    by_family: dict[str, float] = defaultdict(float)
    for row in rows:
        by_family[row.family] += row.share
    families = [
        {"family": f, "share": s, "time_us": s * total / iterations, "tunable": f in tunable}
        for f, s in sorted(by_family.items(), key=lambda item: -item[1])
    ]
    return Plan(
        model=model,
        mode=mode,
        iterations=iterations,
        total_us=total / iterations,
        rows=rows,
        families=families,
        attributed_by={k: v / total for k, v in by_source.items()} if total > 0 else {},
        **meta,
    )


