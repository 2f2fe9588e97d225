"""Call-time dispatch: from a stored decision to a launcher, and the ``torch.library`` op.

A :class:`KernelRunner` is a built launcher plus the shapes of the outputs it writes: calling it
allocates the outputs and launches, nothing else. Front doors keep runners in in-process tables
keyed by the call's shapes, dtypes, strides and device, so a repeated call does no hashing of
large objects, no database query and no tracing.

``torch.ops.kernelsmith.kernel(op, inputs, constants)`` exposes every tuned kernel as one
``torch.library`` custom op with a fake (meta) implementation, so that torch.compile graphs and
torch.export can hold kernelsmith kernels. Its implementation serves the stored winner for the
inputs' workload (or the op's PyTorch reference when the database has none).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kernelsmith.db import Database, DecisionRecord, current_fingerprint, open_database
from kernelsmith.ops import OpFamily, UnsupportedWorkload, get_op
from kernelsmith.ops._base import Launcher
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KernelRunner:
    """A configured launcher and the outputs it writes.

    ``like_first_input`` marks the outputs allocated with ``torch.empty_like(inputs[0])``, a
    cheaper call than ``torch.empty``; only for a contiguous first input of the output's shape
    and dtype (the call key pins both, so every call of this runner has them).
    """

    launcher: Launcher
    outputs: tuple[tuple[tuple[int, ...], torch.dtype], ...]
    variant: str
    config: Config
    like_first_input: tuple[bool, ...] = ()

    @classmethod
    def build(cls, family: OpFamily, spec: OpSpec, launcher: Launcher, variant: str, config: Config) -> KernelRunner:
        """The runner of ``launcher`` for calls with exactly ``spec``'s inputs."""
        first = spec.inputs[0]
        outputs = tuple((t.shape, t.torch_dtype) for t in family.output_specs(spec))
        like = tuple(first.is_contiguous and t.shape == first.shape and t.dtype == first.dtype
                     for t in family.output_specs(spec))
        return cls(launcher, outputs, variant, config, like)

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
        ctx: Any, family: OpFamily, forward: KernelRunner, backward: KernelRunner, *inputs: torch.Tensor
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


def build_runner(family: OpFamily, spec: OpSpec, decision: DecisionRecord) -> KernelRunner:
    """The runner of a "kernel" decision for ``spec`` (the exact call, not its bucket).

    Raises LookupError when the stored variant no longer exists or its source changed since it
    was measured: a decision is only as good as the code it was measured on.
    """
    variant = family.variant(decision.variant)
    if decision.source_hash and decision.source_hash != variant.source_hash:
        raise LookupError(f"{family.name}/{variant.name} changed since it was tuned (source hash differs)")
    config = Config(decision.config)
    return KernelRunner.build(family, spec, variant.build(spec, config), variant.name, config)


def interpreter_enabled() -> bool:
    """Whether the user asked for kernels on CPU tensors through the Triton interpreter."""
    import os

    return os.environ.get("KERNELSMITH_INTERPRET") == "1" or os.environ.get("TRITON_INTERPRET") == "1"


def mode_for(tensors: Sequence[torch.Tensor]) -> str | None:
    """ "gpu" for CUDA tensors, "interpreter" for CPU tensors when enabled, else None."""
    devices = {t.device.type for t in tensors}
    if devices == {"cuda"}:
        return "gpu"
    if devices == {"cpu"} and interpreter_enabled():
        return "interpreter"
    return None


def stored_decision(db: Database, mode: str, bucket: OpSpec) -> DecisionRecord | None:
    return db.get_decision(current_fingerprint(mode).hash, bucket.workload_hash)


# ---- the torch.library op ------------------------------------------------------------------------
_RUNNERS: dict[tuple[Any, ...], KernelRunner | None] = {}
_RUNNERS_LOCK = threading.Lock()


def _spec_of(op: str, inputs: Sequence[torch.Tensor], constants: str) -> tuple[OpFamily, OpSpec]:
    family = get_op(op)
    return family, family.spec_for(*inputs, **json.loads(constants))


def _runner_for(op: str, inputs: Sequence[torch.Tensor], constants: str) -> KernelRunner | None:
    key = (op, constants, *((tuple(t.shape), t.dtype, t.stride(), t.device) for t in inputs))
    if key in _RUNNERS:
        return _RUNNERS[key]
    runner: KernelRunner | None = None
    mode = mode_for(inputs)
    try:
        family, spec = _spec_of(op, inputs, constants)
        if mode is not None:
            with open_database() as db:
                decision = stored_decision(db, mode, family.bucket(spec))
            if decision is not None and decision.winner == "kernel":
                runner = build_runner(family, spec, decision)
    except (UnsupportedWorkload, LookupError, KeyError) as exc:
        log.info("kernelsmith::kernel(%s) uses the PyTorch reference: %s", op, exc)
    with _RUNNERS_LOCK:
        _RUNNERS[key] = runner
    return runner


@torch.library.custom_op("kernelsmith::kernel", mutates_args=())
def kernel_op(op: str, inputs: list[torch.Tensor], constants: str) -> list[torch.Tensor]:
    """Run op family ``op`` on ``inputs`` (constants as JSON) with its stored winner."""
    runner = _runner_for(op, inputs, constants)
    if runner is None:
        family, spec = _spec_of(op, inputs, constants)
        return [t.clone() for t in family.reference(spec, inputs)]
    return runner(inputs)


@kernel_op.register_fake
def _kernel_op_fake(op: str, inputs: list[torch.Tensor], constants: str) -> list[torch.Tensor]:
    family, spec = _spec_of(op, inputs, constants)
    return [inputs[0].new_empty(t.shape, dtype=t.torch_dtype) for t in family.output_specs(spec)]


def constants_json(constants: dict[str, Any]) -> str:
    return json.dumps(constants, sort_keys=True)
