"""@kernelsmith.optimize: fallbacks, modes, bucketing, autograd, dispatch, fresh processes.

These run in the Triton interpreter on CPU tensors (conftest sets TRITON_INTERPRET=1, which the
decorator honours as an explicit request). Interpreter timings can never beat PyTorch, so a tune
here always ends with "the baseline wins"; tests of the kernel path store a winner directly, as
a GPU run would have.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import kernelsmith
from kernelsmith.db import DecisionRecord, current_fingerprint, open_database
from kernelsmith.evaluate.errors import check_close
from kernelsmith.ops import get_op
from kernelsmith.spec import OpSpec


def hf_rmsnorm(x, weight, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def last_dim_softmax(x):
    return torch.softmax(x, dim=-1)


def store_decision(db: str, spec: OpSpec, winner: str = "kernel", variant: str = "whole_row",
                   source_hash: str | None = None) -> OpSpec:
    """Store a decision for the bucket of ``spec`` as a GPU run would have."""
    family = get_op(spec.op)
    bucket = family.bucket(spec)
    v = family.variant(variant) if variant in [x.name for x in family.variants] else family.variants[0]
    config = v.space(bucket).configs()[0]
    fp = current_fingerprint("interpreter")
    with open_database(db) as database:
        database.put_fingerprint(fp)
        database.put_decision(DecisionRecord(
            fp.hash, bucket.workload_hash, spec.op, bucket.to_dict(), winner, variant,
            v.source_hash if source_hash is None else source_hash, config.to_dict(),
            {"note": "stored by a test"}))
    return bucket


@pytest.fixture
def db(tmp_path) -> str:
    return str(tmp_path / "decorator.db")


def test_bucketing_policy():
    rms = get_op("rmsnorm")
    assert rms.bucket(rms.spec((5000, 4096), "bf16")).inputs[0].shape == (8192, 4096)
    assert rms.bucket(rms.spec((2, 3, 64), "bf16")).inputs[0].shape == (8, 64)
    assert rms.bucket(rms.spec((1, 64), "bf16")).inputs[0].shape == (1, 64)
    assert rms.bucket(rms.spec((8192, 64), "bf16")).inputs[0].shape == (8192, 64)
    # The weight and constants are untouched; other widths are other buckets.
    bucket = rms.bucket(rms.spec((5, 64), "bf16"))
    assert bucket.inputs[1].shape == (64,) and bucket.const("eps") == 1e-6
    assert bucket != rms.bucket(rms.spec((5, 65), "bf16"))


def test_stored_kernel_is_dispatched_and_correct(db):
    x, w = torch.randn(6, 96), torch.randn(96)
    store_decision(db, get_op("rmsnorm").spec_for(x, w, eps=1e-6))
    fn = kernelsmith.optimize(hf_rmsnorm, mode="db", db=db)
    first = fn(x, w)  # the slow path: recognize, check, build, trial run; returns the original's
    assert fn.kernelsmith.stats["kernel_calls"] == 0
    for _ in range(3):
        y = fn(x, w)
    assert fn.kernelsmith.stats["kernel_calls"] == 3 and fn.kernelsmith.stats["tunes"] == 0
    spec = get_op("rmsnorm").spec_for(x, w, eps=1e-6)
    ref64 = get_op("rmsnorm").reference_fp64(spec, (x, w))[0]
    assert check_close(y, ref64, first, get_op("rmsnorm").tolerance) is None


def test_same_bucket_serves_another_row_count_without_tuning(db):
    w = torch.randn(64)
    store_decision(db, get_op("rmsnorm").spec_for(torch.randn(7, 64), w, eps=1e-6))  # bucket of 8 rows
    fn = kernelsmith.optimize(hf_rmsnorm, db=db)  # tune mode: would tune a missing bucket
    for rows in (5, 6, 7, 8):
        x = torch.randn(rows, 64)
        fn(x, w)
        y = fn(x, w)
        assert y.shape == (rows, 64)
    assert fn.kernelsmith.stats["tunes"] == 0 and fn.kernelsmith.stats["kernel_calls"] == 4


def test_tune_mode_tunes_once_then_a_new_function_reuses_the_database(db):
    x = torch.randn(3, 40)
    fn = kernelsmith.optimize(last_dim_softmax, budget=2, strategy="grid", db=db)
    expected = torch.softmax(x, -1)
    assert torch.equal(fn(x), expected)
    assert fn.kernelsmith.stats["tunes"] == 1 and fn.kernelsmith.stats["evaluations"] == 2
    assert "baseline wins" in next(iter(fn.kernelsmith.reasons.values()))
    assert torch.equal(fn(x), expected)
    again = kernelsmith.optimize(last_dim_softmax, budget=2, db=db)
    again(x)
    assert again.kernelsmith.stats["tunes"] == 0 and again.kernelsmith.stats["evaluations"] == 0


def test_db_mode_never_tunes(db, monkeypatch):
    monkeypatch.setenv("KERNELSMITH_MODE", "db")
    fn = kernelsmith.optimize(last_dim_softmax, db=db)  # mode from the environment
    x = torch.randn(4, 32)
    assert torch.equal(fn(x), torch.softmax(x, -1))
    assert fn.kernelsmith.stats["tunes"] == 0
    assert "database-only" in next(iter(fn.kernelsmith.reasons.values()))


def test_background_mode_runs_the_original_then_picks_up_the_decision(db):
    x = torch.randn(4, 48)
    fn = kernelsmith.optimize(last_dim_softmax, mode="background", budget=1, db=db)
    assert torch.equal(fn(x), torch.softmax(x, -1))
    state = fn.kernelsmith
    assert state.background is not None
    state.background.join(timeout=300)
    assert not state.background.is_alive() and state.stats["tunes"] == 1
    fn(x)  # resolves again: the decision is in the database now (the baseline wins here)
    assert "baseline wins" in next(iter(state.reasons.values()))
    assert state.stats["tunes"] == 1


def test_unknown_mode_is_an_error():
    with pytest.raises(ValueError, match="mode"):
        kernelsmith.optimize(last_dim_softmax, mode="sometimes")


def test_bare_decorator_and_metadata_are_kept(db):
    @kernelsmith.optimize
    def doubled(x):
        """Doc."""
        return x * 2

    x = torch.randn(3, 5)
    assert torch.equal(doubled(x), x * 2) and doubled.__doc__ == "Doc." and doubled.__name__ == "doubled"
    assert "no op recognized" in next(iter(doubled.kernelsmith.reasons.values()))


@pytest.mark.parametrize("case", ["cpu_without_interpreter", "float64", "non_contiguous", "baseline_wins",
                                  "missing_variant", "stale_source"])
def test_fallbacks_return_the_original_result(case, db, monkeypatch):
    x, w = torch.randn(6, 32), torch.randn(32)
    if case == "cpu_without_interpreter":
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        monkeypatch.delenv("KERNELSMITH_INTERPRET", raising=False)
    elif case == "float64":
        x, w = x.double(), w.double()
    elif case == "non_contiguous":
        x = torch.randn(32, 6).t()
    elif case == "baseline_wins":
        store_decision(db, get_op("rmsnorm").spec_for(x, w, eps=1e-6), winner="baseline")
    elif case == "missing_variant":
        store_decision(db, get_op("rmsnorm").spec_for(x, w, eps=1e-6), variant="no_such_variant")
    elif case == "stale_source":
        store_decision(db, get_op("rmsnorm").spec_for(x, w, eps=1e-6), source_hash="0" * 16)
    fn = kernelsmith.optimize(hf_rmsnorm, mode="db", db=db)
    for _ in range(3):
        assert torch.equal(fn(x, w), hf_rmsnorm(x, w))
    stats = fn.kernelsmith.stats
    assert stats["kernel_calls"] == 0 and stats["fallback_calls"] == 3 and stats["tunes"] == 0


def test_a_failing_stored_kernel_is_logged_once(db, caplog):
    x, w = torch.randn(6, 32), torch.randn(32)
    store_decision(db, get_op("rmsnorm").spec_for(x, w, eps=1e-6), variant="no_such_variant")
    fn = kernelsmith.optimize(hf_rmsnorm, mode="db", db=db)
    with caplog.at_level(logging.INFO, logger="kernelsmith.frontends.decorator"):
        for _ in range(4):
            fn(x, w)
    assert sum("not used" in r.getMessage() for r in caplog.records) == 1


def test_gradients_flow_through_the_original_function(db):
    x = torch.randn(6, 32, requires_grad=True)
    w = torch.randn(32, requires_grad=True)
    store_decision(db, get_op("rmsnorm").spec_for(x.detach(), w.detach(), eps=1e-6))
    fn = kernelsmith.optimize(hf_rmsnorm, mode="db", db=db)
    fn(x, w).square().sum().backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    hf_rmsnorm(x, w).square().sum().backward()
    assert torch.allclose(gx, x.grad) and torch.allclose(gw, w.grad)
    assert fn.kernelsmith.stats["kernel_calls"] == 0
    # Without grad the same shapes may use the kernel.
    with torch.no_grad():
        fn(x, w)
        fn(x, w)
    assert fn.kernelsmith.stats["kernel_calls"] == 1


def test_a_recognizer_mistake_is_caught_by_the_numerical_check(db, monkeypatch):
    """A function that is *not* RMSNorm, wrongly matched as RMSNorm, keeps running as written."""
    from kernelsmith.frontends import decorator, recognize

    def scaled(x, weight, eps=1e-6):  # RMSNorm-like, but with the weight on the wrong axis
        return hf_rmsnorm(x, torch.ones_like(weight)) * weight.mean()

    real = recognize.recognize

    def wrong(fn, args, kwargs):
        result = real(hf_rmsnorm, args, kwargs)
        return recognize.Recognition(result.match, fn(*args, **kwargs), "")

    monkeypatch.setattr(decorator, "recognize", wrong)
    x, w = torch.randn(6, 32), torch.randn(32) + 2
    store_decision(db, get_op("rmsnorm").spec_for(x, w, eps=1e-6))
    fn = kernelsmith.optimize(scaled, mode="db", db=db)
    for _ in range(2):
        assert torch.equal(fn(x, w), scaled(x, w))
    assert fn.kernelsmith.stats["kernel_calls"] == 0
    assert "computes something else" in next(iter(fn.kernelsmith.reasons.values()))


def test_recognized_forms_reach_the_kernel(db):
    x, w = torch.randn(4, 64), torch.randn(64)
    store_decision(db, get_op("rmsnorm").spec_for(x, w, eps=1e-5))
    store_decision(db, get_op("softmax").spec_for(x))
    norm = torch.nn.RMSNorm(64, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(w)
    forms = [
        (lambda a, b: F.rms_norm(a, (64,), b, 1e-5), (x, w)),
        (lambda a: norm(a), (x,)),
        (lambda a: a.softmax(-1), (x,)),
        (lambda a: F.softmax(a, dim=1), (x,)),
    ]
    for function, args in forms:
        fn = kernelsmith.optimize(function, mode="db", db=db)
        with torch.no_grad():
            fn(*args)
            fn(*args)
        assert fn.kernelsmith.stats["kernel_calls"] == 1, fn.kernelsmith.reasons


def test_custom_op_has_a_fake_and_serves_the_stored_winner(db, monkeypatch):
    monkeypatch.setenv("KERNELSMITH_DB", db)
    x = torch.randn(5, 33)
    store_decision(db, get_op("softmax").spec_for(x))
    from kernelsmith import dispatch

    dispatch._RUNNERS.clear()
    out = torch.ops.kernelsmith.kernel("softmax", [x], '{"dim": -1}')[0]
    assert torch.allclose(out, torch.softmax(x, -1), atol=1e-6)
    key = next(k for k in dispatch._RUNNERS if k[0] == "softmax")
    assert dispatch._RUNNERS[key] is not None  # the stored kernel, not the reference
    torch.library.opcheck(torch.ops.kernelsmith.kernel.default, ("softmax", [x], '{"dim": -1}'),
                          test_utils=("test_schema", "test_faketensor"))


def test_fresh_process_serves_the_winner_with_zero_evaluations(db, tmp_path):
    x = torch.randn(6, 64)
    store_decision(db, get_op("softmax").spec_for(x))
    script = tmp_path / "fresh.py"
    script.write_text(textwrap.dedent(f"""
        import torch, kernelsmith
        @kernelsmith.optimize(db={db!r})
        def f(x):
            return torch.softmax(x, dim=-1)
        x = torch.randn(6, 64)
        f(x); y = f(x)
        s = f.kernelsmith.stats
        assert torch.allclose(y, torch.softmax(x, -1), atol=1e-6)
        print(s["kernel_calls"], s["tunes"], s["evaluations"])
    """))
    env = {**__import__("os").environ, "KERNELSMITH_INTERPRET": "1"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "0", "0"]


def test_a_replaced_module_weight_is_noticed(db):
    x = torch.randn(4, 64)
    norm = torch.nn.RMSNorm(64, eps=1e-5)
    store_decision(db, get_op("rmsnorm").spec_for(x, norm.weight.detach(), eps=1e-5))
    fn = kernelsmith.optimize(lambda a: norm(a), mode="db", db=db)
    with torch.no_grad():
        fn(x)
        fn(x)
        assert fn.kernelsmith.stats["kernel_calls"] == 1
        norm.weight = torch.nn.Parameter(torch.randn(64))  # a new tensor object, not an in-place update
        y = fn(x)
        assert torch.allclose(y, norm(x), atol=1e-5)  # the new weight, never the stale one


def test_tuned_forward_and_backward_run_as_one_autograd_node(db):
    x = torch.randn(6, 48, requires_grad=True)
    w = (torch.randn(48) * 0.5 + 1).requires_grad_()
    store_decision(db, get_op("rmsnorm").spec_for(x.detach(), w.detach(), eps=1e-6))
    dy = torch.randn(6, 48)
    backward_spec = get_op("rmsnorm_backward").spec_for(dy, x.detach(), w.detach(), eps=1e-6)
    store_decision(db, backward_spec, variant="two_stage")
    fn = kernelsmith.optimize(hf_rmsnorm, mode="db", db=db)
    fn(x, w)  # first call: recognize, check both runners on this call's inputs
    y = fn(x, w)
    assert fn.kernelsmith.stats["kernel_calls"] == 1, fn.kernelsmith.reasons
    assert y.grad_fn is not None and "KernelFunction" in type(y.grad_fn).__name__
    y.backward(dy)
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    hf_rmsnorm(x, w).backward(dy)
    assert gx.dtype == x.dtype and gw.dtype == w.dtype
    torch.testing.assert_close(gx, x.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(gw, w.grad, atol=1e-5, rtol=1e-4)


def test_bucketing_reshapes_companion_activations_but_not_weights():
    add = get_op("add_rmsnorm")
    bucket = add.bucket(add.spec((5, 64), "bf16"))
    assert [t.shape for t in bucket.inputs] == [(8, 64), (8, 64), (64,)]
    rms = get_op("rmsnorm")
    one_row = rms.spec((64,), "bf16")  # a 1-D x has its weight's shape: neither is touched
    assert rms.bucket(one_row) == one_row
    tails = add.validation_specs(add.spec((5, 64), "bf16"))
    assert all(s.inputs[0].shape == s.inputs[1].shape and s.inputs[2].shape == (64,) for s in tails)


def _store_forward_and_backward(db: str, op: str, inputs: tuple[torch.Tensor, ...], **constants) -> None:
    """Decisions for a family and its backward at these inputs, with each family's first variant."""
    family = get_op(op)
    spec = family.spec_for(*inputs, **constants)
    store_decision(db, spec, variant=family.variants[0].name)
    probe = [torch.empty(t.shape, dtype=t.torch_dtype) for t in family.output_specs(spec)]
    grads = tuple(torch.randn_like(o) for o in probe)
    backward = get_op(str(family.backward))
    backward_spec = backward.spec_for(*family.backward_inputs(grads, inputs, tuple(probe)), **constants)
    store_decision(db, backward_spec, variant=backward.variants[0].name)


def _swiglu(a, b):
    return torch.nn.functional.silu(a) * b


def _loss(logits, target):
    return torch.nn.functional.cross_entropy(logits.float(), target)


@pytest.mark.parametrize(
    ("fn", "make", "op", "constants"),
    [
        (_swiglu, lambda: (torch.randn(5, 40), torch.randn(5, 40)), "swiglu", {"layout": "pair"}),
        (_loss, lambda: (torch.randn(6, 50), torch.randint(0, 50, (6,))), "cross_entropy", {}),
        (torch.nn.LayerNorm(40), lambda: (torch.randn(5, 40),), "layernorm", None),
    ],
    ids=["swiglu", "cross_entropy", "layernorm"],
)
def test_training_calls_use_the_tuned_backward(db, fn, make, op, constants):
    inputs = make()
    if op == "layernorm":  # the module's parameters are the op's weight and bias
        inputs_for_spec = (inputs[0], fn.weight.detach(), fn.bias.detach())
        constants = {"eps": fn.eps, "affine": "weight_bias"}
    else:
        inputs_for_spec = inputs
    _store_forward_and_backward(db, op, inputs_for_spec, **constants)
    leaves = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
    optimized = kernelsmith.optimize(fn, mode="db", db=db)
    optimized(*leaves)  # first call: recognize and check both runners
    y = optimized(*leaves)
    assert optimized.kernelsmith.stats["kernel_calls"] == 1, optimized.kernelsmith.reasons
    assert "KernelFunction" in type(y.grad_fn).__name__
    dy = torch.randn_like(y)
    wanted = [t for t in leaves if t.requires_grad] + [p for p in getattr(fn, "parameters", list)()]
    got = torch.autograd.grad(y, wanted, dy)
    want = torch.autograd.grad(fn(*leaves), wanted, dy)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)
