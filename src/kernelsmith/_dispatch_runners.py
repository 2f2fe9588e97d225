"""What serves a call: a built launcher, its autograd node, and the checks it is served with.

Part of :mod:`kernelsmith.dispatch`, which re-exports every public name here. A
:class:`KernelRunner` is a built launcher plus the shapes of the outputs it writes: calling it
allocates the outputs and launches, nothing else. :class:`KernelFunction` joins a tuned forward
and a tuned backward in one autograd node. :class:`CheckedRunner` is a runner served with checks
against the op family's PyTorch reference (DESIGN.md rule 12, :mod:`kernelsmith.servecheck`);
:func:`_reference` is that reference as ``kernelsmith::kernel`` returns it, run with autograd
switched back on inside the op's body (:func:`_autograd_inside_op`), since the references of the
backward families are autograd.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kernelsmith import servecheck
from kernelsmith.evaluate import errors
from kernelsmith.ops import OpFamily, UnsupportedWorkload, get_op
from kernelsmith.ops._base import Launcher
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec


@dataclass(frozen=True)
class KernelRunner:
    """A configured launcher and the outputs it writes.

    ``like_first_input`` marks the outputs allocated with ``torch.empty_like(inputs[0])``, a
    cheaper call than ``torch.empty``; only for a contiguous first input of the output's shape
    and dtype (the call key pins both, so every call of this runner has them). ``source_hash``
    is the one its decision names (what a failed serve check records).
    """

    launcher: Launcher
    outputs: tuple[tuple[tuple[int, ...], torch.dtype], ...]
    variant: str
    config: Config
    like_first_input: tuple[bool, ...] = ()
    source_hash: str = ""

    @classmethod
    def build(
        cls, family: OpFamily, spec: OpSpec, launcher: Launcher, variant: str, config: Config, source_hash: str = ""
    ) -> KernelRunner:
        """The runner of ``launcher`` for calls with exactly ``spec``'s inputs."""
        first = spec.inputs[0]
        outputs = tuple((t.shape, t.torch_dtype) for t in family.output_specs(spec))
        like = tuple(first.is_contiguous and t.shape == first.shape and t.dtype == first.dtype
                     for t in family.output_specs(spec))
        return cls(launcher, outputs, variant, config, like, source_hash)

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        first = inputs[0]
        if self.like_first_input == (True,):  # the common case, one output like the input
            outs = [torch.empty_like(first)]
        else:
            like = self.like_first_input or (False,) * len(self.outputs)
            outs = [
                torch.empty_like(first) if same else torch.empty(shape, dtype=dtype, device=first.device)
                for (shape, dtype), same in zip(self.outputs, like, strict=True)
            ]
        self.launcher(inputs, outs)
        return outs


class KernelFunction(torch.autograd.Function):
    """A tuned forward and a tuned backward as one autograd node.

    The forward family says how its backward is fed (``backward_inputs``: by default
    ``(dy, *inputs)``) and which input each gradient belongs to (``input_gradients``); gradients
    accumulated in float32 (weights) are cast here to their input's dtype. Returns the forward's
    single output, or a tuple when it has several.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        family: OpFamily,
        forward: Callable[[Sequence[torch.Tensor]], list[torch.Tensor]],
        backward: Callable[[Sequence[torch.Tensor]], list[torch.Tensor]],
        *inputs: torch.Tensor,
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        outputs = forward(inputs)
        ctx.save_for_backward(*inputs, *outputs)
        ctx.family, ctx.backward_runner, ctx.input_count = family, backward, len(inputs)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        saved = ctx.saved_tensors
        inputs, outputs = saved[: ctx.input_count], saved[ctx.input_count :]
        grad_outputs = tuple(g.contiguous() for g in grad_outputs)
        grads = ctx.backward_runner(ctx.family.backward_inputs(grad_outputs, inputs, outputs))
        per_input = ctx.family.input_gradients(grads, inputs)
        cast = [
            g.to(t.dtype) if g is not None and ctx.needs_input_grad[i + 3] else None
            for i, (g, t) in enumerate(zip(per_input, inputs, strict=True))
        ]
        return (None, None, None, *cast)


# ---- serve checks against the op's PyTorch reference ---------------------------------------------
class CheckedRunner:
    """A runner served with checks (DESIGN.md rule 12, :mod:`kernelsmith.servecheck`) against
    the op family's PyTorch reference: by ``kernelsmith::kernel`` for each call key, and as a
    decorated function's tuned backward.

    Its first calls and a secret sample of later ones are compared on their real inputs; after a
    failed check it runs the reference (``runner`` becomes None) and ``on_failure`` is told.
    """

    def __init__(
        self,
        runner: KernelRunner,
        op: str,
        constants: str,
        policy: servecheck.CheckPolicy,
        mode: str,
        db: Any = None,
        where: str = "kernelsmith::kernel",
        on_failure: Callable[[], None] | None = None,
    ) -> None:
        self.runner: KernelRunner | None = runner
        self.op, self.constants, self._on_failure = op, constants, on_failure
        self.check = servecheck.ServeCheck(policy, where, mode, db, self._disable) if policy.enabled else None

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        check = self.check
        if check is not None:
            check.countdown -= 1
            if check.countdown <= 0 and check.due():
                return self._checked(check, inputs)
        runner = self.runner
        if runner is None:
            return _reference_of(*_family_spec(self.op, inputs, self.constants), inputs)
        return runner(inputs)

    def _checked(self, check: servecheck.ServeCheck, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        runner = self.runner
        assert runner is not None  # a failed check is never due again
        family, spec = _family_spec(self.op, inputs, self.constants)
        if family.written_inputs(spec):
            return self._checked_writes(check, family, spec, runner, inputs)

        def reference64(clones: Sequence[torch.Tensor]) -> errors.References:
            with _autograd_inside_op():  # the references of backward families are autograd
                return errors.references(family, spec, clones, lowp=False)

        results, _ = check.run(
            family, spec, runner, inputs, lambda: _reference_of(family, spec, inputs), reference64,
            lambda: runner(inputs),
        )
        return list(results)

    def _checked_writes(self, check: servecheck.ServeCheck, family: OpFamily, spec: OpSpec, runner: KernelRunner,
                        inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:  # fmt: skip
        """A checked call of a family that writes some inputs (``kernelsmith::kernel_mutating``).

        The serve check compares the other inputs unchanged and the outputs; the written ones are
        checked here, bit for bit against :meth:`~kernelsmith.ops.OpFamily.reference_written` of
        the state the call started from (rule 2, as the harness does). The reference runs first
        and writes them; the kernel then starts again from that first state (so a kernel that
        writes nothing is caught) and, where it is wrong or raises, the reference's state is put
        back before the check fails (the trusted result, caches included, is what the call leaves).
        """
        written = family.written_inputs(spec)
        before = [t.detach().clone() for t in inputs]
        expected_state = family.reference_written(spec, before)
        read_only = [t for i, t in enumerate(inputs) if i not in written]

        def restore(states: Sequence[torch.Tensor]) -> None:
            for i, state in zip(written, states, strict=True):
                inputs[i].copy_(state)

        def kernel() -> list[torch.Tensor]:
            restore([before[i] for i in written])
            try:
                outputs = runner(inputs)
            except Exception:
                restore(expected_state)
                raise
            wrong = [i for i, want in zip(written, expected_state, strict=True) if not torch.equal(inputs[i], want)]
            if wrong:
                restore(expected_state)
                raise RuntimeError(f"the kernel left its written inputs {wrong} other than the family's update")
            return outputs

        def reference64(_: Sequence[torch.Tensor]) -> errors.References:
            # (of every input before the call: the floors, too, see the cache the call writes)
            return errors.references(family, spec, before, lowp=False)

        results, _ = check.run(
            family, spec, runner, read_only, lambda: _reference_of(family, spec, inputs), reference64, kernel
        )
        return list(results)

    def _disable(self, problem: str) -> None:
        self.runner = None
        if self._on_failure is not None:
            self._on_failure()


def _reference(
    op: str, inputs: Sequence[torch.Tensor], constants: str, written: tuple[int, ...] = ()
) -> list[torch.Tensor]:
    """The op family's PyTorch reference, as ``kernelsmith::kernel`` (``written`` empty) or
    ``kernelsmith::kernel_mutating`` (``written``: the inputs it writes) returns it (fresh tensors;
    a family that writes its inputs writes them here too)."""
    family, spec = _spec_of(op, inputs, constants, written)
    return _reference_of(family, spec, inputs)


def _reference_of(family: OpFamily, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    with _autograd_inside_op():
        return [t.detach().clone() for t in family.reference(spec, inputs)]


def _family_spec(op: str, inputs: Sequence[torch.Tensor], constants: str) -> tuple[OpFamily, OpSpec]:
    family = get_op(op)
    return family, family.spec_for(*inputs, **json.loads(constants))


def _spec_of(
    op: str, inputs: Sequence[torch.Tensor], constants: str, written: tuple[int, ...] = ()
) -> tuple[OpFamily, OpSpec]:
    """The op family and exact workload of a call, which must write exactly the inputs ``written``
    declares: none through ``kernelsmith::kernel`` (declared without mutations: torch.compile
    would not see a write), the family's written inputs through ``kernelsmith::kernel_mutating``."""
    family, spec = _family_spec(op, inputs, constants)
    writes = tuple(family.written_inputs(spec))
    if writes != tuple(written):
        through = "kernelsmith::kernel_mutating" if written else "kernelsmith::kernel"
        raise UnsupportedWorkload(f"{op}: this workload writes its inputs {list(writes)}, and {through} is called "
                                  f"declaring {list(written)} written")  # fmt: skip
    return family, spec


def _autograd_inside_op() -> contextlib.AbstractContextManager[Any]:
    """Autograd, re-enabled inside a custom op's body (where the dispatcher switches it off).

    The PyTorch references of the backward families *are* autograd (the gradient of the
    forward's formulation), so the reference fallback of ``kernelsmith::kernel`` needs it.
    """
    guard = getattr(torch._C, "_SetExcludeDispatchKeyGuard", None)
    if guard is None:  # an older torch: the references of forward families still work
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    for key in ("AutogradFunctionality", "ADInplaceOrView"):
        stack.enter_context(guard(getattr(torch._C.DispatchKey, key), False))
    stack.enter_context(torch.enable_grad())
    return stack
