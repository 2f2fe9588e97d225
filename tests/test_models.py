"""Built-in models: tiny forwards, full-size parameter counts on the meta device, inputs, and that
kernelsmith's recognizers see the ops in them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kernelsmith.frontends.recognize import recognize
from kernelsmith.models import example_inputs, get_model, model_names, parameter_count
from kernelsmith.models.gpt2 import NewGELU
from kernelsmith.models.llama import RMSNorm, apply_rotary_pos_emb, repeat_kv

TINY_VOCAB = 512


@pytest.mark.parametrize("name", ["gpt2", "llama-160m", "llama-7b", "bert-base"])
def test_tiny_forward_shapes_and_vocab_range(name):
    model = get_model(name, tiny=True).eval()
    inputs = example_inputs(model, batch=3, seq=16, device="cpu")
    ids = inputs[0]
    assert ids.shape == (3, 16) and ids.dtype == torch.long
    assert int(ids.min()) >= 0 and int(ids.max()) < TINY_VOCAB
    assert len(ids.unique()) > 16  # random tokens, not a constant
    with torch.no_grad():
        out = model(*inputs)
    expected = (3, 16, 64) if name == "bert-base" else (3, 16, TINY_VOCAB)
    assert out.shape == expected and torch.isfinite(out).all()


def test_inputs_are_seeded_and_in_range_of_the_full_vocabulary():
    model = get_model("gpt2", device="meta")
    (a,) = example_inputs(model, 4, 64, device="cpu", seed=1)
    (b,) = example_inputs(model, 4, 64, device="cpu", seed=1)
    (c,) = example_inputs(model, 4, 64, device="cpu", seed=2)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert int(a.max()) < 50257 and int(a.max()) > 1000


@pytest.mark.parametrize(
    ("name", "count"), [("gpt2", 124_439_808), ("llama-160m", 160_058_112), ("bert-base", 108_891_648)]
)
def test_full_size_parameter_counts(name, count):
    assert parameter_count(get_model(name, device="meta")) == count


def test_llama_7b_builds_on_meta_without_allocating():
    model = get_model("llama-7b", device="meta")
    assert all(p.is_meta for p in model.parameters())
    count = parameter_count(model)
    assert count == 6_738_415_616  # LLaMA-2 7B: 6.74B
    assert len(model.layers) == 32 and model.layers[0].mlp.gate_proj.weight.shape == (11008, 4096)


def test_causal_models_do_not_see_the_future_and_bert_does():
    for name, causal in (("gpt2", True), ("llama-160m", True), ("bert-base", False)):
        model = get_model(name, tiny=True).eval()
        ids = example_inputs(model, 1, 12, device="cpu")[0]
        changed = ids.clone()
        changed[0, -1] = (changed[0, -1] + 1) % TINY_VOCAB
        with torch.no_grad():
            before, after = model(ids), model(changed)
        same_prefix = torch.allclose(before[:, :-1], after[:, :-1])
        assert same_prefix == causal, name


def test_bert_padding_mask_hides_padded_tokens():
    model = get_model("bert-base", tiny=True).eval()
    ids, mask = example_inputs(model, 2, 16, device="cpu")
    assert mask[0].all() and not mask[1, -4:].any() and mask[1, :12].all()
    changed = ids.clone()
    changed[1, -4:] = (changed[1, -4:] + 7) % TINY_VOCAB  # only padded positions of row 1
    with torch.no_grad():
        before, after = model(ids, mask), model(changed, mask)
    torch.testing.assert_close(before[1, :12], after[1, :12])


def test_rotary_scores_depend_on_relative_position_only():
    head_dim, seq = 16, 10
    model = get_model("llama-160m", tiny=True)
    x = torch.zeros(1, seq, 64)
    cos, sin = model.rotary_emb(x, torch.arange(seq).unsqueeze(0))
    q = torch.randn(1, 1, 1, head_dim).expand(1, 1, seq, head_dim)
    k = torch.randn(1, 1, 1, head_dim).expand(1, 1, seq, head_dim)
    rq, rk = apply_rotary_pos_emb(q, k, cos, sin)
    scores = rq[0, 0] @ rk[0, 0].T
    torch.testing.assert_close(scores[3, 1], scores[7, 5])  # both 2 apart
    torch.testing.assert_close(rq[0, 0, 0], q[0, 0, 0])  # position 0 is not rotated


def test_repeat_kv_is_grouped_query_attention():
    kv = torch.randn(2, 3, 5, 4)
    torch.testing.assert_close(repeat_kv(kv, 4), kv.repeat_interleave(4, dim=1))
    attention = get_model("llama-160m", device="meta").layers[0].self_attn
    assert attention.k_proj.weight.shape == (256, 768) and attention.n_rep == 3


def test_overrides_device_and_dtype():
    model = get_model("llama-160m", tiny=True, n_layers=1, dtype=torch.bfloat16)
    assert len(model.layers) == 1 and model.lm_head.weight.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="no configuration field"):
        get_model("gpt2", n_layer=2)
    with pytest.raises(ValueError, match="unknown built-in model"):
        get_model("gpt3")
    assert model_names() == ["gpt2", "llama-160m", "llama-7b", "bert-base"]


def test_sequence_longer_than_learned_positions_is_refused():
    with pytest.raises(ValueError, match="learned positions"):
        example_inputs(get_model("gpt2", tiny=True), 1, 65)


def test_example_inputs_for_other_models():
    class WithEmbedding(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(100, 8)

        def forward(self, ids):
            return self.emb(ids)

    (ids,) = example_inputs(WithEmbedding(), 2, 5)
    assert ids.shape == (2, 5) and int(ids.max()) < 100
    with pytest.raises(ValueError, match="define example_inputs"):
        example_inputs(nn.Linear(4, 4), 2, 5)


@pytest.mark.parametrize(
    ("module", "op"),
    [
        (RMSNorm(64, eps=1e-5), "rmsnorm"),
        (NewGELU(), "gelu_tanh"),
        (nn.LayerNorm(64), "layernorm"),
        (nn.GELU(), "gelu"),
    ],
)
def test_recognizers_find_the_ops_the_models_are_written_with(module, op):
    x = torch.randn(2, 8, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        found = recognize(module.to(torch.bfloat16).forward, (x,)).match
    assert found is not None and found.op == op
