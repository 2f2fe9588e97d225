"""Search strategies behind one ask/tell interface, chosen by name.

====================  ==========================================================================
``grid``              every candidate in a fixed order, variants interleaved
``random``            seeded random order, variants interleaved
``tpe``               Optuna's TPE sampler (``pip install -e '.[search]'``)
``coordinate``        coordinate descent around the incumbent, random restarts when stuck
``llm``               rounds of proposals from a language model, parameters and whole kernels
                      (``pip install -e '.[llm]'``; a ``client``, or one configured by
                      environment variables: see :mod:`kernelsmith.llm`)
``auto``              picks one of the above from the budget and the space size, warm-started
                      from the nearest tuned workloads in the database (see ``auto.py``); the
                      LLM only when a ``client`` is passed
====================  ==========================================================================

Compositions: :class:`Refine` (one strategy, then coordinate descent), :class:`WarmStart` (stored
winners first), :class:`Chain` (any stages in turn).

>>> make_strategy("random", seed=1).name
'random'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kernelsmith.spec import OpSpec
from kernelsmith.strategies._base import Strategy
from kernelsmith.strategies.auto import AutoStrategy
from kernelsmith.strategies.chain import Chain
from kernelsmith.strategies.coordinate import CoordinateDescent, Refine
from kernelsmith.strategies.grid import GridSearch
from kernelsmith.strategies.llm import LLMSearch
from kernelsmith.strategies.random import RandomSearch
from kernelsmith.strategies.tpe import TPESearch
from kernelsmith.strategies.warm import WarmStart, nearest_winners

STRATEGIES: dict[str, Callable[..., Strategy]] = {
    "grid": GridSearch,
    "random": RandomSearch,
    "tpe": TPESearch,
    "coordinate": CoordinateDescent,
    "llm": LLMSearch,
    "auto": AutoStrategy,
}


def make_strategy(
    name: str,
    seed: int = 0,
    *,
    budget: int | None = None,
    db: Any = None,
    spec: OpSpec | None = None,
    fingerprint: str | None = None,
    client: Any = None,
) -> Strategy:
    """A fresh strategy by name. ``budget``, ``db``, ``spec`` and ``fingerprint`` (a hash) inform
    ``auto``'s choice and warm start and the ``llm`` prompts; the other strategies ignore them.
    ``client`` (a :class:`kernelsmith.llm.LLMClient`) is the LLM of ``llm``, which builds one from
    the environment without it (:func:`kernelsmith.llm.make_client`), and of ``auto``, which
    uses an LLM only when given one.

    Raises ValueError for an unknown name or an ``llm`` without a configured client, ImportError
    (with the install command) for ``tpe`` without Optuna or ``llm`` without its SDK.
    """
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r} (known: {', '.join(sorted(STRATEGIES))})")
    if name == "auto":
        return AutoStrategy(seed, budget=budget, db=db, spec=spec, fingerprint=fingerprint, client=client)
    if name == "llm":
        if client is None:
            from kernelsmith.llm import make_client

            client = make_client()
        return LLMSearch(client, seed, budget=budget, spec=spec, db=db, fingerprint=fingerprint)
    return STRATEGIES[name](seed=seed)


__all__ = [
    "STRATEGIES",
    "AutoStrategy",
    "Chain",
    "CoordinateDescent",
    "GridSearch",
    "LLMSearch",
    "RandomSearch",
    "Refine",
    "Strategy",
    "TPESearch",
    "WarmStart",
    "make_strategy",
    "nearest_winners",
]
