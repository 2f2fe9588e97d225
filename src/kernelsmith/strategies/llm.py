"""LLM proposals: a language model reads the search so far and proposes what to try next.

Each *round* is one request to an :class:`~kernelsmith.llm.LLMClient` for ``per_round``
candidates (fewer when the budget has less left). The prompt holds

- the op: the workload (shapes, dtypes, constants), the family's summary, the bytes any kernel
  must move and, when the device's copy bandwidth is known, the time that sets as a floor;
- the hardware: the fingerprint's GPU, driver and versions, and the measured copy bandwidth
  ("unknown" without a database);
- the space: every variant's summary, parameters with their values, constraints (their reasons),
  and how many of its configs were tried;
- the history: every result observed so far in order (config, status, median time and speedup
  over eager PyTorch, or the failure reason trimmed to a line), what is still being evaluated,
  and notes on the previous answer (what was dropped or replaced, and why).

The answer is structured (:mod:`kernelsmith.llm.schema`): parameter proposals
``{variant, config, rationale}`` and, with ``sources=True``, whole kernels
``{name, source, configs, rationale}``. Proposals become candidates:

- a proposal that is in the candidate set and untried is taken as is;
- one that is not (a value off the list, a constraint broken, or tried already) is replaced by
  the *nearest* untried valid config of that variant (fewest steps along the ordered values of
  each parameter, ties to candidate order), and the next prompt says so;
- an unknown variant, or a variant with nothing untried left, is dropped and reported;
- a kernel is a *kernel file* (docs/kernel-files.md: ``@triton.jit`` device code plus literal
  ``SPACE``, ``CONSTRAINTS`` and ``LAUNCH``; no host Python at all). It goes through the
  kernel-file gate here first (reading the syntax tree only: nothing of it runs in this process);
  a rejected kernel costs no evaluation and the gate's problems go into the next prompt. An
  accepted one becomes ``Candidate("llm", config, source)`` per config, which the worker gates
  again, launches with kernelsmith's own launcher and runs through the full harness. Later
  rounds may name it as a variant to try it with other configs.

Rounds continue until the tuner's budget is spent. The search never fails because of the LLM:
when a request fails (network, quota, an answer that does not parse) the round is filled in
seeded random order, the first failure is logged once as a warning, and after ``max_failures``
failures in a row (or two rounds in a row with nothing usable) the strategy stops asking and
continues in random order. Token usage, requests and wall time are accounted in ``usage`` (a
:class:`~kernelsmith.llm.Metered` client), and the tuner reports them in the run's cost.

>>> from kernelsmith.llm.fake import FakeClient
>>> strategy = LLMSearch(FakeClient([{"candidates": [{"variant": "v", "config": {"b": 3}}]}]), sources=False)
>>> strategy.setup([Candidate("v", Config(b=b)) for b in (1, 2, 4)])
>>> strategy.propose(1)[0].key
'v[b=4]'
>>> strategy.rounds[0].notes
['v {"b": 3} is not a valid config (not in the candidate set): replaced by the nearest untried valid config {"b": 4}']

Layout: the kernel-file example and the prompt and answer helpers are in
:mod:`~kernelsmith.strategies._llm_helpers`; this module holds the strategy.
"""

from __future__ import annotations

import inspect
import logging
import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kernelsmith.evaluate.kernel_file import check_kernel_file
from kernelsmith.evaluate.protocol import Candidate, EvalResult
from kernelsmith.llm._base import LLMClient, Metered, Usage
from kernelsmith.space import Config, Space
from kernelsmith.spec import OpSpec
from kernelsmith.strategies._base import Strategy, variant_axes, variant_label
from kernelsmith.strategies._llm_helpers import (
    ERROR_CHARS,
    KERNEL_EXAMPLE,
    _coerce,
    _family,
    _hardware,
    _identifier,
    _import_schema,
    _json,
    _line,
    _outcome,
    _scalar_config,
    _steps,
    _template,
    _tried_by_label,
    _trim,
)
from kernelsmith.strategies.random import RandomSearch

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

SOURCE_VARIANT = "llm"  # the variant name of every kernel an LLM proposes as source
DEFAULT_BUDGET = 50  # the tuner's default, when the caller does not say
DEFAULT_PER_ROUND = 8
MAX_CONFIGS_PER_KERNEL = 3
MAX_FAILURES = 2  # failed requests in a row before the strategy stops asking
MAX_EMPTY_ROUNDS = 2  # rounds in a row with no usable proposal before it stops asking
HISTORY_LIMIT = 60  # results listed in a prompt (the fastest and the latest beyond that)
DOC_CHARS = 4000
SOURCE_CHARS = 8000


@dataclass
class RoundLog:
    """One round: how many candidates were asked for, what came of the answer, what it cost."""

    requested: int
    proposed: list[Candidate] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    error: str = ""


class LLMSearch(Strategy):
    """Rounds of LLM proposals (see the module docstring).

    ``client`` is any :class:`~kernelsmith.llm.LLMClient`; ``budget`` the evaluations the tuner
    will spend (sizes the last round); ``sources`` lets the model propose whole kernels, at most
    ``kernels_per_round`` a round; ``spec``, ``db`` and ``fingerprint`` (a hash) fill the prompt's
    op and hardware sections. Raises ImportError without pydantic (``kernelsmith[llm]``).
    """

    name = "llm"

    def __init__(
        self,
        client: LLMClient,
        seed: int = 0,
        *,
        budget: int | None = None,
        per_round: int = DEFAULT_PER_ROUND,
        sources: bool = True,
        kernels_per_round: int = 1,
        spec: OpSpec | None = None,
        db: Any = None,
        fingerprint: str | None = None,
        max_failures: int = MAX_FAILURES,
    ) -> None:
        super().__init__(seed)
        if client is None:
            raise ValueError("the llm strategy needs a client: pass client=... (see kernelsmith.llm.make_client)")
        if per_round < 1:
            raise ValueError("per_round must be at least 1")
        self._schema = _import_schema(sources)  # fail at construction, before any work
        self.client = client if isinstance(client, Metered) else Metered(client)
        self.budget = budget or DEFAULT_BUDGET
        self.per_round = per_round
        self.sources = sources
        self.kernels_per_round = kernels_per_round
        self.spec, self.db, self.fingerprint = spec, db, fingerprint
        self.max_failures = max_failures
        self.rounds: list[RoundLog] = []
        self.kernels: dict[str, str] = {}  # name -> source of every kernel accepted for evaluation
        self.rejected: list[tuple[str, str]] = []  # (kernel name, why) rejected before evaluation
        self._queue: list[Candidate] = []
        self._mine: list[Candidate] = []  # this strategy's proposals, in order
        self._notes: list[str] = []  # for the next prompt
        self._failures = 0
        self._empty_rounds = 0
        self._stopped = False  # stopped asking the LLM: random order from here on
        self._warned = False

    # -- accounting ------------------------------------------------------------------------------
    @property
    def usage(self) -> Usage:
        """Tokens, requests and wall time of every request so far (failed ones included)."""
        return self.client.usage

    def cost(self) -> dict[str, Any]:
        """The ``llm_*`` fields of :class:`kernelsmith.cost.SearchCost`."""
        return self.usage.as_cost()

    # -- set-up ----------------------------------------------------------------------------------
    def setup(self, candidates: Sequence[Candidate]) -> None:
        super().setup(candidates)
        self._axes = variant_axes(candidates)
        self._by_config = {(variant_label(c), c.config): c for c in candidates}
        self._by_label: dict[str, list[Candidate]] = {}
        for c in candidates:
            self._by_label.setdefault(variant_label(c), []).append(c)
        fallback = RandomSearch(self.seed)
        fallback.setup(candidates)
        self._random = list(fallback._order())
        self._family = _family(self.spec)
        self._spaces: dict[str, Space] = {}
        if self._family is not None and self.spec is not None:
            for variant in self._family.variants:
                if variant.name in self._axes:
                    self._spaces[variant.name] = variant.space(self.spec)
        self._hardware: str | None = None

    # -- ask -------------------------------------------------------------------------------------
    def propose(self, n: int) -> list[Candidate]:
        batch: list[Candidate] = []
        while len(batch) < n:
            if not self._queue and not self._refill():
                break
            candidate = self._queue.pop(0)
            if candidate not in self._proposed:  # someone may have reserved it since
                self._proposed.add(candidate)
                self._mine.append(candidate)
                batch.append(candidate)
        return batch

    def _refill(self) -> bool:
        want = max(1, min(self.per_round, self.budget - len(self._proposed)))
        if not self._stopped and (self.sources or self._untried()):
            self._queue = self._ask(want)
            if self._queue:
                return True
        self._queue = [c for c in self._random if c not in self._proposed][:want]
        return bool(self._queue)

    def _untried(self) -> bool:
        return any(c not in self._proposed for c in self.candidates)

    def _ask(self, want: int) -> list[Candidate]:
        """One round; never raises (a failure is logged, noted, and answered with nothing)."""
        log_entry = RoundLog(want)
        self.rounds.append(log_entry)
        try:
            prompt = self.prompt(want)
            answer: Any
            answer, usage = self.client.complete(self.system_prompt(), prompt, self._schema)
            log_entry.usage = usage
            self._notes = []  # they were in this prompt
            batch, log_entry.notes = self._map(answer, want)
            self.client.charge(batch, usage)
        except Exception as exc:
            log_entry.usage = getattr(exc, "usage", Usage())
            log_entry.error = f"{type(exc).__name__}: {exc}"[:500]
            self._failed(log_entry.error)
            return []
        self._failures = 0
        self._notes.extend(log_entry.notes)
        log_entry.proposed = list(batch)  # the queue is consumed by propose: keep a copy
        log.info("llm round %d: %d of %d candidates proposed", len(self.rounds), len(batch), want)
        if batch:
            self._empty_rounds = 0
        else:
            self._empty_rounds += 1
            if self._empty_rounds >= MAX_EMPTY_ROUNDS:
                log.info("no usable LLM proposal %d rounds in a row: random order from here on", MAX_EMPTY_ROUNDS)
                self._stopped = True
        return batch

    def _failed(self, error: str) -> None:
        self._failures += 1
        if not self._warned:
            log.warning("LLM proposals failed (%s): proposing in random order instead", error)
            self._warned = True
        else:
            log.debug("LLM proposals failed again: %s", error)
        self._notes.append(f"Your previous answer could not be used: {_line(error, ERROR_CHARS)}")
        if self._failures >= self.max_failures:
            self._stopped = True

    # -- answer -> candidates --------------------------------------------------------------------
    def _map(self, answer: Any, want: int) -> tuple[list[Candidate], list[str]]:
        """The answer's proposals as untried candidates (at most ``want``), and notes on them."""
        batch: list[Candidate] = []
        notes: list[str] = []
        taken = set(self._proposed)

        def take(candidate: Candidate) -> None:
            batch.append(candidate)
            taken.add(candidate)

        for i, kernel in enumerate(getattr(answer, "kernels", ()) if self.sources else ()):
            name = _identifier(kernel.name) or f"kernel{len(self.kernels) + len(self.rejected) + 1}"
            if i >= self.kernels_per_round or len(batch) >= want:
                notes.append(f"kernel {name!r} ignored: at most {self.kernels_per_round} new kernel(s) a round")
                continue
            problems = check_kernel_file(kernel.source)
            if problems:
                why = "; ".join(problems[:4])
                self.rejected.append((name, why))
                notes.append(f"kernel {name!r} rejected by the kernel-file gate before evaluation: {_line(why, 400)}")
                continue
            self.kernels[name] = kernel.source
            for raw in (kernel.configs or [{}])[:MAX_CONFIGS_PER_KERNEL]:
                config = _scalar_config(raw)
                if config is None:
                    notes.append(f"kernel {name!r}: config {_json(raw)} dropped (values must be numbers or strings)")
                elif len(batch) < want:
                    candidate = Candidate(SOURCE_VARIANT, config, kernel.source)
                    if candidate in taken:
                        notes.append(f"kernel {name!r} {_json(config)} was tried already: dropped")
                    else:
                        take(candidate)

        proposals = list(answer.candidates)
        for i, proposal in enumerate(proposals):
            if len(batch) >= want:
                notes.append(f"{len(proposals) - i} proposal(s) ignored: you were asked for {want}")
                break
            resolved, note = self._resolve(proposal.variant, proposal.config, taken)
            if note:
                notes.append(note)
            if resolved is not None:
                take(resolved)
        return batch, notes

    def _resolve(self, variant: str, raw: Mapping[str, Any], taken: set[Candidate]) -> tuple[Candidate | None, str]:
        label = variant.strip()
        config = _scalar_config(raw)
        if config is None:
            return None, f"{label} {_json(raw)} dropped: config values must be numbers or strings"
        if label in self.kernels:  # an earlier kernel, with another config
            candidate = Candidate(SOURCE_VARIANT, config, self.kernels[label])
            if candidate in taken:
                return None, f"kernel {label!r} {_json(config)} was tried already: dropped"
            return candidate, ""
        axes = self._axes.get(label)
        if axes is None:
            known = ", ".join(sorted(self._axes)) or "none"
            return None, f"variant {label!r} does not exist (variants: {known}): dropped"
        config = Config({name: _coerce(value, axes.get(name, ())) for name, value in config.items()})
        exact = self._by_config.get((label, config))
        if exact is not None and exact not in taken:
            return exact, ""
        why = "was tried already" if exact is not None else f"is not a valid config ({self._invalid(label, config)})"
        nearest = self._nearest(label, config, taken)
        if nearest is None:
            return None, f"{label} {_json(config)} {why}, and no untried config of {label} is left: dropped"
        replacement = f"replaced by the nearest untried valid config {_json(nearest.config)}"
        return nearest, f"{label} {_json(config)} {why}: {replacement}"

    def _invalid(self, label: str, config: Config) -> str:
        space = self._spaces.get(label)
        problems = space.violations(config) if space is not None else []
        return "; ".join(problems[:3]) if problems else "not in the candidate set"

    def _nearest(self, label: str, wanted: Config, taken: set[Candidate]) -> Candidate | None:
        axes = self._axes[label]
        best: Candidate | None = None
        best_distance = math.inf
        for candidate in self._by_label.get(label, ()):
            if candidate in taken:
                continue
            distance = sum(
                _steps(values, candidate.config[name], wanted[name])
                for name, values in axes.items()
                if name in wanted and name in candidate.config
            )
            if distance < best_distance:
                best, best_distance = candidate, distance
        return best

    # -- prompts ---------------------------------------------------------------------------------
    def system_prompt(self) -> str:
        text = (
            "You are an expert GPU performance engineer tuning Triton kernels for one PyTorch operation. "
            "Each round you propose candidates to benchmark. An isolated harness builds each candidate, checks "
            "it against the PyTorch reference on several shapes and value distributions, and times it against "
            "eager PyTorch; only correct candidates that are faster count.\n"
            "Propose candidates that have not been tried. Learn from the history: move towards what made "
            "kernels fast, away from what failed, and explore variants that were barely tried while the budget "
            "allows. Use variant names and parameter values exactly as the search space lists them; a config "
            "that is not in the space is replaced by the nearest valid one. Give each a one-sentence rationale. "
            "Answer with the JSON object the schema describes."
        )
        if self.sources:
            text += (
                f"\nYou may also propose up to {self.kernels_per_round} new kernel(s) a round as a kernel file "
                "(Triton device code and a declarative launch description; the user message says how), when the "
                "history suggests that the existing variants are limited by their design rather than by their "
                "parameters. Each of a kernel's configs is one candidate of the round."
            )
        return text

    def prompt(self, n: int) -> str:
        """The user prompt of a round asking for ``n`` candidates."""
        sections = [
            ("Op", self._op_section()),
            ("Hardware", self.hardware()),
            ("Search space", self._space_section()),
        ]
        if self.sources:
            sections.append(("Writing a new kernel", self._kernel_section()))
        sections.append(("History", self._history_section()))
        if self._notes:
            sections.append(("Notes on your previous answer", "\n".join(f"- {note}" for note in self._notes)))
        task = f"Propose {n} new candidate(s) to evaluate next"
        task += (
            f": parameter proposals, and at most {self.kernels_per_round} new kernel(s) whose configs count "
            "towards the total." if self.sources else "."
        )
        sections.append(("Task", task))
        return "\n\n".join(f"# {title}\n{body}" for title, body in sections)

    def _op_section(self) -> str:
        spec, family = self.spec, self._family
        if spec is None:
            return "unknown"
        lines = [f"Workload: {spec.describe()}"]
        if family is not None:
            lines.append(f"Family: {family.name}: {family.summary}")
            lines.append("Inputs, in launch order: " + ", ".join(str(t) for t in spec.inputs))
            lines.append("Outputs, in launch order: " + ", ".join(str(t) for t in family.output_specs(spec)))
            nbytes = family.bytes_moved(spec)
            lines.append(f"Minimum bytes moved (inputs read once, outputs written once): {nbytes}")
            copy_gbps = self._copy_gbps()
            if copy_gbps:
                floor_us = nbytes / (copy_gbps * 1e9) * 1e6
                lines.append(f"At the measured copy bandwidth that is a floor of {floor_us:.2f} us.")
        baselines = [r.metrics["baseline_median_us"] for r in self.history if "baseline_median_us" in r.metrics]
        if baselines:
            lines.append(f"Eager PyTorch baseline: {sorted(baselines)[len(baselines) // 2]:.2f} us (median).")
        return "\n".join(lines)

    def hardware(self) -> str:
        """The GPU facts of the prompt: the fingerprint and measured ceilings, else "unknown"."""
        if self._hardware is None:
            self._hardware = _hardware(self.db, self.fingerprint)
        return self._hardware

    def _copy_gbps(self) -> float | None:
        if self.db is None or not self.fingerprint:
            return None
        try:
            value = self.db.get_ceiling(self.fingerprint, "copy_gbps")
        except Exception:  # a database without ceilings: the prompt just says less
            return None
        return float(value) if value else None

    def _space_section(self) -> str:
        tried = _tried_by_label(self.history, self._mine)
        blocks = []
        for label, axes in self._axes.items():
            variant_summary = ""
            if self._family is not None:
                variant_summary = next((v.summary for v in self._family.variants if v.name == label), "")
            lines = [f"Variant `{label}`" + (f": {variant_summary}" if variant_summary else "")]
            space = self._spaces.get(label)
            if space is not None:
                params = "; ".join(f"{p.name} in {_json(list(p.choices))}" for p in space.params)
                lines.append(f"  parameters: {params}")
                if space.constraints:
                    lines.append("  constraints: " + "; ".join(c.reason for c in space.constraints))
            else:
                lines.append("  parameters: " + "; ".join(f"{name} in {_json(list(v))}" for name, v in axes.items()))
            lines.append(f"  {len(self._by_label[label])} valid configs, {tried.get(label, 0)} tried")
            blocks.append("\n".join(lines))
        return "\n".join(blocks) or "empty"

    def _kernel_section(self) -> str:
        parts = [
            "A new kernel is a kernel file: Python syntax, but kernelsmith never runs it as a program. It parses "
            "the file, checks every statement, and launches the kernels itself from the file's launch description. "
            "Top-level statements allowed: a docstring; `import triton`; `import triton.language as tl`; "
            "`@triton.jit` functions (the device code); constants `NAME = literal` (or `NAME = "
            "tl.constexpr(literal)` when a kernel body reads it); `SPACE = {param: [values...]}` (the configs "
            "to search: `num_warps`, `num_stages` and constexprs of your choice); `CONSTRAINTS = [expr, ...]` "
            "(conditions a config must meet); `LAUNCH = {...}` or a list of them run in order, with keys "
            "`kernel` (a @triton.jit function of the file), `grid` (1 to 3 expressions), `args` (the kernel's "
            "non-constexpr parameters, in order), `constexprs` ({name: expr}), `num_warps`, `num_stages`, and "
            "optionally `scratch` ({name: {shape: [exprs], dtype: 'float32', fill: 0.0}}, memory allocated "
            "and filled on every call, usable as a tensor name in `args`).",
            "Launch expressions are strings in a small language: `in0`, `in1`, ... and `out0`, ... are the "
            "tensors in the order listed under Op (only as a whole argument, or in `size(t, d)`, `stride(t, d)`, "
            "`numel(t)`, `row_stride(t)`); `rows` and `N` are the first input's row count (leading dimensions "
            "flattened) and row width; `numel`, `num_sms`; the workload's constants by name; the config's "
            "parameters; the file's constants; `cdiv`, `next_power_of_two`, `min`, `max`, `abs`; arithmetic, "
            "comparisons, `and`/`or`/`not` and `a if c else b`. Each config you give must be in SPACE and meet "
            "CONSTRAINTS. The harness allocates the outputs (pre-filled with varying values) and checks every "
            "element: the kernel must write all of them, in the output dtype, and read none of them.",
            "Rules (the gate rejects the file otherwise, and its problems come back to you): no other imports, "
            "no classes, no host functions, no top-level loops or calls, no try, no global, no "
            "@triton.autotune or @triton.heuristics. Inside @triton.jit bodies: the Triton language, if/for/while, "
            "assignments to locals; no nested functions, lambdas, comprehensions, with, f-strings, names or "
            "attributes starting with `_`, clocks, printing or inline assembly. The harness also checks "
            "correctness on other shapes (1 row, odd row counts), so mask every load and store.",
            "Format example (a different op):\n```python\n" + KERNEL_EXAMPLE + "```",
        ]
        template = _template(self._family)
        if template is not None:
            parts.append("A correct kernel file for this op to start from (kernelsmith's agent template):\n"
                         f"```python\n{_trim(template, SOURCE_CHARS, code=True)}```")
        if self._family is not None:
            module = inspect.getmodule(type(self._family))
            if module is not None and module.__doc__:
                parts.append("About this op family:\n" + _trim(module.__doc__, DOC_CHARS))
            try:
                reference = inspect.getsource(type(self._family).reference)
                code = _trim(textwrap.dedent(reference), DOC_CHARS, code=True)
                parts.append(f"The PyTorch reference the kernel must match:\n```python\n{code}```")
            except (OSError, TypeError):
                pass
        best = self._best_kernel()
        if best is not None:
            name, source, result = best
            parts.append(
                f"Your best kernel so far, {name!r} ({result.median_us:.2f} us, config "
                f"{_json(result.candidate.config)}):\n"
                f"```python\n{_trim(source, SOURCE_CHARS, code=True)}```"
            )
        return "\n\n".join(parts)

    def _best_kernel(self) -> tuple[str, str, EvalResult] | None:
        ok = [r for r in self.history if r.ok and r.candidate.source]
        if not ok:
            return None
        best = min(ok, key=lambda r: r.median_us)
        return self._kernel_name(best.candidate.source), best.candidate.source, best

    def _kernel_name(self, source: str) -> str:
        for name, text in self.kernels.items():
            if text == source:
                return name
        return f"{SOURCE_VARIANT}@{Candidate(SOURCE_VARIANT, Config(), source).key.split('@')[1][:8]}"

    def _describe(self, candidate: Candidate) -> str:
        if candidate.source:
            return f"kernel {self._kernel_name(candidate.source)!r} {_json(candidate.config)}"
        return f"{variant_label(candidate)} {_json(candidate.config)}"

    def _history_section(self) -> str:
        lines: list[str] = []
        results = list(self.history)
        shown = list(enumerate(results, start=1))
        if len(shown) > HISTORY_LIMIT:
            fastest = sorted((item for item in shown if item[1].ok), key=lambda item: item[1].median_us)[:15]
            keep = {i for i, _ in fastest} | {i for i, _ in shown[-(HISTORY_LIMIT - len(fastest)):]}
            lines.append(f"({len(shown) - len(keep)} older results omitted; the fastest are kept)")
            shown = [item for item in shown if item[0] in keep]
        for i, result in shown:
            lines.append(f"{i}. {self._describe(result.candidate)}: {_outcome(result)}")
        observed = {r.candidate for r in results}
        pending = [c for c in self._mine if c not in observed]
        if pending:
            lines.append("Still being evaluated: " + "; ".join(self._describe(c) for c in pending))
        for name, why in self.rejected:
            lines.append(f"Kernel {name!r} was rejected before evaluation: {_line(why, ERROR_CHARS)}")
        ok = [r for r in results if r.ok]
        if ok:
            best = min(ok, key=lambda r: r.median_us)
            lines.append(f"Best so far: {self._describe(best.candidate)} at {best.median_us:.2f} us.")
        return "\n".join(lines) if lines else "Nothing evaluated yet."

    def _order(self) -> Sequence[Candidate]:  # unused: propose is overridden
        return ()


