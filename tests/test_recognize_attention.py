"""The recognizer's attention pattern: ``F.scaled_dot_product_attention`` and the explicit
``softmax(q @ k^T * scale + mask) @ v``.

Each positive case checks the op, the constants, that ``bind`` returns the right tensors (by
identity), that the family's ``spec_for`` takes the match's inputs and constants, and that the
function's own output passes the decorator's numerical check against the family's reference (so
the match is not a coincidence of names). Each negative case checks that nothing matched and that
the reason names the problem.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import kernelsmith
from kernelsmith.frontends.capture import Kind, capture
from kernelsmith.frontends.decorator import _differs_from_op
from kernelsmith.frontends.patterns import PATTERNS
from kernelsmith.frontends.patterns.attention import match
from kernelsmith.frontends.recognize import InputRef, Recognition, recognize
from kernelsmith.ops import get_op

B, H, S, D = 2, 4, 8, 16
ARG0, ARG1, ARG2, ARG3 = (InputRef("arg", index=i) for i in range(4))


def _t(shape: tuple[int, ...], dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


def qkv(dtype: torch.dtype = torch.float32, kv_heads: int = H, kv_len: int = S) -> tuple[torch.Tensor, ...]:
    return _t((B, H, S, D), dtype, 1), _t((B, kv_heads, kv_len, D), dtype, 2), _t((B, kv_heads, kv_len, D), dtype, 3)


def _matched(fn, args: tuple, constants: dict, refs: tuple[InputRef, ...] | None = None) -> tuple[torch.Tensor, ...]:
    """Recognized as attention with ``constants``; the family accepts it and its output is the op's."""
    rec = recognize(fn, args, {})
    assert rec.match is not None, rec.reason
    assert rec.reason == "" and rec.match.op == "attention"
    assert rec.match.constants == constants
    if refs is not None:
        assert rec.match.inputs == refs
    inputs = rec.match.bind(args, {})
    family = get_op("attention")
    spec = family.spec_for(*inputs, **rec.match.constants)
    assert _differs_from_op(family, spec, inputs, rec.output) is None
    return inputs


def _refused(fn, args: tuple, *, reason: str) -> Recognition:
    rec = recognize(fn, args, {})
    assert rec.match is None, f"unexpectedly matched {rec.match}"
    assert reason.lower() in rec.reason.lower(), rec.reason
    return rec


def test_the_pattern_is_registered() -> None:
    assert PATTERNS["attention"] is match


# ---- F.scaled_dot_product_attention -------------------------------------------------------------


def test_sdpa_arguments_become_constants() -> None:
    q, k, v = qkv()
    plain = {"layout": "bhsd", "causal": False, "scale": None}
    inputs = _matched(F.scaled_dot_product_attention, (q, k, v), plain, (ARG0, ARG1, ARG2))
    assert inputs[0] is q and inputs[1] is k and inputs[2] is v
    _matched(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v),
             {**plain, "causal": True})  # fmt: skip
    _matched(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, None, 0.0, True, scale=0.3), (q, k, v),
             {**plain, "causal": True, "scale": 0.3})  # fmt: skip
    _matched(lambda q, k, v: F.scaled_dot_product_attention(query=q, key=k, value=v, dropout_p=0.0), (q, k, v), plain)


def test_sdpa_with_grouped_queries_and_a_cache() -> None:
    q, k, v = qkv(torch.float16, kv_heads=2, kv_len=13)
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    _matched(fn, (q, k, v), {"layout": "bhsd", "causal": True, "scale": None})


@pytest.mark.parametrize("kind", ["boolean", "additive", "key-padding", "sliced"])
def test_sdpa_with_a_mask(kind: str) -> None:
    q, k, v = qkv(torch.bfloat16)
    if kind == "boolean":
        mask = torch.rand(B, 1, S, S, generator=torch.Generator().manual_seed(4)) < 0.7
        mask[..., 0] = True
    elif kind == "key-padding":
        mask = torch.ones(B, 1, 1, S, dtype=torch.bool)
        mask[1, ..., 5:] = False
    else:
        mask = _t((B, 1, S, S), torch.bfloat16, 4)
    if kind == "sliced":  # Hugging Face: attention_mask[:, :, :, : key.shape[-2]]
        def fn(q, k, v, m):  # type: ignore[no-untyped-def]
            return F.scaled_dot_product_attention(q, k, v, attn_mask=m[:, :, :, : k.shape[-2]], scale=0.25)

        constants = {"layout": "bhsd", "causal": False, "scale": 0.25}
    else:
        fn = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m)
        constants = {"layout": "bhsd", "causal": False, "scale": None}
    inputs = _matched(fn, (q, k, v, mask), constants, (ARG0, ARG1, ARG2, ARG3))
    assert inputs[3] is mask


def test_sdpa_on_bshd_tensors() -> None:
    """flash-attn's (B, S, H, D) tensors, transposed for SDPA and back: the bshd layout."""
    q, k, v = (t.transpose(1, 2).contiguous() for t in qkv(torch.float16, kv_heads=2))

    def fn(q, k, v):  # type: ignore[no-untyped-def]
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             is_causal=True, enable_gqa=True)
        return out.transpose(1, 2)

    inputs = _matched(fn, (q, k, v), {"layout": "bshd", "causal": True, "scale": None})
    assert inputs[0] is q and inputs[2] is v


def test_sdpa_look_alikes_are_refused() -> None:
    q, k, v = qkv()
    _refused(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.1), (q, k, v), reason="dropout")
    _refused(lambda q, k, v: F.scaled_dot_product_attention(q, k, v) * 2, (q, k, v), reason="not from an attention")
    _refused(lambda q, k, v: F.scaled_dot_product_attention(q * 2, k, v), (q, k, v), reason="computed by")
    pad = torch.ones(B, 1, 1, S, dtype=torch.bool)
    _refused(lambda q, k, v, p: F.scaled_dot_product_attention(q, k, v, attn_mask=~p), (q, k, v, pad),
             reason="mask is computed")  # fmt: skip
    _refused(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m[:, :, :, :4]),
             (q, _t((B, H, 4, D)), _t((B, H, 4, D)), _t((B, 1, S, S))), reason="mask is computed")  # fmt: skip
    # A transposed output with some inputs transposed and some not is no bshd attention. (With
    # none transposed, it is Hugging Face's helpers' ending: tests/test_recognize_hf_formulations.py.)
    _refused(lambda q, k, v: F.scaled_dot_product_attention(q.transpose(1, 2), k, v).transpose(1, 2),
             (q.transpose(1, 2), k, v), reason="not x.transpose(1, 2)")  # fmt: skip
    _refused(lambda q, k, v: F.scaled_dot_product_attention(q[0], k[0], v[0]), (q, k, v), reason="computed by")
    three = [t[0] for t in (q, k, v)]
    _refused(F.scaled_dot_product_attention, tuple(three), reason="4-D")


# ---- the explicit form --------------------------------------------------------------------------

EXPLICIT = {
    "@ transpose(-2, -1) / sqrt(D)": (lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(D), -1) @ v,
                                      1 / math.sqrt(D)),
    "matmul transpose(2, 3) * scale": (
        lambda q, k, v: torch.matmul(F.softmax(torch.matmul(q, k.transpose(2, 3)) * 0.125, dim=-1), v), 0.125),
    "scale * (q @ mT)": (lambda q, k, v: (0.5 * (q @ k.mT)).softmax(-1) @ v, 0.5),
    "(q * scale) @ k^T": (lambda q, k, v: torch.softmax((q * 0.25) @ k.transpose(-1, -2), dim=-1) @ v, 0.25),
    "permute, no scale": (lambda q, k, v: torch.softmax(q @ k.permute(0, 1, 3, 2), -1) @ v, 1.0),
    "swapaxes": (lambda q, k, v: torch.softmax(q @ k.swapaxes(-1, -2) * 0.25, -1) @ v, 0.25),
}


@pytest.mark.parametrize("form", sorted(EXPLICIT))
def test_explicit_forms(form: str) -> None:
    fn, scale = EXPLICIT[form]
    q, k, v = qkv()
    inputs = _matched(fn, (q, k, v), {"layout": "bhsd", "causal": False, "scale": scale}, (ARG0, ARG1, ARG2))
    assert inputs[1] is k


def test_explicit_form_with_a_mask_either_side() -> None:
    q, k, v = qkv(torch.float16)
    mask = _t((1, 1, S, S), torch.float16, 5)
    mask[..., -2:] = float("-inf")
    constants = {"layout": "bhsd", "causal": False, "scale": 0.25}
    _matched(lambda q, k, v, m: torch.softmax(q @ k.transpose(-2, -1) * 0.25 + m, dim=-1) @ v, (q, k, v, mask),
             constants, (ARG0, ARG1, ARG2, ARG3))  # fmt: skip
    _matched(lambda q, k, v, m: torch.softmax(m + 0.25 * (q @ k.transpose(-2, -1)), dim=-1) @ v, (q, k, v, mask),
             constants)  # fmt: skip


def test_hugging_face_eager_attention() -> None:
    """transformers' eager_attention_forward (no dropout, no GQA repeat): a float32 softmax cast back
    to the dtype, and the mask sliced to the keys."""

    def eager(query, key, value, attention_mask):  # type: ignore[no-untyped-def]
        attn_weights = torch.matmul(query, key.transpose(2, 3)) * (D**-0.5)
        causal_mask = attention_mask[:, :, :, : key.shape[-2]]
        attn_weights = attn_weights + causal_mask
        attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
        return torch.matmul(attn_weights, value)

    q, k, v = qkv(torch.bfloat16)
    mask = torch.zeros(B, 1, S, S, dtype=torch.bfloat16)
    mask.masked_fill_(torch.ones(S, S, dtype=torch.bool).triu(1), torch.finfo(torch.bfloat16).min)
    inputs = _matched(eager, (q, k, v, mask), {"layout": "bhsd", "causal": False, "scale": D**-0.5})
    assert inputs[3] is mask
    # The same in float32 written with .float() on the scores.
    upcast = lambda q, k, v: torch.softmax((q @ k.transpose(-2, -1)).float(), -1).to(q.dtype) @ v
    _matched(upcast, qkv(torch.float16), {"layout": "bhsd", "causal": False, "scale": 1.0})


def test_multi_query_attention_by_broadcasting() -> None:
    q, k, v = qkv(kv_heads=1, kv_len=11)
    _matched(lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1) * 0.25, -1) @ v, (q, k, v),
             {"layout": "bhsd", "causal": False, "scale": 0.25})  # fmt: skip


def test_explicit_look_alikes_are_refused() -> None:
    q, k, v = qkv()
    _refused(lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1), dim=-2) @ v, (q, k, v), reason="last dim")
    _refused(lambda q, k, v: torch.softmax(q @ k.transpose(0, 1), -1) @ v, (q, _t((H, B, D, S)), v),
             reason="last two dims")  # fmt: skip
    _refused(lambda q, k, v: torch.softmax(q @ k, -1) @ v, (q, k.transpose(-2, -1).contiguous(), v),
             reason="not by k.transpose")  # fmt: skip
    _refused(lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1), -1) @ v * 2, (q, k, v), reason="not from an")
    _refused(lambda q, k, v: torch.exp(q @ k.transpose(-2, -1)) @ v, (q, k, v), reason="")  # no softmax: no match
    mask = _t((1, 1, S, S))
    _refused(lambda q, k, v, m: torch.softmax((q @ k.transpose(-2, -1) + m) * 0.25, -1) @ v, (q, k, v, mask),
             reason="mask is scaled")  # fmt: skip
    _refused(lambda q, k, v, m: torch.softmax(q @ k.transpose(-2, -1) + m * 2, -1) @ v, (q, k, v, mask),
             reason="mask is computed")  # fmt: skip
    h, kh, vh = qkv(torch.bfloat16)
    _refused(lambda q, k, v, m: torch.softmax(q @ k.transpose(-2, -1) + m, -1).to(q.dtype) @ v, (h, kh, vh, mask),
             reason="promote the scores")  # fmt: skip
    _refused(lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1) * q.shape[-1] ** 0.5 + q.sum(), -1) @ v, (q, k, v),
             reason="mask is computed")  # fmt: skip
    _refused(lambda x, v: torch.softmax(x, -1) @ v, (_t((B, H, S, S)), v), reason="not from q @ k.transpose")
    assert match(capture(lambda q, k: q @ k.transpose(-2, -1), (q, k), {})) is None  # no softmax: not its shape


def test_the_capture_records_an_opaque_calls_arguments() -> None:
    q, k, v = qkv()
    graph = capture(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5), (q, k, v), {})
    (node,) = graph.nodes
    assert node.kind is Kind.OTHER and [a.vid for a in node.params["args"]] == [n.vid for n in node.inputs]
    assert {name: c.value for name, c in node.params["kwargs"].items()} == {"is_causal": True, "scale": 0.5}


# ---- the decorator ------------------------------------------------------------------------------


def test_the_decorator_recognizes_attention(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Database-only mode: recognized and checked as attention, then "not tuned"."""

    def attend(q, k, v):  # type: ignore[no-untyped-def]
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    q, k, v = qkv()
    wrapped = kernelsmith.optimize(attend, mode="db", db=tmp_path / "x.db")
    out = wrapped(q, k, v)
    torch.testing.assert_close(out, attend(q, k, v), rtol=0, atol=0)
    (reason,) = wrapped.kernelsmith.reasons.values()
    assert "attention" in reason and "not tuned" in reason, reason
