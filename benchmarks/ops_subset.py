"""Run the op benchmark (``benchmarks/ops.py``) of the tree in the working directory on some of its rows.

    cd TREE && python3 PATH/TO/ops_subset.py OP:SHAPE[:train] [...] -- [ARGUMENTS OF ops.py]

A row is named as the benchmark prints it: ``layernorm:4096x8192``, ``rmsnorm:8192x4096:train`` (a
forward+backward row). The rows are taken from the tree's own ``WORKLOADS`` list and the tree's own
``main`` runs them, so one command drives an old tree and a new one alike: issue 15's before/after
comparison in one sitting when the whole suite does not fit the time on the GPU (2026-12-02: seven
forward rows at budget 20 take ~300 s a tree). Compare the two reports with ``compare_ops.py``. An
unknown row name is an error (exit 2), not an empty run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any


def row_name(workload: Any) -> str:
    return f"{workload.op}:{'x'.join(map(str, workload.shape))}{':train' if workload.train else ''}"


def select(workloads: Sequence[Any], wanted: Sequence[str]) -> list[Any]:
    """The workloads named in ``wanted``, in the benchmark's order; ValueError naming any unknown name."""
    known = {row_name(w) for w in workloads}
    unknown = sorted(set(wanted) - known)
    if unknown:
        raise ValueError(f"no such rows: {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    return [w for w in workloads if row_name(w) in set(wanted)]


def main(argv: list[str]) -> int:
    split = argv.index("--") if "--" in argv else len(argv)
    sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
    import ops  # the tree's own benchmark, from the working directory

    try:
        ops.WORKLOADS = select(ops.WORKLOADS, argv[:split])
    except ValueError as exc:
        print(f"ops_subset: {exc}", file=sys.stderr)
        return 2
    print("rows:", [row_name(w) for w in ops.WORKLOADS], flush=True)
    sys.argv = ["ops.py", "--train", "all", *argv[split + 1:]]  # every selected row, forward or training
    return int(ops.main())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
