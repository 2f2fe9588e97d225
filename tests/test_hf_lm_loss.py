"""The opt-in fused LM loss of Hugging Face causal LMs (kernelsmith.hf.fuse_lm_loss): the loss
and the gradient of every parameter against a float64 run of the model's own forward, with the
fused kernel really served (interpreter, float32, tiny configs: hidden 32, vocabulary 1000/1001,
2 layers, 16 tokens), ``logits`` None exactly when documented, and the models it refuses."""

from __future__ import annotations

import copy
import dataclasses
import logging

import pytest
import torch
from torch import nn

from kernelsmith.db import DecisionRecord, current_fingerprint, open_database
from kernelsmith.frontends import hf_lm_loss
from kernelsmith.hf import fuse_lm_loss, refusal, unfuse_lm_loss
from kernelsmith.ops import get_op

transformers = pytest.importorskip("transformers")

FUSED = get_op("linear_cross_entropy_fused")
FORWARD = get_op("linear_cross_entropy")
HIDDEN, VOCAB, BATCH, SEQ = 32, 1000, 2, 8


def _config_fast_in_the_interpreter(family, spec):
    """The widest tiles of the family's space for ``spec``: fewest programs, the interpreter's
    quickest config (tests time correctness, not speed)."""
    configs = list(family.variants[0].space(family.bucket(spec)).configs())
    return max(configs, key=lambda c: (c.get("CHUNK", 0), c["BLOCK_M"] * c["BLOCK_N"] * c["BLOCK_K"],
                                       c.get("BLOCK_V", 0), -c["num_stages"]))  # fmt: skip


def _store(db: str, family, tokens: int, vocab: int, bias: bool = False, record=None, **constants) -> None:
    """A stored winner for the LM-head workload of ``tokens`` x ``HIDDEN`` x ``vocab`` (float32),
    as a tuning run in the interpreter would have stored it (``record``: fields of the
    DecisionRecord that differ, e.g. a baseline win keeping its best candidate)."""
    inputs = [torch.zeros(tokens, HIDDEN), torch.zeros(vocab, HIDDEN), torch.zeros(tokens, dtype=torch.int64)]
    inputs += [torch.zeros(vocab)] if bias else []
    spec = family.spec_for(*inputs, **{"reduction": "mean", "ignore_index": -100, "label_smoothing": 0.0,
                                       "softcap": None, **constants})  # fmt: skip
    bucket = family.bucket(spec)
    variant = family.variants[0]
    fp = current_fingerprint("interpreter")
    with open_database(db) as database:
        database.put_fingerprint(fp)
        database.put_decision(dataclasses.replace(DecisionRecord(
            fp.hash, bucket.workload_hash, family.name, bucket.to_dict(), "kernel", variant.name,
            variant.source_hash, _config_fast_in_the_interpreter(family, spec).to_dict(),
            {"note": "a test"}), **(record or {})))  # fmt: skip


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("hf_lm_loss") / "k.db")
    tokens = BATCH * SEQ
    _store(path, FUSED, tokens, VOCAB)
    _store(path, FUSED, tokens, VOCAB + 1, bias=True, reduction="sum")
    _store(path, FUSED, tokens, VOCAB, softcap=30.0)
    _store(path, FUSED, 1, VOCAB, reduction="sum")
    _store(path, FORWARD, tokens, VOCAB)
    return path


@pytest.fixture(autouse=True)
def _no_serve_checks(monkeypatch) -> None:
    """Each test compares with float64 itself; the serve checks' extra interpreter runs of the
    first calls would only slow the suite down."""
    monkeypatch.setenv("KERNELSMITH_CHECK", "0")


def _llama(vocab: int = VOCAB, tied: bool = False, cls=None, **extra) -> nn.Module:
    config_cls, model_cls = cls or (transformers.LlamaConfig, transformers.LlamaForCausalLM)
    config = config_cls(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=tied,
                        **extra)  # fmt: skip
    torch.manual_seed(0)
    return model_cls(config).train()


def _ids(vocab: int = VOCAB, batch: int = BATCH, seq: int = SEQ) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(3))


def _step(model: nn.Module, **kwargs):
    """The model's output and the gradient of every parameter after ``output.loss.backward()``."""
    model.zero_grad(set_to_none=True)
    out = model(**kwargs)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() if p.grad is not None else None for n, p in model.named_parameters()}
    return out, grads


def _autograd_nodes(fn, depth: int) -> set[str]:
    """The names of the autograd nodes within ``depth`` steps of ``fn``."""
    if fn is None:
        return set()
    names = {type(fn).__name__}
    for parent, _ in fn.next_functions if depth > 0 else ():
        names |= _autograd_nodes(parent, depth - 1)
    return names


def _assert_matches_float64(model: nn.Module, db: str, **kwargs) -> None:
    """The fused loss and every gradient within float32's reach of the model's own forward run in
    float64: no farther from it than 4x the model's own float32 run plus a small floor."""
    wide = copy.deepcopy(model).double()
    want, want_grads = _step(wide, **kwargs)
    own, own_grads = _step(model, **kwargs)
    fused_model = fuse_lm_loss(model, tune=False, db=db)
    try:
        got, got_grads = _step(fused_model, **kwargs)
    finally:
        unfuse_lm_loss(model)
    assert got.logits is None and own.logits is not None
    assert "_FusedLinearCrossEntropyBackward" in _autograd_nodes(got.loss.grad_fn, depth=2)
    assert not hf_lm_loss.fallback_reasons(fused_model), "the op ran its reference, not the kernel"

    def close(name, x, ref, base):
        if ref is None:
            assert x is None, name
            return
        err, own_err = (x.double() - ref).abs().max(), (base.double() - ref).abs().max()
        bound = 4 * own_err + 1e-6 * (1 + ref.abs().max())
        assert err <= bound, (
            f"{name}: error {float(err):.3g} vs float64 (the model's own float32: {float(own_err):.3g})"
        )

    close("loss", got.loss.detach(), want.loss.detach(), own.loss.detach())
    for name, ref in want_grads.items():
        close(name, got_grads[name], ref, own_grads[name])


# ---- loss and gradients against float64 ----------------------------------------------------------


@pytest.mark.parametrize("ignored", [0, 5], ids=["all-labels", "some-ignored"])
def test_the_loss_and_every_gradient_match_float64(db, ignored) -> None:
    labels = _ids()
    labels.view(-1)[torch.randperm(labels.numel(), generator=torch.Generator().manual_seed(1))[:ignored]] = -100
    _assert_matches_float64(_llama(), db, input_ids=_ids(), labels=labels)


def test_a_tied_head_with_a_bias_summed_over_num_items_in_batch(db) -> None:
    """Vocabulary 1001 (no power of two), the head tied to the embedding and given a bias, and
    Hugging Face's ``num_items_in_batch`` (the loss a sum, divided outside the op)."""
    model = _llama(VOCAB + 1, tied=True)
    model.lm_head.bias = nn.Parameter(torch.randn(VOCAB + 1) * 0.1)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ids = _ids(VOCAB + 1)
    _assert_matches_float64(model, db, input_ids=ids, labels=ids, num_items_in_batch=torch.tensor(11))


def test_every_label_ignored_gives_hf_nan_mean_and_a_zero_sum(db) -> None:
    ids = _ids()
    labels = torch.full_like(ids, -100)
    model = fuse_lm_loss(_llama(), tune=False, db=db)
    assert torch.isnan(model(input_ids=ids, labels=labels).loss)  # a mean over no token, as F.cross_entropy
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=labels, num_items_in_batch=torch.tensor(4))
    out.loss.backward()
    assert float(out.loss.detach()) == 0.0
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())


def test_one_token_with_shift_labels_given(db) -> None:
    """A single token whose (already shifted) label is given: ``shift_labels`` as HF takes it."""
    ids = _ids(batch=1, seq=1)
    _assert_matches_float64(_llama(), db, input_ids=ids, labels=ids, shift_labels=torch.tensor([[7]]),
                            num_items_in_batch=1)  # fmt: skip


@pytest.mark.parametrize("name", ["Mistral", "Qwen2", "Gemma2"])
def test_the_other_known_families(db, name) -> None:
    """Mistral and Qwen2 share the Llama head's workload; Gemma 2 soft-caps its logits at 30."""
    if not hasattr(transformers, f"{name}ForCausalLM"):
        pytest.skip(f"this transformers has no {name}ForCausalLM")
    classes = (getattr(transformers, f"{name}Config"), getattr(transformers, f"{name}ForCausalLM"))
    extra = {"final_logit_softcapping": 30.0, "attn_logit_softcapping": None} if name == "Gemma2" else {}
    model = _llama(cls=classes, **extra)
    assert refusal(model) is None
    ids = _ids()
    _assert_matches_float64(model, db, input_ids=ids, labels=ids)


# ---- memory for time: a kernel that lost on time, served within max_slowdown ----------------------


def _baseline_win(db: str, candidate_us: float, **record) -> None:
    """The LM-head workload's decision as a search that lost on time stores it: the baseline
    wins, the best candidate measured kept with its and the reference's median times."""
    times = {"median_us": candidate_us, "baseline_median_us": 100.0, "note": "a test"}
    _store(db, FUSED, BATCH * SEQ, VOCAB, record={"winner": "baseline", "metrics": times, **record})


def _fused_step(db: str, caplog, **options):
    """One training call of the patched model: its output, its fallback reasons and trades, and
    what the fused loss logged."""
    model = fuse_lm_loss(_llama(), tune=False, db=db, **options)
    try:
        with caplog.at_level(logging.INFO, logger="kernelsmith.frontends.hf_lm_loss"):
            out = model(input_ids=_ids(), labels=_ids())
        return out, hf_lm_loss.fallback_reasons(model), hf_lm_loss.tradeoffs(model), caplog.text
    finally:
        unfuse_lm_loss(model)


def test_a_kernel_that_lost_by_a_small_margin_serves_for_memory_and_says_what_it_traded(
    tmp_path, caplog, monkeypatch
) -> None:
    """1.3x the reference's time is within the default margin (0.5): the candidate is checked
    against float64 and served (the op's reference never runs; logits None, the loss and
    gradients as the model's float64 run's), and the log and tradeoffs() say how much slower, for
    how many MiB of logits; with max_slowdown=0 the same decision runs the reference, as a
    time-first decision says."""
    from kernelsmith import dispatch

    references = []  # the ops whose PyTorch reference kernelsmith::kernel ran
    real_reference = dispatch._reference
    monkeypatch.setattr(dispatch, "_reference", lambda op, *args: references.append(op) or real_reference(op, *args))
    db = str(tmp_path / "k.db")
    _baseline_win(db, candidate_us=130.0)
    out, reasons, traded, logged = _fused_step(db, caplog)
    assert out.logits is None and not reasons and not references
    (what,) = traded.values()
    logits_mib = f"{BATCH * SEQ * VOCAB * 4 / 2**20:.1f} MiB in float32"
    assert "1.30x the time of the PyTorch reference" in what and logits_mib in what, what
    assert what in logged
    _assert_matches_float64(_llama(), db, input_ids=_ids(), labels=_ids())  # the kernel really serves
    caplog.clear()
    out, reasons, traded, logged = _fused_step(db, caplog, max_slowdown=0)
    assert not traded and out.logits is None  # (the patch still returns no logits: the op's reference ran)
    (why,) = reasons.values()
    assert why.startswith("baseline wins") and "not served for memory" not in why
    assert "runs its PyTorch reference" in logged and references == [FUSED.name]


def test_a_kernel_beyond_the_margin_is_not_served(tmp_path, caplog) -> None:
    db = str(tmp_path / "k.db")
    _baseline_win(db, candidate_us=151.0)  # 1.51x: just beyond the default 1.5x
    _, reasons, traded, logged = _fused_step(db, caplog)
    (why,) = reasons.values()
    assert not traded and "1.51x the reference's time, beyond max_slowdown=0.5" in why, why
    assert why in logged
    _, reasons, traded, _ = _fused_step(db, caplog, max_slowdown=0.6)  # the user's own margin admits it
    assert not reasons and "1.51x" in next(iter(traded.values()))


@pytest.mark.parametrize(
    ("record", "why"),
    [
        (
            {"variant": "", "source_hash": "", "config": {}, "metrics": {"note": "no candidate passed validation"}},
            "no candidate that passed validation (no candidate passed validation)",
        ),
        ({"origin": "imported", "validated": False}, "claim in state 'unvalidated'"),
        ({"origin": "imported", "validation_error": "wrong outputs"}, "claim in state 'failed'"),
        ({"metrics": {"note": "a test"}}, "does not hold both"),
    ],
    ids=["no-validated-candidate", "unvalidated-claim", "failed-claim", "no-times"],
)
def test_a_decision_without_a_validated_timed_candidate_is_never_served(tmp_path, caplog, record, why) -> None:
    """Whatever the margin (here any time at all), a baseline decision whose search had no
    candidate pass validation, an imported claim not validated here (or failed), or a record
    without both times runs the reference."""
    db = str(tmp_path / "k.db")
    _baseline_win(db, candidate_us=101.0, **record)
    _, reasons, traded, _ = _fused_step(db, caplog, max_slowdown=float("inf"))
    assert not traded and why in next(iter(reasons.values())), reasons


def test_a_candidate_that_fails_the_float64_check_at_this_shape_is_not_served(tmp_path, caplog, monkeypatch) -> None:
    """The traded candidate goes through the winners' check on fresh inputs against float64:
    a runner whose outputs are off (here by 1e-2) is not served."""
    from kernelsmith import dispatch

    real = dispatch.build_runner

    def off_by_a_little(*args, **kwargs):
        runner = real(*args, **kwargs)
        return lambda inputs: [out + 1e-2 for out in runner(inputs)]

    monkeypatch.setattr(dispatch, "build_runner", off_by_a_little)
    db = str(tmp_path / "k.db")
    _baseline_win(db, candidate_us=110.0)
    _, reasons, traded, _ = _fused_step(db, caplog)
    (why,) = reasons.values()
    assert not traded and "not served for memory either: check failed" in why, why


@pytest.mark.parametrize("bad", [-0.1, float("nan"), "0.5"])
def test_max_slowdown_must_be_a_number_at_least_0(bad) -> None:
    with pytest.raises(ValueError, match="max_slowdown must be a number >= 0"):
        fuse_lm_loss(_llama(), max_slowdown=bad)


# ---- when logits are returned --------------------------------------------------------------------


def test_the_models_own_forward_runs_where_logits_are_wanted(db) -> None:
    """No labels, eval mode, no_grad, ``skip_logits=False`` or ``logits_to_keep``: Hugging Face's
    forward unchanged (logits returned, the same loss); ``skip_logits=True`` without labels is an
    error, and in eval mode with labels it gives the forward-only fused loss."""
    model = fuse_lm_loss(_llama(), tune=False, db=db)
    ids = _ids()
    assert model(input_ids=ids).logits.shape == (BATCH, SEQ, VOCAB)
    assert model(input_ids=ids, labels=ids, skip_logits=False).logits is not None
    with pytest.raises(ValueError, match="batch_size"):  # HF's own error: 1 position's logits, 16 labels
        model(input_ids=ids, labels=ids, logits_to_keep=1)
    with torch.no_grad():
        assert model(input_ids=ids, labels=ids).logits is not None
    with pytest.raises(ValueError, match="needs labels"):
        model(input_ids=ids, skip_logits=True)
    model.eval()
    own = model(input_ids=ids, labels=ids)
    assert own.logits is not None
    with torch.no_grad():
        fused = model(input_ids=ids, labels=ids, skip_logits=True)
    assert fused.logits is None and not hf_lm_loss.fallback_reasons(model)
    torch.testing.assert_close(fused.loss, own.loss, rtol=1e-5, atol=1e-6)
    assert isinstance(model(input_ids=ids, labels=ids, return_dict=False, skip_logits=True), tuple)


def test_under_torch_compile_one_graph_and_the_same_loss(db) -> None:
    """Compiled before any eager call: the kernel is resolved while Dynamo traces, the whole
    forward is one graph without breaks, the kernel serves, and the loss is the eager call's."""
    from torch._dynamo.testing import CompileCounter

    model = fuse_lm_loss(_llama(), tune=False, db=db)
    ids = _ids()
    torch._dynamo.reset()
    counter = CompileCounter()
    out = torch.compile(model, backend=counter)(input_ids=ids, labels=ids)
    out.loss.backward()
    assert counter.frame_count == 1, f"{counter.frame_count} graphs: a graph break"
    assert out.logits is None and not hf_lm_loss.fallback_reasons(model)
    eager = model(input_ids=ids, labels=ids).loss.detach()
    torch.testing.assert_close(out.loss.detach(), eager, rtol=1e-5, atol=1e-6)
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0
    torch._dynamo.reset()


# ---- refusals ------------------------------------------------------------------------------------


class _OwnForward(transformers.LlamaForCausalLM):
    def forward(self, *args, **kwargs):  # a subclass's forward kernelsmith does not know
        return super().forward(*args, **kwargs)


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: nn.Linear(4, 4), "not one of the Hugging Face causal LMs"),
        (lambda: _OwnForward(_llama().config), "is not LlamaForCausalLM's own"),
        (lambda: _with(_llama(), lm_head=nn.Identity()), "no nn.Linear lm_head"),
        (lambda: _with(_llama(), loss_type="ForMaskedLM"), "not ForCausalLMLoss"),
    ],
    ids=["not-hf", "own-forward", "no-linear-head", "other-loss"],
)
def test_unknown_forwards_are_left_unchanged_and_say_why(make, reason, caplog) -> None:
    model = make()
    with caplog.at_level(logging.WARNING, logger="kernelsmith.frontends.hf_lm_loss"):
        assert fuse_lm_loss(model) is model
    assert reason in (refusal(model) or "")
    assert reason in caplog.text
    assert "forward" not in vars(model)


def _with(model: nn.Module, **attributes) -> nn.Module:
    for name, value in attributes.items():
        setattr(model, name, value)
    return model


def test_unfuse_restores_the_models_forward(db) -> None:
    model = _llama()
    fuse_lm_loss(model, tune=False, db=db)
    assert hf_lm_loss.is_fused(model) and fuse_lm_loss(model, tune=False, db=db) is model
    unfuse_lm_loss(model)
    assert not hf_lm_loss.is_fused(model) and "forward" not in vars(model)
    ids = _ids()
    assert model(input_ids=ids, labels=ids).logits is not None


# ---- optimize_model(skip_logits=True) ------------------------------------------------------------


@pytest.mark.slow  # profiling, discovery and compiling a model in the interpreter: minutes on two cores
def test_optimize_model_skip_logits_patches_the_model_and_reports_it(db) -> None:
    from kernelsmith.whole_model.optimize import optimize_model

    model = _llama()
    ids = _ids()
    try:
        compiled, report = optimize_model(model, example_kwargs={"input_ids": ids, "labels": ids}, train=True,
                                          budget=0, db=db, skip_logits=True, compare=False)  # fmt: skip
        assert report["skip_logits"]["patched"] and report["skip_logits"]["refusal"] is None
        assert report["skip_logits"]["fallbacks"] == {}
        out = compiled(input_ids=ids, labels=ids)
        assert out.logits is None and torch.isfinite(out.loss)
    finally:
        unfuse_lm_loss(model)
        torch._dynamo.reset()


# ---- the training-step table's row ---------------------------------------------------------------


def test_the_side_by_side_steps_have_a_fused_loss_row(db, monkeypatch) -> None:
    """``compare_executions(fused_loss=...)``: the patched model's step agrees with eager's and the
    patch is undone afterwards; a model the patch does not know gets the row, skipped, saying why."""
    from kernelsmith.whole_model import train_step as ts

    monkeypatch.setattr(torch, "compile", lambda fn, **_: fn)  # (the row's own compile is not under test)
    model, ids = _llama(), _ids()
    results = ts.compare_executions(model, (), {"input_ids": ids, "labels": ids}, liger=False, warmup=0,
                                    iterations=1, fused_loss={"db": db, "tune": False})  # fmt: skip
    by = {r.name: r for r in results}
    assert list(by) == ["eager", "torch.compile", "kernelsmith", ts.FUSED_LOSS_ROW, "liger"]
    assert by[ts.FUSED_LOSS_ROW].agrees, by[ts.FUSED_LOSS_ROW]
    assert by[ts.FUSED_LOSS_ROW].loss_rel < 1e-5
    assert not hf_lm_loss.is_fused(model)
    plain = nn.Sequential(nn.Linear(4, 4))
    results = ts.compare_executions(plain, (torch.randn(2, 4),), liger=False, warmup=0, iterations=1, fused_loss={})
    assert "not one of the Hugging Face causal LMs" in {r.name: r.skipped for r in results}[ts.FUSED_LOSS_ROW]
