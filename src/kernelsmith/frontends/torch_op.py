"""The ``kernelsmith::kernel`` custom op: its schema, fake (meta) and autograd, and nothing heavy.

``torch.ops.kernelsmith.kernel(op, inputs, constants, decisions="")`` runs op family ``op`` on
``inputs`` (``constants`` as JSON). ``decisions`` is the tuned kernels the graph *carries*: the
variant and config chosen for each workload bucket, written by :func:`kernelsmith.dispatch.
encode_decisions` when a compiled or exported graph is made and parsed by
:func:`kernelsmith.dispatch.parse_decisions` (plain JSON of names and numbers, checked field by
field: never pickle, never eval). At run time the concrete inputs' shape picks its bucket's entry;
a shape without one uses the local database, else the family's PyTorch reference. So an exported
program loaded in a process whose database is empty still runs its kernels.

This module imports only torch: ``import kernelsmith`` registers the op through it (when torch is
imported, see :func:`kernelsmith._register_op`) so that ``torch.export.load`` finds the op, and
the engine (op families, the database, Triton) loads on the op's first real call.

Symbolic sizes. Under ``torch.export`` with ``Dim``, ``mark_dynamic`` or ``dynamic=True`` the
fake implementation sees SymInt sizes. Families compute their output shapes from concrete
specs, so the fake runs the family on the sizes' hints (the example values) and maps each output
size back to the input size it came from, preferring the same position of the first input (most
outputs are shaped like it), then the same position of any input, then any input size.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import torch


@torch.library.custom_op("kernelsmith::kernel", mutates_args=())
def kernel_op(op: str, inputs: list[torch.Tensor], constants: str, decisions: str = "") -> list[torch.Tensor]:
    """Run op family ``op`` on ``inputs`` with the kernel ``decisions`` carry, the stored winner
    or the op's PyTorch reference (see the module docstring)."""
    from kernelsmith import dispatch

    return dispatch.run_kernel(op, inputs, constants, decisions)


def size_hint(size: Any) -> int:
    """A size's concrete value: itself, or a SymInt's hint (the example value it was traced with)."""
    if isinstance(size, int):
        return size
    hint = getattr(getattr(size, "node", None), "hint", None)
    if hint is None:
        raise RuntimeError(f"kernelsmith::kernel needs a size hint for {size} (an unbacked size)")
    return int(hint)


def has_symbolic_size(t: torch.Tensor) -> bool:
    return not all(type(s) is int for s in (*t.shape, *t.stride()))


def concrete_meta(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor of ``t``'s dtype with its sizes and strides at their hints."""
    return torch.empty_strided(
        tuple(size_hint(s) for s in t.shape), tuple(size_hint(s) for s in t.stride()), dtype=t.dtype, device="meta"
    )


def _symbolic_size(value: int, position: int, inputs: Sequence[torch.Tensor]) -> Any:
    """The input size an output size ``value`` (at ``position``) comes from (module docstring)."""
    ordered = [inputs[0], *inputs[1:]]
    for t in ordered:  # the same position, the first input first
        if position < t.dim() and size_hint(t.shape[position]) == value:
            return t.shape[position]
    for t in ordered:
        for size in t.shape:
            if size_hint(size) == value:
                return size
    return value


def output_metas(op: str, inputs: Sequence[torch.Tensor], constants: str) -> list[tuple[list[Any], torch.dtype]]:
    """Each output's shape (SymInts where the inputs' sizes are symbolic) and dtype."""
    from kernelsmith.ops import get_op

    family = get_op(op)
    symbolic = any(has_symbolic_size(t) for t in inputs)
    examples = [concrete_meta(t) for t in inputs]  # meta: a family's spec never reads a fake's data
    spec = family.spec_for(*examples, **json.loads(constants))
    outputs = []
    for out in family.output_specs(spec):
        shape = [_symbolic_size(s, i, inputs) for i, s in enumerate(out.shape)] if symbolic else list(out.shape)
        outputs.append((shape, out.torch_dtype))
    return outputs


@kernel_op.register_fake
def _kernel_op_fake(op: str, inputs: list[torch.Tensor], constants: str, decisions: str = "") -> list[torch.Tensor]:
    return [inputs[0].new_empty(shape, dtype=dtype) for shape, dtype in output_metas(op, inputs, constants)]


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    op, tensors, constants, *rest = inputs
    ctx.op, ctx.constants, ctx.count = op, constants, len(tensors)
    ctx.decisions = rest[0] if rest else ""
    ctx.save_for_backward(*tensors, *output)


def _backward(ctx: Any, grads: Sequence[torch.Tensor | None]) -> tuple[Any, ...]:
    """The gradient of ``kernelsmith::kernel``: the op family's backward family, itself a
    ``kernelsmith::kernel`` call with the same carried decisions (its tuned winner, or its
    PyTorch reference), so that compiled training steps hold the tuned backward too."""
    from kernelsmith.ops import get_op

    family = get_op(ctx.op)
    if family.backward is None:
        raise RuntimeError(f"kernelsmith::kernel({ctx.op}) has no backward family: it cannot be differentiated")
    saved = ctx.saved_tensors
    inputs, outputs = saved[: ctx.count], saved[ctx.count :]
    filled = tuple(
        (torch.zeros_like(out) if g is None else g).contiguous() for g, out in zip(grads, outputs, strict=True)
    )
    backward_inputs = family.backward_inputs(filled, inputs, outputs)
    gradients = kernel_op(family.backward, list(backward_inputs), ctx.constants, ctx.decisions)
    per_input = family.input_gradients(gradients, inputs)
    cast = [None if g is None else g.to(t.dtype) for g, t in zip(per_input, inputs, strict=True)]
    # The dispatcher drops an argument equal to its default (no decisions): no gradient slot for it.
    return (None, cast, None, None) if ctx.decisions else (None, cast, None)


kernel_op.register_autograd(_backward, setup_context=_setup_context)

KERNEL = torch.ops.kernelsmith.kernel.default


# ---- kernelsmith::kernel_mutating: families that write some of their inputs in place -------------
# A few families are defined by a write: decode_attention with ``write_kv`` stores the new tokens'
# keys and values into the KV cache and attends in one pass. ``kernelsmith::kernel`` declares no
# mutation (torch.compile would not see the write), so these run through a second op whose schema
# says which tensors it writes: ``written`` (``Tensor(a!)[]``), the family's written inputs, which
# ``written_at`` puts back at their places among ``inputs`` (the others) to make the family's
# argument list. Under torch.compile, functionalization turns the call into an
# ``auto_functionalized`` node and Inductor re-inplaces it (the kernel writes the caches themselves:
# no copy); in an exported program the mutation is in the schema. Its one output (a Tensor, not
# ``Tensor[]``: torch 2.13's auto_functionalize supports no list return) is a fresh tensor, never a
# view of a written input (what ``torch.library`` requires of a mutating op). No autograd:
# a write is not differentiated (the backend refuses such sites in training, the family having no
# backward).


def family_inputs(written: Sequence[torch.Tensor], written_at: Sequence[int],
                  inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:  # fmt: skip
    """The family's argument list: ``inputs`` with each ``written[i]`` inserted at ``written_at[i]``."""
    if len(written) != len(written_at) or sorted(written_at) != list(written_at):
        raise ValueError(f"kernelsmith::kernel_mutating: {len(written)} written tensors at {list(written_at)}")
    merged = list(inputs)
    for index, tensor in zip(written_at, written, strict=True):  # ascending: each index is final when inserted
        if not 0 <= index <= len(merged):
            raise ValueError(f"kernelsmith::kernel_mutating: a written input at {index} of {len(merged) + 1}")
        merged.insert(index, tensor)
    return merged


@torch.library.custom_op("kernelsmith::kernel_mutating", mutates_args=("written",))
def kernel_mutating_op(op: str, written: list[torch.Tensor], written_at: list[int], inputs: list[torch.Tensor],
                       constants: str, decisions: str = "") -> torch.Tensor:  # fmt: skip
    """Run op family ``op``, which writes ``written`` in place, as ``kernelsmith::kernel`` runs a
    family (the carried decision, the stored winner or the reference; the same runner table), and
    return its one output."""
    from kernelsmith import dispatch

    merged = family_inputs(written, written_at, inputs)
    (output,) = dispatch.run_kernel(op, merged, constants, decisions, written=tuple(written_at))
    return output


@kernel_mutating_op.register_fake
def _kernel_mutating_fake(op: str, written: list[torch.Tensor], written_at: list[int], inputs: list[torch.Tensor],
                          constants: str, decisions: str = "") -> torch.Tensor:  # fmt: skip
    merged = family_inputs(written, written_at, inputs)
    outputs = output_metas(op, merged, constants)
    if len(outputs) != 1:
        raise RuntimeError(f"kernelsmith::kernel_mutating({op}) returns one output, and {op} has {len(outputs)}")
    ((shape, dtype),) = outputs
    return merged[0].new_empty(shape, dtype=dtype)


KERNEL_MUTATING = torch.ops.kernelsmith.kernel_mutating.default
