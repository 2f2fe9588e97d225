"""Serving a Hugging Face model's decode steps over a ``StaticCache`` with decode attention: the
setup that test_decode_hf_static_cache_writes and test_decode_attention_write_kv_serving share.

- :func:`step`: one decode step of a model over a cache, as a function of the token;
- :func:`static_cache_sites`: the decode attention sites a discovery finds in that step after a
  prompt (transformers 5's StaticCache: the first layer's writes fold, the later layers' do not,
  :mod:`kernelsmith.frontends.patterns.decode_cache_writes`);
- :func:`serving_backend`: those sites' winners stored, Inductor replaced by a recorder that runs
  the graph it gets (test_backend's), and a backend serving ``decode_attention`` from the stored
  decisions without comparing against the original code;
- :func:`decode` and :func:`assert_caches_are_eager_s`: greedy decoding over a fresh cache, and
  the comparison of the caches it leaves with eager's.

CPU, interpreter mode (the suite's conftest).
"""

from __future__ import annotations

import torch

from kernelsmith.frontends import backend as ks_backend
from kernelsmith.testing.decisions import store_kernel_decisions
from test_backend import record_inductor
from test_decode_attention_sites import attention_sites, prefilled


def step(model):
    """One decode step of ``model`` over ``cache``, as a function of the token: its logits."""
    return lambda token, cache: model(token, past_key_values=cache, use_cache=True).logits


def static_cache_sites(model, ids: torch.Tensor) -> list[ks_backend.Site]:
    """The decode attention sites a discovery finds in ``model``'s step after the prompt ``ids``
    (over a StaticCache holding the prompt, at its first new token)."""
    cache, logits = prefilled(model, ids)
    return attention_sites(lambda t: step(model)(t, cache), logits[:, -1:].argmax(-1))


def serving_backend(sites, tmp_path, monkeypatch) -> tuple[ks_backend.KernelsmithBackend, list]:
    """(a backend serving ``decode_attention`` from the stored winners of ``sites``, the graphs the
    recorded Inductor gets): the decisions stored in ``tmp_path``, Dynamo reset so that the next
    compile captures afresh, no comparison with the original code (the tests compare)."""
    db = str(tmp_path / "k.db")
    store_kernel_decisions(db, [s.spec for s in sites])
    seen = record_inductor(monkeypatch)
    torch._dynamo.reset()
    return ks_backend.KernelsmithBackend(db=db, families=("decode_attention",), compare=False), seen


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
