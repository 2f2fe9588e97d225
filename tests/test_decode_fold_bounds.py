"""A folded decode attention site refuses a position outside the static cache (issue 13).

With the cache writes folded into the site (``write_kv``,
:mod:`kernelsmith.frontends.patterns.decode_cache_writes`), the graph has no ``index_copy_`` left
to fail on a position past the cache's end, as eager's does, and the kernel (which never reads or
writes past the cache) would write nothing and return NaN: a one-layer model's logits silently
NaN. The rewritten graph derives the kernel's first position through
:func:`~kernelsmith.frontends.patterns.decode_cache_writes.first_position` with the cache's length,
which asserts on the device (no host sync) that every position written is a row of the cache.
These tests pin that: the check itself, and served steps, in range (eager's outputs and caches, up
to the cache's last row) and out of range (an error, the caches left as they were), with the
recorded graph and with the real Inductor (whose C++ code must keep the assert).

CPU, interpreter mode (conftest): a failed device-side assert on a CPU tensor raises a
RuntimeError at once.
"""

from __future__ import annotations

import pytest
import torch

from kernelsmith.frontends.patterns import decode_attention as pattern
from kernelsmith.frontends.patterns.decode_cache_writes import first_position
from test_decode_attention_write_kv_serving import (
    CACHE_LEN,
    decoders_with_a_stored_winner,
    served_decoder,
    step_inputs,
)

OUTSIDE = "outside the static cache"


@pytest.fixture(autouse=True)
def _folding(monkeypatch):
    monkeypatch.setattr(pattern, "FOLD_CACHE_WRITES", True)  # (the default; pinned so that these tests test it)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize(
    "positions", [[0], [CACHE_LEN - 1], [4, 5, 6], [CACHE_LEN - 3, CACHE_LEN - 2, CACHE_LEN - 1]],
    ids=["first-row", "last-row", "three-inside", "three-to-the-end"],
)
def test_positions_inside_the_cache_give_the_first_position(positions, dtype):
    position = first_position(torch.tensor(positions, dtype=dtype), CACHE_LEN)
    assert position.dtype == torch.int64 and position.tolist() == positions[:1]


@pytest.mark.parametrize(
    "positions", [[CACHE_LEN], [CACHE_LEN + 5], [-1], [CACHE_LEN - 2, CACHE_LEN - 1, CACHE_LEN], [-1, 0, 1]],
    ids=["one-past-the-end", "far-past", "negative", "last-one-past", "first-one-negative"],
)
def test_a_position_outside_the_cache_fails_the_device_check(positions):
    """Every position is checked, not only the first (the kernel writes from positions[0] on,
    ``Sq`` rows)."""
    with pytest.raises(RuntimeError, match=f"{OUTSIDE} \\(0 \\.\\. {CACHE_LEN - 1}\\)"):
        first_position(torch.tensor(positions), CACHE_LEN)


def test_the_folded_site_derives_its_position_with_the_cache_length(tmp_path):
    """The site hands the rewrite first_position with the cache's length (what makes the check run
    in the served graph; the serving tests below show it does)."""
    _, _, _, sites = decoders_with_a_stored_winner(tmp_path, 1, 1, 1)
    (site,) = sites
    assert site.spec.constants.get("write_kv") is True
    assert site.inputs[5].derive is first_position and site.inputs[5].derive_args == (CACHE_LEN,)


@pytest.mark.parametrize(("batch", "kv_heads", "q_len"), [(1, 1, 1), (2, 2, 3)], ids=["one-token", "three-tokens"])
def test_a_served_step_past_the_cache_end_is_an_error_not_nan(monkeypatch, tmp_path, batch, kv_heads, q_len):
    """In range, up to the cache's last row, the served steps are eager's (outputs close, caches bit
    for bit: the check changes nothing). Then a step whose last position is one past the end: eager
    fails in its index_copy_; the served step fails the device check (not NaN outputs) and leaves
    the caches as they were."""
    eager, compiled, backend, seen, _, _ = served_decoder(monkeypatch, tmp_path, batch, kv_heads, q_len)
    served = compiled._orig_mod
    with torch.no_grad():
        for offset in (1, CACHE_LEN // 2, CACHE_LEN - q_len):
            inputs = step_inputs(batch, kv_heads, q_len, offset)
            ours = compiled(*inputs)
            torch.testing.assert_close(ours, eager(*inputs), rtol=1e-5, atol=1e-5)
            assert torch.equal(served.k_cache, eager.k_cache) and torch.equal(served.v_cache, eager.v_cache)
        assert [s.status for s in backend.sites] == ["replaced"], [(s.status, s.reason) for s in backend.sites]
        assert [n.target for n in seen[0].graph.nodes].count(first_position) == 1
        past = step_inputs(batch, kv_heads, q_len, CACHE_LEN - q_len + 1)
        with pytest.raises(IndexError, match="out of bounds"):
            eager(*past)
        before = served.k_cache.clone(), served.v_cache.clone()
        with pytest.raises(RuntimeError, match=OUTSIDE):
            compiled(*past)
    assert torch.equal(served.k_cache, before[0]) and torch.equal(served.v_cache, before[1])


# (a CPU Inductor compile, C++: about 5 s)
def test_inductor_keeps_the_check(tmp_path):
    """With the real Inductor, the compiled step (the mutating op re-inplaced on the cache buffers)
    still runs the check: a step in range is eager's, one past the end raises."""
    eager, served, backend, _ = decoders_with_a_stored_winner(tmp_path, 1, 1, 1)
    compiled = torch.compile(served, backend=backend)
    with torch.no_grad():
        inputs = step_inputs(1, 1, 1, CACHE_LEN - 1)
        torch.testing.assert_close(compiled(*inputs), eager(*inputs), rtol=1e-5, atol=1e-5)
        assert torch.equal(served.k_cache, eager.k_cache) and torch.equal(served.v_cache, eager.v_cache)
        assert [s.status for s in backend.sites] == ["replaced"]
        with pytest.raises(RuntimeError, match=OUTSIDE):
            compiled(*step_inputs(1, 1, 1, CACHE_LEN))
