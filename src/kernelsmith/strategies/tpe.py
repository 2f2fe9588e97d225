"""Bayesian search with Optuna's TPE sampler (the library, not a home-made TPE).

TPE (the Tree-structured Parzen Estimator, Bergstra et al. 2011) splits the trials told so far
into the best fraction and the rest, fits a density to each, l(x) and g(x), and samples where
l(x) / g(x) is largest: configs that look like the fast ones and unlike the slow ones. It needs
only an ordering of the results, so the objective is simply the median time in microseconds.

The candidate set maps onto a conditional Optuna search space: ``variant`` is a categorical over
the variants, and each parameter of the chosen variant is a categorical over that variant's values
(named ``"variant.param"``, so variants never share a distribution). Optuna knows nothing of
constraints: a sample that is not a candidate (a constraint removed it) or that was proposed
already is told to Optuna as a failure, which TPE ignores, and the candidate proposed instead is
the nearest unproposed one of that variant (fewest steps along the ordered parameter values; ties
to the first in candidate order), enqueued as a fixed trial so Optuna learns from its result.
Failed evaluations are told as ``TrialState.FAIL``, never as a time. Results of candidates this
strategy did not propose (a warm start, an earlier stage) are added to the study as finished
trials, so TPE learns from them too.

Optuna is an optional dependency: ``pip install -e '.[search]'``.
"""

from __future__ import annotations

import logging
import math
import random
import warnings
from collections.abc import Sequence
from typing import Any

from kernelsmith.evaluate.protocol import Candidate, EvalResult
from kernelsmith.strategies._base import Strategy, variant_axes, variant_label

log = logging.getLogger(__name__)

VARIANT = "variant"
# Optuna categoricals hold only these types; anything else is encoded as its repr.
_PLAIN = (type(None), bool, int, float, str)


def import_optuna() -> Any:
    """The optuna module, or an ImportError that says how to install it."""
    try:
        import optuna
    except ImportError as exc:
        from kernelsmith.extras import missing

        raise ImportError(missing("the 'tpe' strategy", "search")) from exc
    return optuna


def optuna_available() -> bool:
    try:
        import_optuna()
    except ImportError:
        return False
    return True


class TPESearch(Strategy):
    name = "tpe"

    def __init__(self, seed: int = 0, n_startup_trials: int = 10) -> None:
        super().__init__(seed)
        self._optuna = import_optuna()  # fail at construction, before any work
        self.n_startup_trials = n_startup_trials

    def setup(self, candidates: Sequence[Candidate]) -> None:
        super().setup(candidates)
        optuna = self._optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # no line per trial
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.TPESampler(
                seed=self.seed, n_startup_trials=self.n_startup_trials, multivariate=True, group=True,
                constant_liar=True,  # several trials are in flight at once: penalize their region
            )
        self.study = optuna.create_study(direction="minimize", sampler=sampler)
        self._axes = variant_axes(candidates)
        self._encoded = {
            label: {p: tuple(_encode(v) for v in values) for p, values in axes.items()}
            for label, axes in self._axes.items()
        }
        self._by_params = {self._params(c): c for c in candidates}
        self._pending: dict[Candidate, Any] = {}  # candidate -> its running optuna trial
        self._told: set[Candidate] = set()
        rng = random.Random(self.seed)
        self._spare = list(candidates)
        rng.shuffle(self._spare)  # last resort when a sampled variant is exhausted

    # -- the mapping between candidates and optuna parameters ------------------------------

    def _params(self, candidate: Candidate) -> tuple[tuple[str, Any], ...]:
        label = variant_label(candidate)
        return ((VARIANT, label), *((f"{label}.{p}", _encode(v)) for p, v in sorted(candidate.config.items())))

    def _distributions(self, label: str) -> dict[str, Any]:
        categorical = self._optuna.distributions.CategoricalDistribution
        dists = {VARIANT: categorical(tuple(self._axes))}
        dists.update({f"{label}.{p}": categorical(values) for p, values in self._encoded[label].items()})
        return dists

    def _suggest(self, trial: Any) -> tuple[tuple[str, Any], ...]:
        label = trial.suggest_categorical(VARIANT, tuple(self._axes))
        params = sorted(self._encoded[label].items())
        return ((VARIANT, label), *((f"{label}.{p}", trial.suggest_categorical(f"{label}.{p}", v)) for p, v in params))

    # -- ask ---------------------------------------------------------------------------------

    def propose(self, n: int) -> list[Candidate]:
        batch: list[Candidate] = []
        while len(batch) < n and any(c not in self._proposed for c in self.candidates):
            candidate = self._ask_one()
            if candidate is None:
                break
            batch.append(candidate)
        return batch

    def _ask_one(self) -> Candidate | None:
        trial = self.study.ask()
        sampled = self._suggest(trial)
        candidate = self._by_params.get(sampled)
        if candidate is None or candidate in self._proposed:
            why = "not a candidate (a constraint removed it)" if candidate is None else "proposed already"
            self.study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
            candidate = self._nearest(sampled)
            if candidate is None:
                return None
            log.debug("TPE sample %s is %s; proposing %s instead", dict(sampled), why, candidate.key)
            self.study.enqueue_trial(dict(self._params(candidate)))
            trial = self.study.ask()
            self._suggest(trial)  # registers the enqueued values as the trial's parameters
        self._proposed.add(candidate)
        self._pending[candidate] = trial
        return candidate

    def _nearest(self, sampled: tuple[tuple[str, Any], ...]) -> Candidate | None:
        """The unproposed candidate of the sampled variant fewest value steps away, else any."""
        label, wanted = sampled[0][1], dict(sampled[1:])
        encoded = self._encoded[label]
        best: Candidate | None = None
        best_distance = math.inf
        for params, candidate in self._by_params.items():
            if params[0][1] != label or candidate in self._proposed:
                continue
            distance = 0
            for name, value in params[1:]:
                values = encoded[name[len(label) + 1:]]
                distance += abs(values.index(value) - values.index(wanted[name]))
            if distance < best_distance:
                best, best_distance = candidate, distance
        if best is None:
            best = next((c for c in self._spare if c not in self._proposed), None)
        return best

    # -- tell --------------------------------------------------------------------------------

    def observe(self, results: Sequence[EvalResult]) -> None:
        super().observe(results)
        state = self._optuna.trial.TrialState
        for result in results:
            candidate = result.candidate
            if candidate in self._told or self._params(candidate) not in self._by_params:
                continue  # told already, or outside this candidate set (no place in the search space)
            self._told.add(candidate)
            self._proposed.add(candidate)
            value = result.median_us if result.ok and math.isfinite(result.median_us) else None
            trial = self._pending.pop(candidate, None)
            if trial is not None:
                if value is None:
                    self.study.tell(trial, state=state.FAIL)
                else:
                    self.study.tell(trial, value)
                continue
            frozen = self._optuna.trial.create_trial(
                params=dict(self._params(candidate)),
                distributions=self._distributions(variant_label(candidate)),
                value=value,
                state=state.COMPLETE if value is not None else state.FAIL,
            )
            self.study.add_trial(frozen)

    def _order(self) -> Sequence[Candidate]:  # unused: propose is overridden
        return ()


def _encode(value: Any) -> Any:
    return value if isinstance(value, _PLAIN) else repr(value)
