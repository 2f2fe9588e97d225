"""Compare search strategies on recorded spaces (``benchmarks/record_space.py``), without a GPU.

    python benchmarks/strategy_replay.py spaces/*.json --seeds 20 --out replay.json

Each strategy is replayed once per seed against each recorded space (see
:mod:`kernelsmith.strategies.replay`, where the simulation lives so that the tests use it too):
the strategy proposes, the recorded result answers, until the space is exhausted. The table shows,
per space and strategy, the evaluations needed until the best time so far is within 2% of the
space's best (mean over seeds, worst seed) and the share of seeds that got there within the
budget. ``auto`` chooses as it would for that budget; the other strategies ignore the budget.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernelsmith.strategies import CoordinateDescent, GridSearch, RandomSearch, Refine, Strategy, make_strategy
from kernelsmith.strategies.auto import exploration
from kernelsmith.strategies.replay import DEFAULT_TOLERANCE, RecordedSpace, ReplaySummary, compare
from kernelsmith.strategies.tpe import optuna_available


def factories(space: RecordedSpace, budget: int) -> dict[str, Callable[[int], Strategy]]:
    n_variants = len({c.variant for c in space.candidates})
    explore = exploration(budget, n_variants)
    strategies: dict[str, Callable[[int], Strategy]] = {
        "grid": GridSearch,
        "random": RandomSearch,
        "coordinate": CoordinateDescent,
        f"random({explore})+coordinate": lambda seed: Refine(RandomSearch(seed), explore, seed),
    }
    if optuna_available():
        strategies["tpe"] = lambda seed: make_strategy("tpe", seed)
    strategies[f"auto(budget {budget})"] = lambda seed: make_strategy("auto", seed, budget=budget)
    return strategies


def table(summaries: list[ReplaySummary], budget: int, tolerance: float) -> str:
    header = f"| space | size | strategy | evaluations to {100 * tolerance:g}% (mean) | worst | within {budget} |"
    lines = [header, "|---|---|---|---|---|---|"]
    for s in summaries:
        mean = "-" if s.reached == 0 else f"{s.mean:.1f}"
        worst = "-" if s.worst is None else str(s.worst)
        within = f"{100 * s.within(budget):.0f}%"
        lines.append(f"| {s.space} | {s.space_size} | {s.strategy} | {mean} | {worst} | {within} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spaces", nargs="+", help="recorded space JSON files")
    parser.add_argument("--seeds", type=int, default=20, help="seeds per strategy (default 20)")
    parser.add_argument("--budget", type=int, default=50, help="the budget auto plans for and 'within' counts")
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE, help="0.02: within 2%% of the best")
    parser.add_argument("--workers", type=int, default=1, help="proposals in flight, as the tuner's pool")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)

    summaries: list[ReplaySummary] = []
    sources: list[dict[str, Any]] = []
    for path in args.spaces:
        space = RecordedSpace.load(path)
        sources.append({"path": str(path), "name": space.name(), "best_us": space.best_us, "meta": space.meta})
        summaries += compare(
            space, factories(space, args.budget), range(args.seeds), tolerance=args.tolerance, workers=args.workers
        )
    print(table(summaries, args.budget, args.tolerance))
    if args.out:
        data = {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
            "seeds": args.seeds,
            "budget": args.budget,
            "tolerance": args.tolerance,
            "workers": args.workers,
            "spaces": sources,
            "results": [{**s.to_dict(), f"within_{args.budget}": s.within(args.budget)} for s in summaries],
        }
        Path(args.out).write_text(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
