"""Rule 7's allowance for built-in variants that compute with a library by design.

A built-in variant may declare the aten ops its reviewed launcher issues (``Variant.library_ops``:
the linear + cross-entropy gradients' ``chunked_library_gemm`` runs cuBLAS's GEMMs around a Triton
row kernel). The worker grants that allowance to the variant's own candidates only: a kernel file,
whatever variant name it carries, gets none (tests/interpreter/test_linear_cross_entropy_kernels.py
runs the variant through the real harness with and without it).
"""

from __future__ import annotations

import torch

from kernelsmith.evaluate import validate as validate_module
from kernelsmith.evaluate._worker_candidates import library_ops_of
from kernelsmith.evaluate.protocol import Candidate
from kernelsmith.ops import get_op
from kernelsmith.ops._linear_cross_entropy_library import LIBRARY_VARIANT
from kernelsmith.space import Config


def test_only_a_built_in_candidate_gets_its_variants_allowance() -> None:
    op = get_op("linear_cross_entropy_fused")
    built_in = Candidate(LIBRARY_VARIANT.name, Config({}))
    assert library_ops_of(op, built_in) == LIBRARY_VARIANT.library_ops != frozenset()
    kernel_file = Candidate(LIBRARY_VARIANT.name, Config({}), source="# a kernel file naming the variant\n")
    assert library_ops_of(op, kernel_file) == frozenset()
    assert library_ops_of(op, Candidate("chunked", Config({}))) == frozenset()


def test_every_declared_allowance_is_of_compute_ops_not_a_wildcard() -> None:
    """Every family's allowances name real aten overloads (a typo would allow nothing, a pattern
    is not supported), and no variant but the reviewed library ones declares any."""
    from kernelsmith.ops import op_names

    families = [get_op(name) for name in op_names()]
    declared = {(op.name, v.name): v.library_ops for op in families for v in op.variants if v.library_ops}
    assert set(declared) == {("linear_cross_entropy_backward", LIBRARY_VARIANT.name),
                             ("linear_cross_entropy_fused", LIBRARY_VARIANT.name)}  # fmt: skip
    for ops in declared.values():
        for name in ops:
            namespace, overload_packet, overload = name.split(".")
            assert namespace == "aten"
            getattr(getattr(torch.ops.aten, overload_packet), overload)  # raises for a name torch lacks


def test_the_watch_records_what_is_outside_the_allowance_only() -> None:
    x = torch.ones(2, 2)
    with validate_module.TorchOpWatch(frozenset({"aten.mm.default"})) as watch:
        torch.mm(x, x)
        torch.softmax(x, -1)
    assert watch.issued == ["aten._softmax.default"]
