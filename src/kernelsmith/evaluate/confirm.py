"""The decisive run: a candidate about to be kept is judged again where nothing it did can help it.

The search's workers are reused from one candidate to the next, and a worker's reply is only as
honest as the process that wrote it. So before an outside kernel (a ``Candidate`` with source:
an LLM's or an agent's) is kept, :meth:`kernelsmith.evaluate.pool.Evaluator.confirm`

1. times the baseline **alone**, in a brand-new worker process that never loads a candidate: the
   clean baseline;
2. validates and times the candidate (with the incumbent, when there is one) interleaved with
   the baseline, in **another brand-new worker process** started for that one request, whose
   harness is bound and sealed before any candidate loads (``validate.seal_harness``), and ended
   after it;
3. hands both replies to :func:`judge` here, which trusts only what it can recompute:

   - summaries (median, quantiles) are recomputed from the raw samples, and the achieved
     bandwidth from the op's own bytes model in this process (never the worker's ``gbps``); a
     claim above the measured copy bandwidth is a ``cheat`` (:func:`plausible`);
   - **a baseline slowed beside the candidate** is a ``cheat``: the baseline is the op's eager
     PyTorch code, the same in both processes, so its timings may differ by noise but not
     systematically. The rule (:func:`baseline_slowdown`): the baseline beside the candidate is
     a cheat's doing when even its *fast* end (10th percentile) is slower than both
     ``BASELINE_SLOWDOWN`` (1.25) times the clean median and the clean run's 90th percentile.
     Comparing the 10th percentile of one with the 90th of the other means the two distributions
     barely overlap: one stray slow round, or a noisy clean run, cannot trigger it, while a
     candidate that slows every baseline call (which is what buys it a speedup) shifts the
     whole distribution. The 1.25 factor keeps GPU clock and thermal drift between the two runs
     (a few per cent) far from the line, and the slow-down must also exceed
     ``MIN_SLOWDOWN_US``: on launch-bound shapes a few microseconds of host-side difference
     between two processes is ordinary, and that range is covered by the next check anyway.
     This check is made on the GPU only. In the interpreter the baseline beside a candidate *is*
     systematically slower (the interpreted kernel's host work between baseline calls leaves
     the CPU's caches cold: 2-4x on small shapes), so the rule would call honest kernels
     cheats; interpreter timings are not performance, and the next check still holds there;
   - and since a smaller slow-down is still worth a smaller fake speedup, the decision
     (:meth:`Confirmation.disagreement`) asks the candidate to beat, by ``decide.compare``, both
     the baseline timed beside it (paired rounds) and the clean baseline (rounds of two
     processes: no pairing, so a wider interval, which only makes the test harder to pass).

Failures stay data: a confirmation that could not run comes back as failure records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from kernelsmith.decide import Comparison, compare
from kernelsmith.evaluate import timing
from kernelsmith.evaluate.protocol import EvalResult
from kernelsmith.ops._base import OpFamily
from kernelsmith.spec import OpSpec

# Achieved bandwidth above this multiple of the measured copy bandwidth is not believable.
IMPLAUSIBLE_FRACTION_OF_COPY = 1.1
# The baseline beside a candidate may be this much slower than alone before it counts (see above).
BASELINE_SLOWDOWN = 1.25
MIN_SLOWDOWN_US = 3.0


def plausible(result: EvalResult, copy_gbps: float | None) -> EvalResult:
    """The result, or a "cheat" failure when it claims more bandwidth than the device has.

    No kernel moves its bytes faster than the device copies them (L2 is flushed before every
    timed call): a claim above the measured ceiling means work escaped the timed region.
    """
    gbps = result.metrics.get("gbps") if result.ok else None
    if copy_gbps and gbps and gbps > IMPLAUSIBLE_FRACTION_OF_COPY * copy_gbps:
        error = (
            f"{gbps:.0f} GB/s is above the device's measured copy bandwidth ({copy_gbps:.0f} GB/s): "
            "work escaped the timed region"
        )
        return replace(result, status="cheat", error=error)
    return result


def baseline_slowdown(beside_us: Sequence[float], alone_us: Sequence[float]) -> str:
    """Why the baseline timed beside a candidate was slowed down ("" when it was not)."""
    if not beside_us or not alone_us:
        return ""
    beside, alone = timing.summarize(beside_us), timing.summarize(alone_us)
    limit = max(BASELINE_SLOWDOWN * alone["median_us"], alone["p90_us"], alone["median_us"] + MIN_SLOWDOWN_US)
    if beside["p10_us"] <= limit:
        return ""
    return (
        f"the baseline ran slower beside this candidate: {beside['median_us']:.3g} us median "
        f"(10th percentile {beside['p10_us']:.3g} us) against {alone['median_us']:.3g} us "
        f"(90th percentile {alone['p90_us']:.3g} us) alone in a clean process"
    )


@dataclass(frozen=True)
class Confirmation:
    """The decisive run's results (one per candidate, checked by :func:`judge`) and the clean
    baseline (``samples_us`` and its summary) they were compared with."""

    results: tuple[EvalResult, ...]
    clean_baseline: dict[str, Any]

    def disagreement(self, index: int, against: int | None = None) -> str:
        """Why this run does not back keeping candidate ``index`` ("" when it does).

        It must be correct and faster, by :func:`kernelsmith.decide.compare`, than candidate
        ``against`` (the incumbent) when that one ran correctly; otherwise than the baseline
        beside it *and* the baseline timed alone.
        """
        result = self.results[index]
        if not result.ok:
            return f"{result.status}: {result.error}"
        samples = result.metrics["samples_us"]
        incumbent = self.results[against] if against is not None else None
        if incumbent is not None and incumbent.ok:
            versus = compare(samples, incumbent.metrics["samples_us"])
            if not versus.significant:
                return f"not faster than the incumbent ({_detail(versus)})"
            return ""
        versus = compare(samples, result.metrics["baseline_samples_us"])
        if not versus.significant:
            return f"not faster than the baseline beside it ({_detail(versus)})"
        alone = compare(samples, self.clean_baseline["samples_us"])
        if not alone.significant:
            return f"not faster than the baseline timed alone in a clean process ({_detail(alone)})"
        return ""


def judge(
    op: OpFamily,
    spec: OpSpec,
    results: Sequence[EvalResult],
    clean: dict[str, Any],
    clean_error: str,
    copy_gbps: float | None,
    *,
    check_slowdown: bool = True,
) -> Confirmation:
    """Check the decisive run's ``results`` against the ``clean`` baseline (see the module doc).

    ``clean`` holds the baseline's ``samples_us`` from a process that loaded no candidate;
    ``clean_error`` says why there are none. Without a clean baseline nothing can be confirmed:
    every result comes back "skipped" (the candidate is not to blame, so no failure is recorded).
    ``check_slowdown`` is False in interpreter mode (see the module docstring).
    """
    alone = list(clean.get("samples_us", []))
    if clean_error or not alone:
        why = f"the baseline could not be timed alone in a clean process: {clean_error or 'no samples'}"
        return Confirmation(tuple(replace(r, status="skipped", error=why) for r in results), dict(clean))
    clean_baseline = {**timing.summarize(alone), "samples_us": alone}
    checked = [plausible(_recomputed(op, spec, r), copy_gbps) if r.ok else r for r in results]
    slowed = ""
    if check_slowdown:
        slowed = next((baseline_slowdown(r.metrics["baseline_samples_us"], alone) for r in checked if r.ok), "")
    if slowed:
        checked = [replace(r, status="cheat", error=slowed, metrics={}) if r.ok else r for r in checked]
    return Confirmation(tuple(checked), clean_baseline)


def _recomputed(op: OpFamily, spec: OpSpec, result: EvalResult) -> EvalResult:
    """The result with every figure derived here from its raw samples and the op's bytes model."""
    samples = result.metrics.get("samples_us")
    baseline = result.metrics.get("baseline_samples_us")
    if not samples or not baseline or min(samples) <= 0 or min(baseline) <= 0:
        return replace(result, status="crash", error="the confirmation's reply carries no usable timing samples")
    stats, base = timing.summarize(samples), timing.summarize(baseline)
    nbytes = op.bytes_moved(spec)
    metrics = dict(result.metrics)
    metrics.update(stats)
    metrics.update({f"baseline_{k}": v for k, v in base.items() if k != "n"})
    metrics["gbps"] = nbytes / (stats["median_us"] * 1e-6) / 1e9
    metrics["baseline_gbps"] = nbytes / (base["median_us"] * 1e-6) / 1e9
    compiled = result.metrics.get("compile_samples_us")
    if compiled and min(compiled) > 0:  # the torch.compile baseline, where this run timed one
        metrics["compile_median_us"] = timing.summarize(compiled)["median_us"]
    return replace(result, metrics=metrics)


def _detail(versus: Comparison) -> str:
    return f"{versus.speedup:.3f}x, 95% CI {versus.ci_low:.3f}-{versus.ci_high:.3f}"
