"""Serving decode attention with the cache writes folded in (issue 13, ``write_kv``).

A static-cache step whose ``cache.index_copy_(2, positions, new)`` writes are folded into the
``decode_attention`` site (:mod:`kernelsmith.frontends.patterns.decode_cache_writes`) is served
through ``kernelsmith::kernel_mutating``, whose schema declares the caches written: the rewritten
graph holds that op and no ``index_copy_``, and step after step the module's cache buffers are
eager's bit for bit and its output eager's (and float64's). Writes that cannot fold (a reader
between the write and the attention) keep the read-only site, the writes left in the graph. Hugging
Face's StaticCache writes at its own index, ``arange(Sq) +`` each layer's counter: layer 0's is
proved the mask's positions and folds, a later layer's is not and keeps its writes (one
kernel_mutating call, then kernel calls; test_decode_hf_static_cache_writes has the details, here a
slow end-to-end decode of the tiny Llama, set up as there by hf_static_cache_serving).

CPU, interpreter mode (conftest); Inductor replaced by a recorder that runs the graph it gets (as
in test_backend), except one test that compiles with the real Inductor and checks that the
functionalized op still writes the caches. Winners are stored directly.
"""

from __future__ import annotations

import math

import pytest
import torch

from hf_static_cache_serving import assert_caches_are_eager_s, decode, serving_backend, static_cache_sites, step
from kernelsmith import dispatch
from kernelsmith.frontends import backend as ks_backend
from kernelsmith.frontends.patterns import decode_attention as pattern
from kernelsmith.testing.decisions import store_kernel_decisions
from test_backend import kernel_ops, record_inductor, spy_runners
from test_decode_attention_sites import (  # noqa: F401 (hf_llama is a fixture)
    StaticDecoder,
    attention_sites,
    hf_llama,
    served_ops,
)

CACHE_LEN, HEAD_DIM, GROUP = 37, 16, 2
MUTATING = torch.ops.kernelsmith.kernel_mutating.default


@pytest.fixture(autouse=True)
def _folding(monkeypatch):
    monkeypatch.setattr(pattern, "FOLD_CACHE_WRITES", True)


def step_inputs(batch: int, kv_heads: int, q_len: int, offset: int) -> tuple[torch.Tensor, ...]:
    """decoder_inputs with fresh rows per offset (a new seed each step: a stale write shows)."""
    g = torch.Generator().manual_seed(100 + offset)
    new_k, new_v = (torch.randn(batch, kv_heads, q_len, HEAD_DIM, generator=g) for _ in range(2))
    q = torch.randn(batch, kv_heads * GROUP, q_len, HEAD_DIM, generator=g)
    return q, new_k, new_v, torch.tensor(offset)


def attention64(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, offset: int) -> torch.Tensor:
    """The step's attention in float64 over the caches as they are after its write: query ``i``
    (at position ``offset + i``) sees keys ``0 .. offset + i``."""
    q, k, v = q.double(), k_cache.double().repeat_interleave(GROUP, 1), v_cache.double().repeat_interleave(GROUP, 1)
    positions = torch.arange(q.shape[2]) + offset
    visible = torch.arange(k.shape[2])[None, :] <= positions[:, None]
    scores = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~visible, -math.inf)
    return torch.softmax(scores, -1) @ v


def decoders_with_a_stored_winner(tmp_path, batch, kv_heads, q_len, write="at-positions"):
    """(eager, served, a backend serving from a stored winner, the sites): two decoders with equal
    caches (discovery's step run on both), the winner stored for the served one's sites."""
    eager, served = (StaticDecoder(batch, kv_heads * GROUP, kv_heads, HEAD_DIM, CACHE_LEN, q_len, write=write)
                     for _ in range(2))  # fmt: skip
    first = step_inputs(batch, kv_heads, q_len, 0)
    sites = attention_sites(served, *first)
    with torch.no_grad():
        eager(*first)
    db = str(tmp_path / "k.db")
    store_kernel_decisions(db, [s.spec for s in sites])
    torch._dynamo.reset()
    dispatch._RUNNERS.clear()
    return eager, served, ks_backend.KernelsmithBackend(db=db, families=("decode_attention",), compare=False), sites


def served_decoder(monkeypatch, tmp_path, batch, kv_heads, q_len, write="at-positions"):
    """(eager, compiled, its backend, the graphs Inductor got, the kernel launches, the sites):
    :func:`decoders_with_a_stored_winner`, the served one compiled, Inductor recorded."""
    eager, served, backend, sites = decoders_with_a_stored_winner(tmp_path, batch, kv_heads, q_len, write)
    seen = record_inductor(monkeypatch)
    launches = spy_runners(monkeypatch)
    return eager, torch.compile(served, backend=backend), backend, seen, launches, sites


@pytest.mark.parametrize(
    ("batch", "kv_heads", "q_len"), [(1, 1, 1), (2, 2, 1), (2, 1, 3)], ids=["b1-mqa", "b2-gqa", "three-new-tokens"]
)
def test_folded_writes_are_served_with_eager_caches_bit_for_bit(monkeypatch, tmp_path, batch, kv_heads, q_len):
    eager, compiled, backend, seen, launches, sites = served_decoder(monkeypatch, tmp_path, batch, kv_heads, q_len)
    assert [s.spec.constants.get("write_kv") for s in sites] == [True]
    served = compiled._orig_mod
    offsets = [1, 2, 3, 17, CACHE_LEN - q_len]  # a cache filling up, to its last positions
    with torch.no_grad():
        for offset in offsets:
            inputs = step_inputs(batch, kv_heads, q_len, offset)
            ours, theirs = compiled(*inputs), eager(*inputs)
            assert torch.equal(served.k_cache, eager.k_cache), offset
            assert torch.equal(served.v_cache, eager.v_cache), offset
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
            expected64 = attention64(inputs[0], eager.k_cache, eager.v_cache, offset)
            torch.testing.assert_close(ours.double(), expected64, rtol=1e-5, atol=1e-5)
    assert [s.status for s in backend.sites] == ["replaced"], [(s.status, s.reason) for s in backend.sites]
    (graph,) = seen
    targets = [getattr(n.target, "__name__", n.target) for n in graph.graph.nodes]
    assert "index_copy_" not in targets and "scaled_dot_product_attention" not in targets
    (call,) = [n for n in graph.graph.nodes if n.target is MUTATING]
    assert call.args[0] == "decode_attention" and call.args[2] == [1, 2]
    assert kernel_ops(graph) == []  # not kernelsmith::kernel, which declares no write
    assert len(launches) >= len(offsets)  # every step ran the kernel, not the reference


def test_a_kernel_that_skips_the_write_fails_its_serve_check_and_eager_caches_stay(monkeypatch, tmp_path, caplog):
    """Planted: the served kernel computes the attention but forgets the write (it restores the
    caches it was handed). The serve check compares the written caches with the family's update of
    the state the call started from, so it fails, the reference's result and caches are kept, and
    the process stops serving the kernel: the caches stay eager's."""
    eager, compiled, _, seen, _, _ = served_decoder(monkeypatch, tmp_path, 1, 2, 1)
    original = dispatch.KernelRunner.__call__

    def forgetful(self, inputs):
        saved = [inputs[1].clone(), inputs[2].clone()]
        outputs = original(self, inputs)
        inputs[1].copy_(saved[0])
        inputs[2].copy_(saved[1])
        return outputs

    monkeypatch.setattr(dispatch.KernelRunner, "__call__", forgetful)
    served = compiled._orig_mod
    with torch.no_grad():
        for offset in (1, 2, 3):
            inputs = step_inputs(1, 2, 1, offset)
            torch.testing.assert_close(compiled(*inputs), eager(*inputs), rtol=1e-5, atol=1e-5)
            assert torch.equal(served.k_cache, eager.k_cache) and torch.equal(served.v_cache, eager.v_cache)
    assert "written inputs [1, 2] other than the family's update" in caplog.text
    assert [n for n in seen[0].graph.nodes if n.target is MUTATING]


def test_a_reader_between_write_and_attention_keeps_the_writes_and_the_read_only_op(monkeypatch, tmp_path):
    eager, compiled, _, seen, _, sites = served_decoder(monkeypatch, tmp_path, 2, 1, 1,
                                                    write="read-between")  # fmt: skip
    assert ["write_kv" in s.spec.constants for s in sites] == [False]
    served = compiled._orig_mod
    with torch.no_grad():
        for offset in (1, 5, CACHE_LEN - 1):
            inputs = step_inputs(2, 1, 1, offset)
            torch.testing.assert_close(compiled(*inputs), eager(*inputs), rtol=1e-4, atol=1e-4)
            assert torch.equal(served.k_cache, eager.k_cache) and torch.equal(served.v_cache, eager.v_cache)
    targets = [getattr(n.target, "__name__", n.target) for n in seen[0].graph.nodes]
    assert targets.count("index_copy_") == 2 and kernel_ops(seen[0]) == ["decode_attention"]
    assert not any(n.target is MUTATING for n in seen[0].graph.nodes)


@pytest.mark.slow  # ~10 s: a discovery, a compile and interpreted Llama steps
def test_hf_static_cache_folds_its_first_layer_and_decodes_eager_tokens(hf_llama, tmp_path, monkeypatch):  # noqa: F811
    """transformers 5's StaticCache writes at ``arange(Sq) + cumulative_length``, its own index: in
    layer 0 the graph proves it the mask's positions and the writes fold (kernelsmith::kernel_mutating),
    in layer 1 (another counter) it does not and the read-only site serves with the writes in the
    graph (decode_cache_writes' "Hugging Face's StaticCache"). Greedy steps give eager's tokens and caches."""
    ids = torch.randint(0, 128, (1, 5), generator=torch.Generator().manual_seed(2))
    sites = static_cache_sites(hf_llama, ids)
    assert ["write_kv" in s.spec.constants for s in sites] == [True, False]
    backend, seen = serving_backend(sites, tmp_path, monkeypatch)
    eager_tokens, _, eager_cache, _ = decode(step(hf_llama), hf_llama, ids, 3)
    tokens, _, served_cache, _ = decode(torch.compile(step(hf_llama), backend=backend), hf_llama, ids, 3)
    assert [s.status for s in backend.sites] == ["replaced"] * 2, [(s.status, s.reason) for s in backend.sites]
    assert torch.equal(tokens, eager_tokens)
    assert_caches_are_eager_s(served_cache, eager_cache)  # layer 0 (folded) bit for bit, layer 1 close
    assert served_ops(seen[0]) == [("kernel_mutating", "decode_attention"), ("kernel", "decode_attention")]
    assert [n.target for n in seen[0].graph.nodes].count("index_copy_") == 2  # layer 1's writes only


# (a CPU Inductor compile, C++: about 5 s)
def test_inductor_refunctionalizes_the_op_and_the_compiled_step_writes_the_caches(tmp_path):
    """With the real Inductor: functionalization turns the mutating op into auto_functionalized and
    Inductor re-inplaces it: the compiled code calls the op on the module's cache buffers
    themselves (no clone of a cache, no copy back), and the step leaves eager's caches, step
    after step."""
    from torch._inductor.utils import run_and_get_code

    batch, kv_heads, q_len = 2, 2, 1
    eager, served, backend, _ = decoders_with_a_stored_winner(tmp_path, batch, kv_heads, q_len)
    compiled = torch.compile(served, backend=backend)
    with torch.no_grad():
        for offset in (1, 2, 9):
            inputs = step_inputs(batch, kv_heads, q_len, offset)
            if offset == 1:
                ours, (code,) = run_and_get_code(compiled, *inputs)
            else:
                ours = compiled(*inputs)
            torch.testing.assert_close(ours, eager(*inputs), rtol=1e-5, atol=1e-5)
            assert torch.equal(served.k_cache, eager.k_cache) and torch.equal(served.v_cache, eager.v_cache)
    assert [s.status for s in backend.sites] == ["replaced"]
    assert code.count("torch.ops.kernelsmith.kernel_mutating.default(") == 1
    assert "clone" not in code and "copy_" not in code, code


def test_the_op_refuses_a_write_it_does_not_declare():
    """kernelsmith::kernel declares no mutation: a write_kv call through it is an error, never a
    silent write; kernelsmith::kernel_mutating declaring other written inputs is refused too."""
    from kernelsmith.ops import UnsupportedWorkload

    q, new_k, new_v, _ = step_inputs(1, 1, 1, 0)
    k_cache, v_cache = torch.zeros(1, 1, 5, HEAD_DIM), torch.zeros(1, 1, 5, HEAD_DIM)
    position = torch.tensor([2])
    constants = dispatch.constants_json({"cache": "static", "scale": None, "write_kv": True})
    with pytest.raises(UnsupportedWorkload, match="writes its inputs"):
        torch.ops.kernelsmith.kernel("decode_attention", [q, k_cache, v_cache, new_k, new_v, position], constants)
    with pytest.raises(UnsupportedWorkload, match="writes its inputs"):
        MUTATING("decode_attention", [k_cache], [1], [q, v_cache, new_k, new_v, position], constants)
    assert not k_cache.any() and not v_cache.any()
    out = MUTATING("decode_attention", [k_cache, v_cache], [1, 2], [q, new_k, new_v, position], constants)
    assert torch.equal(k_cache[:, :, 2:3], new_k) and torch.equal(v_cache[:, :, 2:3], new_v)
    assert k_cache[:, :, 3:].abs().sum() == 0 and out.shape == q.shape
    # the schema's declared mutation, the fake, and functionalization (AOT dispatch) agree with the op
    checks = torch.library.opcheck(MUTATING, ("decode_attention", [k_cache, v_cache], [1, 2],
                                              [q, new_k, new_v, position], constants))  # fmt: skip
    assert set(checks.values()) == {"SUCCESS"}, checks


def test_import_kernelsmith_registers_the_mutating_op_too():
    """Registered as kernelsmith::kernel is, on ``import kernelsmith`` once torch is imported (an
    exported program holding it loads in a fresh process)."""
    from test_pt2_programs import run_python

    done = run_python("""
        import kernelsmith
        import torch
        print(torch.ops.kernelsmith.kernel_mutating.default._schema)
    """)
    assert done.returncode == 0, done.stderr
    assert "Tensor(a1!)[] written" in done.stdout and done.stdout.strip().endswith("-> Tensor")
