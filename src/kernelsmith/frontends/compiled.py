"""A decorated function under ``torch.compile`` and ``torch.export``: one op call, any shape.

When Dynamo (or export's tracer) runs a ``@kernelsmith.optimize`` function, nothing of the eager
path may run: the call key holds sizes (a SymInt is unhashable, and reading one specializes the
graph to it), the eager table holds launchers Dynamo would trace into, and the first call tunes.
Instead :func:`traced_call` describes the call without any size (:func:`structure`: dtypes,
devices, ranks, ``requires_grad``, grad and autocast state, the other arguments) and asks
:func:`compile_plan` what to emit. That function is marked ``assume_constant_result``: Dynamo
calls it once while tracing, on those constants, and bakes its answer into the graph with no
guard on anything it read; under export (non-strict) it is an ordinary call. Sizes are left out
because Dynamo cannot tell a static size from a symbolic one without a guard, and the graph must
not depend on them: the shape is chosen at run time.

The plan is worked out in a fresh thread, which starts with no fake-tensor mode, no tracing
proxy, no torch function mode and no Dynamo frame hook (all thread-local), so the recognizer can
run the user's function on real sample tensors as it does eagerly, every size
:data:`SAMPLE_SIZE`, and the match must pass the same numerical check as an eager first call. A
plan is then

- ``None`` (the original function is traced, and Inductor compiles it as usual) when no op is
  recognized, a tensor is reached by reference (a module's weight held outside the arguments) or
  reshaped, autocast is on, the workload is unsupported, or no kernel decision with the call's
  op, constants and dtypes is stored (or pinned);
- else ``(op, constants, bindings, decisions)``: the graph calls ``kernelsmith::kernel`` with the
  bound arguments and carries ``decisions`` (:func:`kernelsmith.dispatch.encode_decisions`):
  every stored winner of the op with these constants and dtypes on this machine (one per tuned
  bucket), plus those of its backward family when gradients are needed, or the pinned config.
  Where the op (or, in training, its backward family) has none under this fingerprint, the
  winners stored under a near one (before an upgrade) are re-validated here first.
  At run time the concrete shape picks its exact workload's or its bucket's entry, else the
  local database, else the family's PyTorch reference.

So one graph serves every shape (``dynamic=True``, ``mark_dynamic``, ``Dim``), a compile with a
stored winner and no eager warm-up emits the op, a training step differentiates through the op's
registered autograd (its backward family), and an exported program runs its kernels in a process
with an empty database. The cost of leaving sizes out: a function whose meaning depends on its
sizes (a branch on ``x.shape[-1]``) is recognized at the sample size only; such code is rare in
the functions these families match, and served kernels are still checked against the family's
reference on their first calls (:mod:`kernelsmith.servecheck`).
"""

from __future__ import annotations

import json
import logging
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from kernelsmith.frontends.torch_op import KERNEL

if TYPE_CHECKING:
    from kernelsmith.frontends.decorator import Optimized

log = logging.getLogger(__name__)

SAMPLE_SIZE = 16  # every size of the recognizer's sample call
Plan = tuple[str, str, tuple[tuple[str, Any, Any], ...], str]

# Decorated functions by serial number: compile_plan takes constants only, so it finds its
# function's state here. Weak: a decorated function that goes away takes its entry with it.
_STATES: weakref.WeakValueDictionary[str, Optimized] = weakref.WeakValueDictionary()
_SERIAL = iter(range(1, 1 << 62))
_SERIAL_LOCK = threading.Lock()


def register(state: Optimized) -> str:
    """A name for ``state`` that :func:`compile_plan` resolves. A string: Dynamo passes strings
    on as constants, where an integer attribute may be made a symbolic size (``dynamic=True``)."""
    with _SERIAL_LOCK:
        serial = f"kernelsmith-{next(_SERIAL)}"
    _STATES[serial] = state
    return serial


# torch's one-call test for "any autocast region is on" (every supported torch has it; a torch
# without it is asked per device).
_ANY_AUTOCAST = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)


def autocast_state() -> tuple[tuple[str, torch.dtype], ...]:
    """The autocast regions this thread is in, with their dtypes (empty when none): part of a
    call's key, since autocast changes what the user's function computes. The common case, no
    autocast, is one C call (this runs on every decorated call)."""
    if not _ANY_AUTOCAST():
        return ()
    return tuple(
        (device, torch.get_autocast_dtype(device)) for device in ("cuda", "cpu") if torch.is_autocast_enabled(device)
    )


def _describe(value: Any) -> tuple[Any, ...]:
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), str(value.device), value.dim(), bool(value.requires_grad))
    if value is None or isinstance(value, bool | int | float | str):
        return ("value", type(value).__name__, value)
    return ("object", type(value).__name__)  # nothing a plan can pin: the original function is traced


def structure(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """A call without its symbolic sizes' values (see the module docstring)."""
    described = tuple(_describe(v) for v in args)
    named = tuple((name, _describe(kwargs[name])) for name in sorted(kwargs))
    return (torch.is_grad_enabled(), bool(autocast_state()), described, named)


def traced_call(state: Optimized, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What a decorated function's call is while Dynamo or export traces it."""
    plan = compile_plan(state.serial, structure(args, kwargs))
    if plan is None:
        return state.fn(*args, **kwargs)
    op, constants, bindings, decisions = plan
    inputs = []
    for kind, where, reshape in bindings:
        tensor = args[where] if kind == "arg" else kwargs[where]
        inputs.append(tensor if reshape is None else tensor.reshape(reshape))
    carried = exported_decision(op, inputs, constants, decisions)
    if carried:  # only ever under a non-strict export, never in Dynamo's trace
        from kernelsmith.frontends import triton_ops

        return triton_ops.register()(op, inputs, constants, carried)[0]
    return KERNEL(op, inputs, constants, decisions)[0]


def _non_strict_export() -> bool:
    """Whether ``torch.export`` traces this call as plain Python (its default, non-strict mode),
    not Dynamo (``torch.compile``, or a strict export), which must not run the thread below."""
    exporting = getattr(torch.compiler, "is_exporting", lambda: False)
    return bool(exporting()) and not torch.compiler.is_dynamo_compiling()


def exported_decision(op: str, inputs: list[torch.Tensor], constants: str, decisions: str) -> str:
    """The ``decision`` of ``kernelsmith::triton_kernel`` for a call that a non-strict
    ``torch.export`` traces with static sizes and no gradient, or "" for ``kernelsmith::kernel``.

    An exported program then holds the very kernel its shape was tuned for
    (:mod:`kernelsmith.frontends.triton_ops`), which AOTInductor compiles into its package, where
    ``kernelsmith::kernel`` would carry the decisions as a string for kernelsmith to resolve at
    run time. The choice is the compile backend's (:func:`triton_ops.site_decision`: compiled
    Triton kernels, a launcher whose trace records its launches), made in a fresh thread as
    :func:`compile_plan` is, since it traces the op's body while export's own tracer is active
    in this one. A symbolic size (``Dim``) keeps ``kernelsmith::kernel``, whose carried
    decisions serve every shape."""
    from kernelsmith import dispatch
    from kernelsmith.frontends.torch_op import has_symbolic_size
    from kernelsmith.ops import get_op

    if not inputs or not _non_strict_export() or any(has_symbolic_size(t) for t in inputs):
        return ""
    if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
        return ""  # the Triton op has no autograd formula; kernelsmith::kernel's runs the tuned backward
    device = inputs[0].device
    layouts = [(tuple(t.shape), t.stride(), t.dtype) for t in inputs]  # plain ints: the sizes are static
    box: list[str] = []

    def work() -> None:  # no tracer here: the meta tensors below are not recorded in the program
        from kernelsmith.frontends import triton_ops

        try:
            metas = [torch.empty_strided(shape, stride, dtype=dtype, device="meta") for shape, stride, dtype in layouts]
            family = get_op(op)
            spec = family.spec_for(*metas, **json.loads(constants))
            mode = "gpu" if device.type == "cuda" else "interpreter"
            record = dispatch.carried_entry(decisions, mode, family, spec)
            if record is not None:
                box.append(triton_ops.site_decision(op, metas, constants, record, mode, device, static=True,
                                                    training=False))
        except Exception as exc:  # the Triton op is an optimization: kernelsmith::kernel serves
            log.info("%s under export: kernelsmith::kernel: %s: %s", op, type(exc).__name__, exc)

    thread = threading.Thread(target=work, name="kernelsmith-export-decision")
    thread.start()
    thread.join()
    return box[0] if box else ""


def compile_plan(serial: str, described: tuple[Any, ...]) -> Plan | None:
    """The plan of a traced call (module docstring); run at trace time, on constants only."""
    state = _STATES.get(serial)
    if state is None:
        return None
    box: list[Any] = []

    def work() -> None:
        try:
            box.append(_plan(state, described))
        except Exception as exc:  # planning is an optimization: it never breaks the user's compile
            log.info("kernelsmith: tracing %s unchanged: %s: %s", _name(state.fn), type(exc).__name__, exc)
            box.append(None)

    thread = threading.Thread(target=work, name="kernelsmith-compile-plan")
    thread.start()
    thread.join()
    return box[0] if box else None


compile_plan = torch.compiler.assume_constant_result(compile_plan)


def _name(fn: Callable[..., Any]) -> str:
    return str(getattr(fn, "__qualname__", fn))


def _sample(described: tuple[Any, ...]) -> Any:
    """A real argument for the recognizer's call, from its description."""
    kind = described[0]
    if kind == "value":
        return described[2]
    if kind != "tensor":
        raise _NoPlan("an argument that is neither a tensor nor a plain value")
    _, dtype_name, device, ndim, requires_grad = described
    dtype = getattr(torch, dtype_name.removeprefix("torch."))
    shape = (SAMPLE_SIZE,) * ndim
    generator = torch.Generator(device=device).manual_seed(0)
    if dtype.is_floating_point:
        sample = torch.randn(shape, generator=generator, device=device).to(dtype)
        return sample.requires_grad_(requires_grad)
    if dtype == torch.bool:
        return torch.ones(shape, dtype=torch.bool, device=device)
    return torch.zeros(shape, dtype=dtype, device=device)  # integers: zeros are valid indices


class _NoPlan(Exception):
    """The original function is traced; the message says why (logged at debug)."""


def _plan(state: Optimized, described: tuple[Any, ...]) -> Plan | None:
    try:
        return _make_plan(state, described)
    except _NoPlan as why:
        log.debug("%s under compile: the original function is traced: %s", _name(state.fn), why)
        return None


def _make_plan(state: Optimized, described: tuple[Any, ...]) -> Plan:
    from kernelsmith import dispatch
    from kernelsmith.db import open_database
    from kernelsmith.frontends.decorator import _differs_from_op
    from kernelsmith.frontends.recognize import recognize
    from kernelsmith.ops import UnsupportedWorkload, get_op

    grad, autocast, positional, named = described
    if autocast:
        raise _NoPlan("autocast is on")
    args = tuple(_sample(d) for d in positional)
    kwargs = {name: _sample(d) for name, d in named}
    tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
    mode = dispatch.mode_for(tensors) if tensors else None
    if mode is None:
        raise _NoPlan("not CUDA tensors (set KERNELSMITH_INTERPRET=1 to run kernels on the CPU)")
    with torch.set_grad_enabled(grad):
        recognition = recognize(state.fn, args, kwargs)
    match = recognition.match
    if match is None:
        raise _NoPlan(f"no op recognized ({recognition.reason})")
    if any(ref.kind == "external" for ref in match.inputs):
        raise _NoPlan("an input is reached by reference, not passed as an argument")
    if any(not ref.as_given for ref in match.inputs):  # reshaped, or transposed (InputRef.transpose)
        raise _NoPlan("an input is reshaped (to sizes the sample call cannot tell) or transposed")
    family = get_op(match.op)
    inputs = tuple(t.detach() for t in match.bind(args, kwargs, check=False))
    try:
        spec = family.spec_for(*inputs, **match.constants)
    except UnsupportedWorkload as exc:
        raise _NoPlan(str(exc)) from None
    problem = _differs_from_op(family, spec, inputs, recognition.output)
    if problem:
        raise _NoPlan(f"looks like {match.op} but computes something else: {problem}")
    needs_grad = grad and any(t.requires_grad for t in tensors)
    if needs_grad and family.backward is None:
        raise _NoPlan(f"inputs require grad and {match.op} has no backward family")
    records = state.carried_decisions(family, spec, mode, inputs if needs_grad else None)
    # After an upgrade (another driver build or kernelsmith release): the winners tuned before
    # it, re-validated here, for the forward (unless a config is pinned) and, in a training
    # graph, for the backward family, each once per workload and process. A backward that does
    # not re-validate is not carried: the call's backward then resolves at run time.
    backward = get_op(family.backward) if needs_grad and family.backward is not None else None
    near_forward = not any(r.op == family.name for r in records) and state.config is None
    near_backward = backward is not None and not any(r.op == backward.name for r in records)
    if near_forward or near_backward:
        with open_database(state.db) as db:
            if near_forward:
                dispatch.revalidate_near_winners(db, family, spec, mode)
            if backward is not None and near_backward:
                dispatch.revalidate_near_winners(db, backward, spec, mode, compare_dtypes=False)
        records = state.carried_decisions(family, spec, mode, inputs if needs_grad else None)
    if not any(r.op == family.name for r in records):
        raise _NoPlan(f"no {match.op} kernel with these constants and dtypes is stored or pinned")
    bindings = tuple(
        ("arg", ref.index, ref.reshape) if ref.kind == "arg" else ("kwarg", ref.name, ref.reshape)
        for ref in match.inputs
    )
    constants = dispatch.constants_json(dict(match.constants))
    log.info("%s under compile: kernelsmith::kernel(%s) with %d carried decision(s)", _name(state.fn), match.op,
             len(records))
    return match.op, constants, bindings, dispatch.encode_decisions(records, mode)
