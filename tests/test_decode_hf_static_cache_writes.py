"""Hugging Face's StaticCache writes folded into the decode attention kernel where the graph proves
them the kernel's write (issue 13; :mod:`kernelsmith.frontends.patterns.decode_cache_writes`,
"Hugging Face's StaticCache").

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
winners stored directly (hf_static_cache_serving's setup, which test_decode_attention_write_kv_serving
shares).
"""

from __future__ import annotations

import logging

import pytest
import torch

from hf_static_cache_serving import assert_caches_are_eager_s, decode, serving_backend, static_cache_sites, step
from kernelsmith.frontends import backend as ks_backend
from kernelsmith.frontends.patterns import decode_attention as pattern
from kernelsmith.testing.models import tiny_llama
from test_decode_attention_sites import served_ops

DECODE = ("kernel_mutating", "decode_attention"), ("kernel", "decode_attention")  # layer 0 folded, layer 1 not


@pytest.fixture(autouse=True)
def _folding(monkeypatch):
    monkeypatch.setattr(pattern, "FOLD_CACHE_WRITES", True)  # (the default; pinned so that these tests test it)


@pytest.fixture(scope="module")
def llama():
    return tiny_llama()


def sites_of(model, ids, caplog) -> tuple[list[ks_backend.Site], list[str]]:
    """The decode attention sites of ``model``'s step after the prompt ``ids``, and the reasons
    logged for each site that keeps its cache writes."""
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="kernelsmith.frontends.backend"):
        sites = static_cache_sites(model, ids)
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
    backend, seen = serving_backend(sites, tmp_path, monkeypatch)
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
