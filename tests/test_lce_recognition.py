"""An LM head followed by its loss is one ``linear_cross_entropy`` op: recognized in plain code
(the decorator's recognizer) and in Hugging Face causal LMs (the compile backend's sites), and
refused, with a reason, where it computes something else."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers
from torch import nn

from kernelsmith.frontends import backend as ks_backend
from kernelsmith.frontends.recognize import recognize
from kernelsmith.ops import get_op

V, H = 50, 16
FAMILY = get_op("linear_cross_entropy")


def _inputs(dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, 3, H, generator=g).to(dtype)
    w = (torch.randn(V, H, generator=g) / 4).to(dtype)
    y = torch.randint(0, V, (2, 3), generator=g)
    y[0, 0] = -100
    return h, w, y


def _recognized(fn, *args):
    found = recognize(fn, args)
    assert found.match is not None, found.reason
    return found


def _agrees_with_the_op(found, args) -> None:
    """The bound inputs under the family's own reference give the function's own output."""
    bound = found.match.bind(args, {})
    spec = FAMILY.spec_for(*bound, **found.match.constants)
    (expected,) = FAMILY.reference(spec, bound)
    torch.testing.assert_close(found.output, expected)


def test_plain_spellings_are_one_op_with_the_tokens_flattened() -> None:
    h, w, y = _inputs()

    def upcast_then_view(h, w, y):
        return F.cross_entropy(F.linear(h, w).float().view(-1, V), y.view(-1), reduction="sum")

    def view_then_upcast(h, w, y):
        logits = (h @ w.T).reshape(-1, V)
        return F.cross_entropy(logits.float(), y.flatten(), label_smoothing=0.1)

    for fn in (upcast_then_view, view_then_upcast):
        found = _recognized(fn, h, w, y)
        assert found.match.op == "linear_cross_entropy", fn.__name__
        h_ref, w_ref, y_ref = found.match.inputs
        assert (h_ref.index, h_ref.reshape, w_ref.index, y_ref.reshape) == (0, (6, H), 1, (6,))
        _agrees_with_the_op(found, (h, w, y))
    assert _recognized(upcast_then_view, h, w, y).match.constants["reduction"] == "sum"
    assert _recognized(view_then_upcast, h, w, y).match.constants["label_smoothing"] == 0.1


def test_a_module_head_with_a_bias_a_tied_weight_and_a_soft_cap() -> None:
    h, _, y = _inputs(torch.float32)

    class Head(nn.Module):
        def __init__(self, tied: bool, bias: bool, cap: float | None) -> None:
            super().__init__()
            self.embed = nn.Embedding(V, H)
            self.lm_head = nn.Linear(H, V, bias=bias)
            if tied:
                self.lm_head.weight = self.embed.weight
            self.cap, self.loss = cap, nn.CrossEntropyLoss(ignore_index=-100)

        def forward(self, h, y):
            z = self.lm_head(h)
            if self.cap:
                z = torch.tanh(z / self.cap) * self.cap
            return self.loss(z.view(-1, V), y.view(-1))  # float32: no upcast needed

    for tied, bias, cap in ((True, False, None), (False, True, 30.0)):
        head = Head(tied, bias, cap)
        found = _recognized(head, h, y)
        assert found.match.op == "linear_cross_entropy"
        weight = found.match.inputs[1]
        assert weight.kind == "external" and weight.tensor is head.lm_head.weight
        assert (weight.tensor is head.embed.weight) == tied
        assert len(found.match.inputs) == 3 + bias and found.match.constants["softcap"] == cap
        _agrees_with_the_op(found, (h, y))


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (lambda h, w, y: F.cross_entropy(F.linear(h, w).view(-1, V), y.view(-1)), "upcast"),
        (lambda h, w, y: F.cross_entropy((h @ w.T.contiguous().T.T).float().view(-1, V), y.view(-1)), "computed"),
        (lambda h, w, y: F.cross_entropy((30 * torch.tanh(F.linear(h, w) / 30)).float().view(-1, V), y.view(-1)),
         "before the upcast"),
        (lambda h, w, y: F.cross_entropy(F.linear(h, w).float().view(-1, V), y.view(-1)) * 2, "after the cross"),
        (lambda h, w, y: F.cross_entropy(F.linear(h, w).float().view(-1, V), F.pad(y, (0, 1), value=-100)[..., 1:]
                                         .reshape(-1)), "label shift"),
        (lambda h, w, y: F.cross_entropy(F.linear(h, w).float().view(-1, V), y.view(-1), weight=torch.ones(V)),
         "class weights"),
    ],
    ids=["no upcast", "computed weight", "cap before upcast", "scaled loss", "shifted labels", "class weights"],
)
def test_refusals_say_why(body, reason: str) -> None:
    h, w, y = _inputs()
    found = recognize(body, (h, w, y))
    assert found.match is None or found.match.op != "linear_cross_entropy"
    assert reason in found.reason, found.reason


def test_a_weight_stored_h_by_v_is_refused() -> None:
    h, w, y = _inputs()
    wt = w.T.contiguous()
    found = recognize(lambda h, wt, y: F.cross_entropy((h @ wt).float().view(-1, V), y.view(-1)), (h, wt, y))
    assert found.match is None and "(V, H)" in found.reason


# ---- the compile backend in a Hugging Face causal LM --------------------------------------------


@pytest.fixture(scope="module")
def tiny_llama() -> nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).train()


def _sites(fn, *args, **kwargs) -> list[ks_backend.Site]:
    torch._dynamo.reset()
    backend = ks_backend.KernelsmithBackend(discover=True)
    torch.compile(fn, backend=backend)(*args, **kwargs)
    return backend.sites


def test_the_hf_loss_is_one_site_whose_label_shift_stays_in_the_graph(tiny_llama) -> None:
    ids = torch.randint(0, 64, (2, 8))
    sites = _sites(tiny_llama, input_ids=ids, labels=ids)
    (site,) = [s for s in sites if s.op == "linear_cross_entropy"]
    assert not any(s.op == "cross_entropy" for s in sites)
    hidden, weight, target = site.spec.inputs
    assert (hidden.shape, weight.shape, target.shape) == ((16, 32), (64, 32), (16,))
    assert site.constants["reduction"] == "mean" and site.constants["ignore_index"] == -100 and site.needs_grad
    # The model also returns its logits: the product stays, the site replaces the upcast and the loss.
    names = [ks_backend._target_name(n) for n in site.region]
    assert "linear" not in names and names[-1] == "cross_entropy"
    # The tied weight is the embedding's parameter; the shifted labels come from the graph (pad, slice).
    assert "embed_tokens" in site.inputs[1].node.name
    assert site.inputs[2].node.op != "placeholder"


def test_num_items_in_batch_is_a_sum_divided_outside_the_site(tiny_llama) -> None:
    ids = torch.randint(0, 64, (2, 8))
    sites = _sites(tiny_llama, input_ids=ids, labels=ids, num_items_in_batch=torch.tensor(11))
    (site,) = [s for s in sites if s.op == "linear_cross_entropy"]
    assert site.constants["reduction"] == "sum"
    assert any(ks_backend._target_name(u) in ("truediv", "div") for u in site.output.users)


def test_plain_code_under_the_backend_takes_the_product_into_the_site() -> None:
    h, w, y = _inputs()

    def loss(h, w, y):
        return F.cross_entropy(F.linear(h, w).float().view(-1, V), y.view(-1))

    (site,) = _sites(loss, h, w, y)
    assert site.op == "linear_cross_entropy"
    assert [ks_backend._target_name(n) for n in site.region] == ["linear", "float", "view", "cross_entropy"]
    # h is reshaped to (tokens, hidden) on the way; y.view(-1) stays in the graph, an input of the site.
    assert [i.reshape for i in site.inputs] == [(6, H), None, None]
    assert site.spec.inputs[2].shape == (6,)


def test_logits_used_twice_in_the_graph_keep_their_product() -> None:
    h, w, y = _inputs()

    def loss_and_entropy(h, w, y):
        logits = F.linear(h, w).float()
        return F.cross_entropy(logits.view(-1, V), y.view(-1)) + logits.logsumexp(-1).mean()

    sites = [s for s in _sites(loss_and_entropy, h, w, y) if s.op == "linear_cross_entropy"]
    assert len(sites) == 1
    assert [ks_backend._target_name(n) for n in sites[0].region] == ["view", "cross_entropy"]


# ---- the decorator -------------------------------------------------------------------------------


def test_the_decorator_serves_the_fused_op_forward_and_backward(tmp_path) -> None:
    """A decorated LM-head loss with stored decisions for the family and its backward: the kernel
    runs (the logits are never materialized), and the loss and the gradients of h and W agree with
    the function's own (interpreter mode, float32, tiny shapes)."""
    import kernelsmith
    from test_decorator import _store_forward_and_backward

    db = str(tmp_path / "d.db")
    h, w, y = _inputs(torch.float32)

    def head_loss(h, w, y):
        return F.cross_entropy(F.linear(h, w).view(-1, V), y.view(-1))

    _store_forward_and_backward(db, "linear_cross_entropy", (h.reshape(-1, H), w, y.reshape(-1)),
                                reduction="mean", ignore_index=-100, label_smoothing=0.0, softcap=None)  # fmt: skip
    optimized = kernelsmith.optimize(head_loss, mode="db", db=db)
    leaves = [h.clone().requires_grad_(), w.clone().requires_grad_()]
    optimized(*leaves, y)  # first call: recognize and check both runners
    loss = optimized(*leaves, y)
    assert optimized.kernelsmith.stats["kernel_calls"] == 1, optimized.kernelsmith.reasons
    got = torch.autograd.grad(loss, leaves)
    want_leaves = [h.clone().requires_grad_(), w.clone().requires_grad_()]
    expected = head_loss(*want_leaves, y)
    want = torch.autograd.grad(expected, want_leaves)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-6)
