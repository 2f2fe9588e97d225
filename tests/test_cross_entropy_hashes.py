"""Every cross-entropy variant's source hash covers the modules whose code it runs.

The kernels of the cross-entropy families live in ``ops/_cross_entropy_kernels.py`` and their
launchers in ``ops/_cross_entropy_launch.py``, beside the family modules; the linear +
cross-entropy families run some of that code too. A stored decision is served only while its
variant's source hash is unchanged, so an edit of any of these modules must change the hash of
every variant that runs it (``Variant.modules``), or a decision measured on the old code would
be served for the new.
"""

from __future__ import annotations

import inspect
import sys

import pytest

from kernelsmith.ops import get_op

GRADIENTS = ("cross_entropy_backward", "cross_entropy_fused")
LINEAR = ("linear_cross_entropy", "linear_cross_entropy_backward", "linear_cross_entropy_fused")
EVERY = ("cross_entropy", *GRADIENTS, *LINEAR)


def _hashes(families: tuple[str, ...]) -> dict[tuple[str, str], str]:
    return {(f, v.name): v.source_hash for f in families for v in get_op(f).variants}


@pytest.mark.parametrize(
    ("module", "families"),
    [
        ("kernelsmith.ops._cross_entropy_kernels", EVERY),
        ("kernelsmith.ops._cross_entropy_launch", EVERY),
        ("kernelsmith.ops.cross_entropy", ("cross_entropy",)),
        ("kernelsmith.ops.cross_entropy_backward", GRADIENTS),
        ("kernelsmith.ops._linear_cross_entropy_chunks", LINEAR[1:]),
    ],
)
def test_an_edit_of_a_module_changes_the_hash_of_every_variant_that_runs_it(
    module: str, families: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _hashes(families)
    real = inspect.getsource
    edited = sys.modules[module]

    def getsource(obj: object) -> str:  # the module's text as if someone had edited it
        text = real(obj)  # type: ignore[arg-type]
        return text + "\n# an edit\n" if obj is edited else text

    monkeypatch.setattr(inspect, "getsource", getsource)
    after = _hashes(families)
    unchanged = sorted(key for key in before if before[key] == after[key])
    assert not unchanged, f"an edit of {module} leaves these hashes unchanged: {unchanged}"
