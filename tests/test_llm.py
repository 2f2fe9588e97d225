"""LLM proposals with a fake client: prompts, mapping, rounds, failures, accounting, clients.

No test here touches the network: the strategy talks to :class:`kernelsmith.llm.fake.FakeClient`,
and each real client is exercised against a stand-in SDK module put in ``sys.modules`` (the
clients import their SDK lazily), which records the request it receives. The end-to-end test runs
``tune_spec`` in the Triton interpreter with proposed kernel files: a correct RMSNorm is
evaluated like any variant, and malicious ones (host Python the gate rejects, a kernel file that
never writes) are rejected while the search goes on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import sys
import types
from typing import Any

import pytest
import torch
from pydantic import BaseModel

from kernelsmith.db import current_fingerprint, open_database
from kernelsmith.evaluate.kernel_file import parse_kernel_file
from kernelsmith.evaluate.protocol import Candidate, EvalResult
from kernelsmith.evaluate.static_gate import check_source
from kernelsmith.llm import LLMError, Metered, Usage, make_client
from kernelsmith.llm.fake import FakeClient
from kernelsmith.llm.schema import ParamRound, Round
from kernelsmith.ops import get_op
from kernelsmith.space import Config, Constraint, Param, Space
from kernelsmith.strategies import AutoStrategy, RandomSearch, make_strategy
from kernelsmith.strategies.llm import KERNEL_EXAMPLE, SOURCE_VARIANT, LLMSearch
from kernelsmith.strategies.replay import RecordedSpace, replay
from kernelsmith.testing.bad_kernels import source
from kernelsmith.tuner import tune_spec

SECRET = "sk-test-0123456789abcdef"

# A synthetic space: two variants, constraints leaving holes (as in test_strategies_more.py).
_BLOCKED = Space(
    [Param("BLOCK", (64, 128, 256, 512)), Param("num_warps", (1, 2, 4, 8))],
    [Constraint("32 elements a warp at least", lambda c: c["BLOCK"] >= 32 * c["num_warps"])],
)
_ROWS = Space([Param("ROWS", (1, 2, 4)), Param("EVICT", ("", "evict_first"))])
CANDIDATES = [Candidate("blocked", c) for c in _BLOCKED] + [Candidate("rows", c) for c in _ROWS]


def _time(candidate: Candidate) -> EvalResult:
    c = candidate.config
    if candidate.variant == "rows" and c["ROWS"] == 4:
        return EvalResult(candidate, "build", "out of resources:\n  shared memory " + "x" * 500)
    us = 30.0 + (c.get("BLOCK", 128) / 128 - 1) ** 2 + c.get("num_warps", 2) + c.get("ROWS", 0)
    return EvalResult(candidate, "ok", metrics={"median_us": us, "baseline_median_us": 40.0})


SPACE = RecordedSpace(tuple(_time(c) for c in CANDIDATES))


def _proposals(*items: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"candidates": [{"variant": v, "config": c, "rationale": "because"} for v, c in items]}


def _asked(user: str) -> int:
    return int(re.search(r"Propose (\d+) new candidate", user).group(1))


class Exact:
    """A script answering each round with as many valid candidates as asked for, in set order,
    never the same twice; ``answers`` keeps what it said."""

    def __init__(self) -> None:
        self.answers: list[dict[str, Any]] = []
        self._next = 0

    def __call__(self, system: str, user: str, schema: type) -> dict[str, Any]:
        n = _asked(user)
        picks = CANDIDATES[self._next : self._next + n]
        self._next += n
        self.answers.append(_proposals(*[(c.variant, c.config.to_dict()) for c in picks]))
        return self.answers[-1]


# ---- prompts ----------------------------------------------------------------------------------
def test_prompt_holds_op_hardware_space_and_history():
    op = get_op("rmsnorm")
    spec = op.spec((8, 64), "float32")
    candidates = [Candidate(v.name, c) for v in op.variants for c in v.space(spec)]
    fp = current_fingerprint()
    with open_database(":memory:") as db:
        db.put_fingerprint(fp)
        db.put_ceiling(fp.hash, "copy_gbps", 4000.0)
        whole_row = op.variant("whole_row").space(spec).configs()[0].to_dict()
        client = FakeClient([_proposals(("whole_row", whole_row), ("multi_row", {"ROWS": 3})), _proposals()])
        strategy = LLMSearch(client, budget=10, per_round=2, sources=False, spec=spec, db=db, fingerprint=fp.hash)
        strategy.setup(candidates)
        first, second = strategy.propose(2)
        strategy.observe([
            EvalResult(first, "ok", metrics={"median_us": 10.0, "baseline_median_us": 12.0}),
            EvalResult(second, "validate", "max error 3.2 at row 7\n" + "detail " * 100),
        ])
        strategy.propose(1)
    user = client.calls[1].user
    # the op
    assert "rmsnorm(8x64:float32, 64:float32, eps=1e-06)" in user and op.summary in user
    assert f"Minimum bytes moved (inputs read once, outputs written once): {op.bytes_moved(spec)}" in user
    # the hardware: the fingerprint and the measured ceiling
    assert fp.describe() in user and "4000 GB/s" in user and "floor of" in user
    # the space: every variant that has configs here, its values and its constraints' reasons; a
    # variant with none at this shape (aligned_row at a width of 64, split_row on short rows) is
    # not offered
    offered = {c.variant for c in candidates}
    assert {"aligned_row", "split_row"} & {v.name for v in op.variants} - offered
    for variant in op.variants:
        if variant.name not in offered:
            assert f"Variant `{variant.name}`" not in user
            continue
        assert f"Variant `{variant.name}`: {variant.summary}" in user
        for constraint in variant.space(spec).constraints:
            assert constraint.reason in user
    assert "num_warps in [1, 2, 4, 8, 16, 32]" in user
    # the history: times and speedups, failure reasons on one trimmed line, notes on the last answer
    assert f"1. whole_row {json.dumps(whole_row, sort_keys=True)}: ok, 10.00 us (1.20x eager)" in user
    failure = next(line for line in user.splitlines() if line.startswith("2. multi_row"))
    assert "validate: max error 3.2 at row 7 detail" in failure and failure.endswith("...") and len(failure) < 400
    assert 'multi_row {"ROWS": 3} is not a valid config (ROWS=3 is not one of' in user
    assert "Eager PyTorch baseline: 12.00 us" in user
    assert "Best so far: whole_row" in user
    assert "Writing a new kernel" not in user and "kernels" not in client.calls[1].schema.model_fields


def test_without_database_the_hardware_is_unknown_and_sources_are_explained():
    client = FakeClient([_proposals()])
    spec = get_op("rmsnorm").spec((8, 64), "float32")
    strategy = LLMSearch(client, spec=spec)
    strategy.setup(CANDIDATES)
    strategy.propose(1)
    user = client.calls[0].user
    assert "# Hardware\nunknown" in user and "Nothing evaluated yet." in user
    assert "# Writing a new kernel" in user and "A new kernel is a kernel file" in user and "LlamaRMSNorm" in user
    assert "def build(" not in user  # no host Python anywhere in what the model is shown
    assert "LAUNCH = {" in user and '"args": ["in0", "out0"' in user
    assert "kernelsmith's agent template" in user and "_rmsnorm_row_kernel" in user  # the family's template
    assert client.calls[0].schema is Round


def test_the_prompts_kernel_example_is_a_kernel_file_the_harness_accepts():
    assert check_source(KERNEL_EXAMPLE) == []
    kernel_file = parse_kernel_file(KERNEL_EXAMPLE)
    op = get_op("gelu")  # any op with one input and one output of its shape: here it is wrong, on purpose
    spec = op.spec((5, 33), "float32")
    launcher = kernel_file.build(spec, kernel_file.space(spec).configs()[0])
    x = torch.randn(5, 33)
    y = torch.full_like(x, float("nan"))
    launcher([x], [y])
    assert torch.equal(y, 2 * x)  # it launches, masks its tail and writes every element


# ---- mapping proposals onto the candidate set --------------------------------------------------
def test_proposals_are_mapped_onto_the_candidate_set_and_reported():
    answer = _proposals(
        ("blocked", {"BLOCK": 128, "num_warps": 2}),  # valid: taken as is
        ("blocked", {"BLOCK": 128, "num_warps": 2}),  # the same again: nearest untried instead
        ("blocked", {"BLOCK": 64, "num_warps": 8}),  # breaks the constraint: nearest valid
        ("blocked", {"BLOCK": "512", "num_warps": 1.0}),  # "512" and 1.0 mean 512 and 1
        ("rows", {"ROWS": 3, "EVICT": "evict_first"}),  # off the list: nearest value
        ("tiled", {"BLOCK": 64}),  # no such variant: dropped
        ("rows", {"ROWS": [1, 2]}),  # not a scalar: dropped
    )
    client = FakeClient([answer, _proposals()])
    strategy = LLMSearch(client, per_round=8, sources=False)
    strategy.setup(CANDIDATES)
    batch = strategy.propose(8)
    keys = [c.key for c in batch[:5]]
    assert keys == [
        "blocked[BLOCK=128,num_warps=2]",
        "blocked[BLOCK=64,num_warps=2]",  # one step away, first in candidate order
        "blocked[BLOCK=128,num_warps=4]",  # two steps away from (64, 8), first in order
        "blocked[BLOCK=512,num_warps=1]",
        "rows[EVICT=evict_first,ROWS=4]",  # 3 is nearer 4 than 2 on a log scale
    ]
    assert len(set(batch)) == len(batch) and set(batch) <= set(CANDIDATES)
    notes = strategy.rounds[0].notes
    assert any("was tried already: replaced by the nearest untried valid config" in n for n in notes)
    assert any('blocked {"BLOCK": 64, "num_warps": 8} is not a valid config' in n for n in notes)
    assert any("variant 'tiled' does not exist" in n for n in notes)
    assert any("config values must be numbers or strings" in n for n in notes)
    # ... and the next prompt tells the model
    assert "variant 'tiled' does not exist" in client.calls[1].user


def test_too_many_proposals_are_cut_to_the_request():
    client = FakeClient([_proposals(*[(c.variant, c.config.to_dict()) for c in CANDIDATES[:6]])])
    strategy = LLMSearch(client, per_round=3, sources=False)
    strategy.setup(CANDIDATES)
    assert strategy.propose(3) == CANDIDATES[:3]
    assert "3 proposal(s) ignored: you were asked for 3" in strategy.rounds[0].notes


# ---- rounds and the budget ---------------------------------------------------------------------
def test_several_rounds_spend_exactly_the_budget():
    client = FakeClient(Exact())
    strategy = LLMSearch(client, budget=10, per_round=4, sources=False)
    trace = replay(strategy, SPACE, budget=10)
    assert len(trace) == 10 and len({r.candidate for r in trace}) == 10
    assert [r.requested for r in strategy.rounds] == [4, 4, 2]
    assert all(len(r.proposed) == r.requested for r in strategy.rounds)
    # each round's prompt holds every result observed before it
    assert "\n4. " in client.calls[1].user and "\n5. " not in client.calls[1].user
    assert "\n8. " in client.calls[2].user


def test_rounds_continue_with_results_pending_and_never_repeat():
    """The tuner keeps proposals in flight: later rounds list them as pending, not as new."""
    strategy = LLMSearch(FakeClient(Exact()), budget=len(CANDIDATES), per_round=3, sources=False)
    trace = replay(strategy, SPACE, workers=3)
    assert sorted(r.candidate.key for r in trace) == sorted(c.key for c in CANDIDATES)
    assert "Still being evaluated:" in strategy.client.client.calls[1].user


# ---- failures fall back to random order ----------------------------------------------------------
def test_client_errors_fall_back_to_random_order_logged_once(caplog):
    client = FakeClient([RuntimeError("service unavailable"), LLMError("quota", Usage(5, 0, 1, 0.2))])
    strategy = LLMSearch(client, budget=len(CANDIDATES), per_round=4, seed=7, sources=False)
    with caplog.at_level(logging.WARNING, logger="kernelsmith.strategies.llm"):
        trace = replay(strategy, SPACE)
    random = RandomSearch(7)
    random.setup(CANDIDATES)
    assert [r.candidate for r in trace] == list(random._order())  # everything, in random order
    assert len(client.calls) == 2  # two failures in a row: it stopped asking
    assert len([r for r in caplog.records if "LLM proposals failed" in r.getMessage()]) == 1
    assert strategy.usage == Usage(5, 0, 2, 0.2)  # the failed requests are accounted too
    assert [bool(r.error) for r in strategy.rounds] == [True, True]


def test_one_failure_then_the_llm_again():
    client = FakeClient([
        _proposals(("rows", {"ROWS": 1, "EVICT": ""})),
        {"candidates": "not a list"},  # does not fit the schema
        _proposals(("rows", {"ROWS": 2, "EVICT": ""})),
    ])
    strategy = LLMSearch(client, budget=3, per_round=1, sources=False)
    strategy.setup(CANDIDATES)
    picks = [strategy.propose(1)[0] for _ in range(3)]
    assert picks[0].key == "rows[EVICT=,ROWS=1]" and picks[1] in CANDIDATES  # a failed round: at random
    assert [r.error != "" for r in strategy.rounds] == [False, True, False]
    assert strategy.rounds[2].proposed == [picks[2]] and len(set(picks)) == 3
    assert "Your previous answer could not be used" in client.calls[2].user


def test_empty_answers_twice_stop_asking():
    client = FakeClient(lambda system, user, schema: {"candidates": []})
    strategy = LLMSearch(client, per_round=4, sources=False)
    trace = replay(strategy, SPACE)
    assert len(trace) == len(CANDIDATES) and len(client.calls) == 2


# ---- accounting --------------------------------------------------------------------------------
def test_usage_is_accounted_per_request_and_charged_to_candidates():
    script = Exact()
    client = FakeClient(script)
    meter = Metered(client)
    strategy = LLMSearch(meter, budget=6, per_round=3, sources=False)
    trace = replay(strategy, SPACE, budget=6)
    expected = Usage()
    for call, answer in zip(client.calls, script.answers, strict=True):
        expected += Usage((len(call.system) + len(call.user)) // 4, len(json.dumps(answer)) // 4, 1, 0.01)
    assert strategy.usage == meter.usage
    assert (meter.usage.input_tokens, meter.usage.output_tokens, meter.usage.requests) == (
        expected.input_tokens, expected.output_tokens, 2
    )
    assert meter.usage.wall_s == pytest.approx(0.02)
    assert strategy.cost() == {
        "llm_input_tokens": expected.input_tokens,
        "llm_output_tokens": expected.output_tokens,
        "llm_requests": 2,
        "llm_wall_s": pytest.approx(0.02),
    }
    assert set(meter.tokens) == {r.candidate for r in trace} and all(t > 0 for t in meter.tokens.values())


# ---- composition -------------------------------------------------------------------------------
def test_auto_uses_the_llm_only_with_a_client():
    without = make_strategy("auto", budget=10)
    without.setup(CANDIDATES)
    assert "llm" not in without.inner.name
    client = FakeClient(Exact())
    with_client = make_strategy("auto", budget=8, client=client)
    assert isinstance(with_client, AutoStrategy)
    trace = replay(with_client, SPACE, budget=8)
    assert with_client.inner.name == "llm+coordinate" and len(trace) == 8
    assert client.calls and [r.requested for r in with_client.inner.stages[0][0].rounds] == [6]


def test_llm_strategy_without_a_client_needs_the_environment(monkeypatch):
    monkeypatch.delenv("KERNELSMITH_LLM_PROVIDER", raising=False)
    with pytest.raises(ValueError, match="KERNELSMITH_LLM_PROVIDER"):
        make_strategy("llm")
    spec = get_op("rmsnorm").spec((8, 64), "float32")
    with pytest.raises(ValueError, match="KERNELSMITH_LLM_PROVIDER"):
        tune_spec(spec, strategy="llm", db=":memory:")


# ---- whole-kernel proposals ----------------------------------------------------------------------
def _kernel(name: str, text: str, *configs: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "source": text, "configs": list(configs), "rationale": "fewer passes"}


def test_kernel_sources_are_gated_here_then_proposed_as_llm_candidates():
    good = source("correct_rmsnorm")
    client = FakeClient([
        {"candidates": [], "kernels": [_kernel("threads", source("background_thread"), {})]},
        {"candidates": [], "kernels": [_kernel("fast one", good, {"num_warps": 4}, {"num_warps": 8})]},
        _proposals(("fast_one", {"num_warps": 2}), ("fast_one", {"num_warps": 4})),
    ])
    strategy = LLMSearch(client, budget=10, per_round=2)
    strategy.setup(CANDIDATES)
    first = strategy.propose(2)
    assert set(first) <= set(CANDIDATES)  # the thread kernel never became a candidate: random fill
    assert strategy.rejected[0][0] == "threads" and "`import threading` is not allowed" in strategy.rejected[0][1]
    kernels = strategy.propose(2)
    assert "kernel 'threads' rejected by the kernel-file gate before evaluation" in client.calls[1].user
    assert kernels == [Candidate(SOURCE_VARIANT, Config(num_warps=w), good) for w in (4, 8)]
    again = strategy.propose(2)  # the kernel named again with another config; the tried one dropped
    assert again[0] == Candidate(SOURCE_VARIANT, Config(num_warps=2), good)
    assert any("was tried already: dropped" in n for n in strategy.rounds[2].notes)
    assert "Kernel 'threads' was rejected before evaluation" in client.calls[2].user


def test_only_the_allowed_number_of_kernels_a_round():
    good = source("correct_rmsnorm")
    client = FakeClient([{"kernels": [_kernel("a", good, {"num_warps": 1}), _kernel("b", good, {"num_warps": 2})]}])
    strategy = LLMSearch(client, per_round=4, kernels_per_round=1)
    strategy.setup(CANDIDATES)
    batch = strategy.propose(1)
    assert batch == [Candidate(SOURCE_VARIANT, Config(num_warps=1), good)]
    assert "kernel 'b' ignored: at most 1 new kernel(s) a round" in strategy.rounds[0].notes


@pytest.fixture(scope="module")
def llm_tune(tmp_path_factory):
    """tune_spec with strategy "llm" in the interpreter: three rounds, kernels among them."""
    op = get_op("rmsnorm")
    spec = op.spec((8, 64), "float32")
    whole_row = op.variant("whole_row").space(spec).configs()[0].to_dict()
    multi_row = op.variant("multi_row").space(spec).configs()[0].to_dict()
    client = FakeClient([
        # round 1: PyTorch instead of a kernel (host Python: the gate stops it) and a parameter proposal
        {"candidates": [{"variant": "whole_row", "config": whole_row}],
         "kernels": [_kernel("softmax_shortcut", source("torch_softmax"), {})]},
        # round 2: a kernel file that passes the gate but never writes its output (the harness stops it)
        {"candidates": [{"variant": "multi_row", "config": multi_row}],
         "kernels": [_kernel("lazy", source("never_writes"), {"num_warps": 4})]},
        # round 3: a correct kernel
        {"kernels": [_kernel("one_pass", source("correct_rmsnorm"), {"num_warps": 4})]},
    ])
    db = str(tmp_path_factory.mktemp("llm") / "llm.db")
    result = tune_spec(spec, budget=4, strategy="llm", db=db, workers=2, client=client)
    return spec, result, client, db


def test_source_proposals_are_evaluated_end_to_end(llm_tune):
    spec, result, client, db = llm_tune
    assert result.evaluations == 4 and len(client.calls) == 3
    with open_database(db) as database:
        trials = database.trials(fingerprint=current_fingerprint().hash, workload=spec.workload_hash)
    by_source = {t.source_hash: t for t in trials if t.variant == SOURCE_VARIANT}
    good = hashlib.sha256(source("correct_rmsnorm").encode()).hexdigest()[:16]
    ok = [t for h, t in by_source.items() if h == good]
    assert len(ok) == 1 and ok[0].status == "ok" and ok[0].metrics["median_us"] > 0
    assert ok[0].config == {"num_warps": 4} and ok[0].metrics["llm_tokens"] > 0
    assert {t.variant for t in trials if t.status == "ok"} >= {"whole_row", "multi_row", SOURCE_VARIANT}


def test_malicious_proposals_are_rejected_and_the_search_continues(llm_tune):
    spec, result, client, db = llm_tune
    with open_database(db) as database:
        trials = database.trials(fingerprint=current_fingerprint().hash, workload=spec.workload_hash)
    # the gate: never a candidate, never run, reported back to the model with what is allowed
    assert "kernel 'softmax_shortcut' rejected by the kernel-file gate before evaluation" in client.calls[1].user
    assert "`import torch` is not allowed; the imports are `import triton`" in client.calls[1].user
    assert len(trials) == 4 and all(t.source_hash != "" for t in trials)
    # the harness: evaluated in a worker, rejected as a failure, and the search went on
    lazy = [t for t in trials if t.status != "ok"]
    assert len(lazy) == 1 and lazy[0].variant == SOURCE_VARIANT and lazy[0].status == "validate"
    assert "never written" in lazy[0].error
    assert result.failures == {"validate": 1}


def test_a_winning_llm_kernel_is_stored_and_served(tmp_path, monkeypatch):
    """When an LLM's kernel wins, its text goes into the database, and dispatch builds it from there."""
    import kernelsmith._tuner_search as search
    import kernelsmith.evaluate.confirm as confirm
    from kernelsmith import dispatch
    from kernelsmith.decide import Comparison

    # Interpreter timings decide nothing: declare every comparison won, so the search's best wins.
    won = lambda a, b: Comparison(2.0, 1.5, 2.5, True, len(a))
    monkeypatch.setattr(search, "compare", won)  # the final re-check of the search (kernelsmith.tuner)
    monkeypatch.setattr(confirm, "compare", won)  # and in the confirmation in fresh workers
    op = get_op("rmsnorm")
    spec = op.spec((8, 64), "float32")
    good = source("correct_rmsnorm")
    client = FakeClient([{"kernels": [_kernel("one_pass", good, {"num_warps": 4})]}])
    db = str(tmp_path / "win.db")
    result = tune_spec(spec, budget=1, strategy="llm", db=db, workers=1, client=client)
    assert result.winner == "kernel" and result.variant == SOURCE_VARIANT
    with open_database(db) as database:
        decision = database.get_decision(current_fingerprint().hash, spec.workload_hash)
        assert decision is not None and database.get_variant_source(decision.source_hash) == good
    runner = dispatch.build_runner(op, spec, decision, db=db)
    x, w = op.make_inputs(spec, seed=1, device="cpu")
    assert torch.allclose(runner((x, w))[0], op.reference_fp64(spec, (x, w))[0].float(), atol=1e-5, rtol=1e-5)


def test_llm_usage_is_in_the_tuning_cost(llm_tune):
    _, result, client, _ = llm_tune
    cost = result.cost
    assert cost.llm_requests == 3 and cost.llm_wall_s == pytest.approx(0.03)
    assert cost.llm_input_tokens == sum((len(c.system) + len(c.user)) // 4 for c in client.calls)
    assert cost.llm_output_tokens > 0 and cost.evaluations == 4


# ---- the clients, with their SDKs mocked -----------------------------------------------------------
class _Answer(BaseModel):
    text: str
    n: int = 0


def _sdk(name: str, **attributes: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    for key, value in attributes.items():
        setattr(module, key, value)
    return module


def test_anthropic_request_and_key_handling(monkeypatch, caplog):
    seen: dict[str, Any] = {}

    class Messages:
        def create(self, **request):
            seen["request"] = request
            if request["system"] == "fail":
                raise RuntimeError(f"401: invalid x-api-key {SECRET}")
            block = types.SimpleNamespace(type="tool_use", input={"text": "hi", "n": 2})
            return types.SimpleNamespace(
                content=[types.SimpleNamespace(type="text", text="..."), block],
                usage=types.SimpleNamespace(input_tokens=120, output_tokens=30),
                stop_reason="tool_use",
            )

    class Anthropic:
        def __init__(self, **options):
            seen["options"] = options
            self.messages = Messages()

    monkeypatch.setitem(sys.modules, "anthropic", _sdk("anthropic", Anthropic=Anthropic))
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    monkeypatch.setenv("KERNELSMITH_LLM_MODEL", "model-from-env")
    client = make_client("anthropic", max_tokens=1000)
    with caplog.at_level(logging.DEBUG):
        answer, usage = client.complete("be brief", "say hi", _Answer)
        with pytest.raises(LLMError) as failure:
            client.complete("fail", "say hi", _Answer)
    assert answer == _Answer(text="hi", n=2) and usage.input_tokens == 120 and usage.output_tokens == 30
    assert usage.requests == 1
    request = seen["request"]
    assert request["model"] == "model-from-env" and request["max_tokens"] == 1000 and request["system"] == "fail"
    assert request["messages"] == [{"role": "user", "content": "say hi"}]
    assert request["tools"][0]["input_schema"] == _Answer.model_json_schema()
    assert request["tool_choice"] == {"type": "tool", "name": request["tools"][0]["name"]}
    assert seen["options"]["api_key"] == SECRET  # handed to the SDK, and nowhere else:
    assert SECRET not in repr(client) and SECRET not in str(failure.value) and "***" in str(failure.value)
    assert failure.value.__cause__ is None and failure.value.usage.requests == 1
    assert SECRET not in caplog.text


def test_anthropic_needs_a_key_and_a_model(monkeypatch):
    monkeypatch.setitem(sys.modules, "anthropic", _sdk("anthropic", Anthropic=lambda **kw: None))
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("KERNELSMITH_LLM_MODEL", raising=False)
    with pytest.raises(ValueError, match="KERNELSMITH_LLM_MODEL"):
        make_client("anthropic")
    with pytest.raises(ValueError, match="ANTHROPIC_API_KEY"):
        make_client("anthropic", model="m")


def test_openai_compatible_request_base_url_and_json_modes(monkeypatch, caplog):
    seen: dict[str, Any] = {}
    replies = iter(['{"text": "a"}', '```json\n{"text": "b", "n": 1}\n```', '{"n": "not a number"}'])

    class Completions:
        def create(self, **request):
            seen.setdefault("requests", []).append(request)
            message = types.SimpleNamespace(content=next(replies), refusal=None)
            return types.SimpleNamespace(
                choices=[types.SimpleNamespace(message=message)],
                usage=types.SimpleNamespace(prompt_tokens=11, completion_tokens=4),
            )

    class OpenAI:
        def __init__(self, **options):
            seen["options"] = options
            self.chat = types.SimpleNamespace(completions=Completions())

    monkeypatch.setitem(sys.modules, "openai", _sdk("openai", OpenAI=OpenAI))
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://localhost:8000/v1")
    client = make_client("openai", model="served-model")
    with caplog.at_level(logging.DEBUG):
        answer, usage = client.complete("sys", "user", _Answer)
    assert answer.text == "a" and (usage.input_tokens, usage.output_tokens, usage.requests) == (11, 4, 1)
    assert seen["options"]["api_key"] == SECRET and seen["options"]["base_url"] == "http://localhost:8000/v1"
    first = seen["requests"][0]
    assert first["model"] == "served-model" and first["messages"][0] == {"role": "system", "content": "sys"}
    assert first["response_format"]["type"] == "json_schema"
    assert first["response_format"]["json_schema"]["schema"] == _Answer.model_json_schema()
    assert SECRET not in repr(client) and SECRET not in caplog.text
    # JSON mode: the schema goes into the system prompt; a fenced answer still parses
    json_mode = make_client("openai", model="m", response_format="json_object")
    assert json_mode.complete("sys", "user", _Answer)[0] == _Answer(text="b", n=1)
    assert seen["requests"][1]["response_format"] == {"type": "json_object"}
    assert '"title":"_Answer"' in seen["requests"][1]["messages"][0]["content"]
    with pytest.raises(LLMError, match="does not fit the schema") as failure:
        json_mode.complete("sys", "user", _Answer)
    assert failure.value.usage.input_tokens == 11  # tokens were spent all the same


def test_openai_compatible_local_server_without_a_key(monkeypatch):
    seen: dict[str, Any] = {}
    monkeypatch.setitem(sys.modules, "openai", _sdk("openai", OpenAI=lambda **options: seen.update(options)))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ValueError, match="OPENAI_API_KEY"):
        make_client("openai", model="m")
    make_client("openai", model="m", base_url="http://127.0.0.1:8080/v1")
    assert seen["api_key"] == "unused" and seen["base_url"] == "http://127.0.0.1:8080/v1"


def test_ollama_request_host_and_context(monkeypatch, caplog):
    seen: dict[str, Any] = {}

    class Client:
        def __init__(self, **options):
            seen["options"] = options

        def chat(self, **request):
            seen["request"] = request
            return {"message": {"content": '{"text": "local"}'}, "prompt_eval_count": 70, "eval_count": 9}

    monkeypatch.setitem(sys.modules, "ollama", _sdk("ollama", Client=Client))
    host = f"http://user:{SECRET}@gpu-box:11434"
    monkeypatch.setenv("OLLAMA_HOST", host)
    client = make_client("ollama", model="coder", num_ctx=16384)
    with caplog.at_level(logging.DEBUG):
        answer, usage = client.complete("sys", "user", _Answer)
    assert answer.text == "local" and (usage.input_tokens, usage.output_tokens) == (70, 9)
    assert seen["options"]["host"] == host
    request = seen["request"]
    assert request["model"] == "coder" and request["format"] == _Answer.model_json_schema()
    assert request["options"]["num_ctx"] == 16384 and request["stream"] is False
    assert request["messages"][0]["content"].startswith("sys\n\nAnswer with a single JSON object")
    assert SECRET not in repr(client) and SECRET not in caplog.text


def test_a_missing_sdk_says_which_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "anthropic", None)  # import fails
    monkeypatch.setitem(sys.modules, "ollama", None)
    with pytest.raises(ImportError, match=re.escape("pip install -e '.[llm]'")):
        make_client("anthropic", model="m", api_key="k")
    with pytest.raises(ImportError, match=re.escape("pip install -e '.[ollama]'")):
        make_client("ollama", model="m")
    with pytest.raises(ValueError, match="unknown LLM provider"):
        make_client("palm", model="m")


def test_a_failing_client_inside_the_strategy_never_logs_the_key(monkeypatch, caplog):
    class Messages:
        def create(self, **request):
            raise ConnectionError(f"could not reach the API with key {SECRET}")

    monkeypatch.setitem(sys.modules, "anthropic", _sdk("anthropic", Anthropic=lambda **o: types.SimpleNamespace(
        messages=Messages())))
    client = make_client("anthropic", model="m", api_key=SECRET)
    strategy = LLMSearch(client, budget=3, sources=False)
    with caplog.at_level(logging.DEBUG):
        trace = replay(strategy, SPACE, budget=3)
    assert len(trace) == 3 and "LLM proposals failed" in caplog.text and SECRET not in caplog.text
    assert all(SECRET not in r.error for r in strategy.rounds)


def test_schemas_are_plain_pydantic_models():
    assert set(Round.model_fields) == {"candidates", "kernels"} and set(ParamRound.model_fields) == {"candidates"}
    assert Round.model_validate({}).candidates == []
