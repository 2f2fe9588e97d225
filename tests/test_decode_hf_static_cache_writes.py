"""Hugging Face's StaticCache writes folded into the decode attention kernel where the graph proves
them the kernel's write (issue 13; :mod:`kernelsmith.frontends.patterns.decode_attention`, "Folding
the cache writes" and "Hugging Face's StaticCache").

transformers 5's ``StaticCache`` keeps one ``cumulative_length`` counter per layer; each layer's
update writes at ``arange(Sq) + its counter``, and the model's positions (the mask's) are
``arange(Sq) + layer 0's counter``. In the first layer the two are the same expression of the same
tensor, read with nothing written in between: proved equal, the writes fold (served through
``kernelsmith::kernel_mutating``). A later layer's counter is another tensor, equal to layer 0's
only while the cache object keeps it so: not proved, its writes stay in the graph and its
attention is the read-only site. These tests pin both, and that the served steps leave eager's
tokens and eager's cache buffers bit for bit, also where a caller has set a later layer's counter
apart (where folding it would write elsewhere than eager).

CPU, interpreter mode (conftest); Inductor replaced by a recorder that runs the graph it gets, and
winners stored directly, as in test_decode_attention_sites.
"""

from __future__ import annotations

import logging

import pytest
import torch

from kernelsmith.frontends import backend as ks_backend
from kernelsmith.frontends.patterns import decode_attention as pattern
from kernelsmith.testing.decisions import store_kernel_decisions
from kernelsmith.testing.models import tiny_llama
from test_backend import record_inductor
from test_decode_attention_sites import attention_sites, prefilled, served_ops

DECODE = ("kernel_mutating", "decode_attention"), ("kernel", "decode_attention")  # layer 0 folded, layer 1 not


@pytest.fixture(autouse=True)
def _folding(monkeypatch):
    monkeypatch.setattr(pattern, "FOLD_CACHE_WRITES", True)  # (the default; pinned so that these tests test it)


@pytest.fixture(scope="module")
def llama():
    return tiny_llama()


def step(model):
    """One decode step of ``model`` over ``cache``, as a function of the token: its logits."""
    return lambda token, cache: model(token, past_key_values=cache, use_cache=True).logits


def sites_of(model, ids, caplog) -> tuple[list[ks_backend.Site], list[str]]:
    """The decode attention sites of ``model``'s step after the prompt ``ids``, and the reasons
    logged for each site that keeps its cache writes."""
    cache, logits = prefilled(model, ids)
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="kernelsmith.frontends.backend"):
        sites = attention_sites(lambda t: step(model)(t, cache), logits[:, -1:].argmax(-1))
    return sites, [r.getMessage() for r in caplog.records if "keeps its cache writes" in r.getMessage()]


def test_only_the_first_layer_s_writes_are_proved_the_kernel_s(caplog):
    """Three layers: the first layer's site takes its two index_copy_ writes (at StaticCache's own
    cache_position, a node other than the mask's positions: folded by the proof, not by identity);
    each later layer keeps them, the log naming the two counters nothing proves equal."""
    model = tiny_llama(num_hidden_layers=3)
    sites, kept = sites_of(model, torch.randint(0, 128, (1, 5), generator=torch.Generator().manual_seed(1)), caplog)
    assert ["write_kv" in s.spec.constants for s in sites] == [True, False, False]
    assert [str(t) for t in sites[0].spec.inputs[3:]] == ["1x2x1x16:float32"] * 2 + ["1:int64"]
    writes = [n for n in sites[0].region if n.target == "index_copy_"]
    positions = sites[0].inputs[5].node
    assert len(writes) == 2 and all(w.args[2] is not positions for w in writes)  # StaticCache's own index
    assert len(kept) == 2, kept
    for layer, reason in zip((1, 2), kept, strict=True):
        assert "nothing in the graph proves them equal" in reason, reason
        assert f"layers_{layer}_cumulative_length" in reason and "layers_0_cumulative_length" in reason, reason


def decode(compiled, model, ids, steps, apart: int | None = None):
    """Greedy decoding of ``steps`` tokens after the prompt ``ids`` through ``compiled``, over a
    fresh StaticCache: (the tokens, the last logits, the cache, the positions each layer's steps
    wrote). ``apart``: layer 1's counter set to that position after the prompt (layer 0's stays at
    the prompt's length)."""
    cache, logits = prefilled(model, ids)
    if apart is not None:
        cache.layers[1].cumulative_length.fill_(apart)
    before = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    tokens = []
    token = logits[:, -1:].argmax(-1)
    with torch.no_grad():
        for _ in range(steps):
            logits = compiled(token, cache)
            token = logits[:, -1:].argmax(-1)
            tokens.append(token)
    written = [
        sorted({*changed_positions(layer.keys, k), *changed_positions(layer.values, v)})
        for layer, (k, v) in zip(cache.layers, before, strict=True)
    ]
    return torch.cat(tokens, dim=1), logits, cache, written


def changed_positions(after: torch.Tensor, before: torch.Tensor) -> list[int]:
    """The cache positions (dim 2) where any element of ``after`` differs from ``before``."""
    return torch.nonzero((after != before).flatten(3).any(3).any(1).any(0)).flatten().tolist()


def assert_caches_are_eager_s(ours, eager) -> None:
    """Layer 0's keys and values bit for bit (the folded layer: its new rows come from the
    embeddings, which served and eager compute alike); the later layers' close (their new rows
    come from the layers before, whose attention the kernel rounds otherwise than SDPA) and
    every layer's counter equal."""
    for i, (mine, theirs) in enumerate(zip(ours.layers, eager.layers, strict=True)):
        same = torch.equal if i == 0 else (lambda a, b: torch.allclose(a, b, rtol=1e-4, atol=1e-5))
        assert same(mine.keys, theirs.keys), f"layer {i}'s keys"
        assert same(mine.values, theirs.values), f"layer {i}'s values"
        assert torch.equal(mine.cumulative_length, theirs.cumulative_length), f"layer {i}'s counter"


# (~8 s: a discovery, a compile and interpreted steps of two layers, twice)
def test_served_steps_leave_eager_tokens_and_the_folded_layer_s_caches_bit_for_bit(llama, tmp_path, monkeypatch,
                                                                                   caplog):  # fmt: skip
    """The first layer served with its writes folded (kernelsmith::kernel_mutating, its index_copy_
    gone), the second with its writes in the graph: four greedy steps give eager's tokens, close
    logits, the folded layer's keys and values equal to eager's bit for bit, the other's close,
    and each layer's steps write at eager's positions. Then a cache whose second counter a caller
    set apart (layer 1 writes at 2 .. 5 while the mask, from layer 0's counter, is at 5 .. 8): the
    same, which a fold of layer 1 (one position for the write and the mask) would not give."""
    ids = torch.randint(0, 128, (2, 5), generator=torch.Generator().manual_seed(2))
    sites, _ = sites_of(llama, ids, caplog)
    assert ["write_kv" in s.spec.constants for s in sites] == [True, False]
    db = str(tmp_path / "k.db")
    store_kernel_decisions(db, [s.spec for s in sites])
    seen = record_inductor(monkeypatch)
    torch._dynamo.reset()
    backend = ks_backend.KernelsmithBackend(db=db, families=("decode_attention",), compare=False)
    compiled = torch.compile(step(llama), backend=backend)
    for apart in (None, 2):
        eager_tokens, eager_logits, eager_cache, eager_written = decode(step(llama), llama, ids, 4, apart)
        tokens, logits, cache, written = decode(compiled, llama, ids, 4, apart)
        assert {s.status for s in backend.sites} == {"replaced"}, [(s.status, s.reason) for s in backend.sites]
        assert torch.equal(tokens, eager_tokens)
        torch.testing.assert_close(logits, eager_logits, rtol=1e-4, atol=1e-4)
        assert written == eager_written == [[5, 6, 7, 8], [5, 6, 7, 8] if apart is None else [2, 3, 4, 5]]
        assert_caches_are_eager_s(cache, eager_cache)
    assert len(seen) == 1  # one graph, both runs (the counters are data, not guards)
    assert served_ops(seen[0]) == list(DECODE)
    assert [n.target for n in seen[0].graph.nodes].count("index_copy_") == 2  # layer 1's only
