"""``kernelsmith::triton_kernel``: a tuned kernel Inductor can see, fuse around and package.

``kernelsmith::kernel`` (:mod:`kernelsmith.frontends.torch_op`) is a ``torch.library.custom_op``:
opaque to Inductor, which calls back into Python for it, and to AOTInductor, which cannot put
it in a package. ``torch.library.triton_op`` is the PyTorch 2 way to expose Triton kernels
instead: its body is traced (under AOTAutograd's functionalization) down to the
``wrap_triton(kernel)[grid](...)`` launches it makes, so Inductor compiles the very kernel as a
user-defined Triton kernel in its own generated code, and AOTInductor compiles it into the
package (no Python, no database, no kernelsmith needed where the package runs).

The op (one for every family: the family, its variant and its config are arguments)::

    kernelsmith::triton_kernel(str op, Tensor[] inputs, str constants, str decision) -> Tensor[]

``decision`` is one carried winner in :func:`kernelsmith.dispatch.encode_decisions`' JSON (the
variant, its source hash and its config, never code). The body builds the variant's launcher for
the inputs' concrete shape, allocates the outputs with ``torch.empty`` and launches. Under a
tracer (Inductor's, export's, a fake-tensor run) every launch goes through ``wrap_triton``
(:func:`_traceable`, installed in :func:`kernelsmith.ops._launch.direct_launch` for that build
only) and the launcher is built afresh for each trace; an eager call (an exported program run
without compiling it) uses kernelsmith's direct launch, cached per call. A body whose decision
does not fit its inputs (another workload, a variant changed since) runs the family's PyTorch
reference, which traces too.

Building the launcher needs concrete sizes, so the op is only for static graphs; the compile
backend (:mod:`kernelsmith.frontends.backend`) knows a graph is static from its example inputs'
sizes (plain ints, no guard needed) and asks :func:`site_decision` for each kept site. It gets
the op exactly when :func:`choose` says so: torch has ``triton_op``, the shape is static, the
site has a kernel winner, the graph is not a training graph (the op has no autograd formula;
training keeps ``kernelsmith::kernel``, whose formula runs the tuned backward), and every kernel
the launcher launches is a compiled Triton kernel (a ``JITFunction``; the Triton interpreter's
``InterpretedFunction`` cannot be traced). Then one trace of the body on fake inputs
(:func:`_probe`) must record at least one Triton launch and nothing Inductor cannot take (a raw
``kernel[grid]`` launch, a host read of a tensor's data): a family whose launcher needs such host
logic keeps ``kernelsmith::kernel``. Each reason for keeping it is logged once per family.

What the op gives up: calls run inside Inductor's code, so the per-call serve checks of
``kernelsmith::kernel`` (:mod:`kernelsmith.servecheck`) do not run; the backend's check of the
stored kernel on fresh inputs against the float64 reference, before the site is kept, does.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kernelsmith.ops._launch import launches_through

log = logging.getLogger(__name__)

OP_NAME = "kernelsmith::triton_kernel"


class NotTraceable(RuntimeError):
    """A launcher that cannot be built for tracing (a kernel that is not a ``JITFunction``)."""


# ---- whether this torch can have the op ----------------------------------------------------------
def unsupported_reason() -> str | None:
    """Why this torch (or Triton) cannot register the op, or None when it can."""
    library = torch.library
    if not hasattr(library, "triton_op") or not hasattr(library, "wrap_triton"):
        return f"torch {torch.__version__} has no torch.library.triton_op / wrap_triton"
    try:
        from triton.runtime.jit import JITFunction  # noqa: F401
    except ImportError:
        return "Triton is not installed"
    return None


def is_compiled_kernel(kernel: Any) -> bool:
    """Whether ``kernel`` is a Triton ``JITFunction`` (what ``wrap_triton`` traces), not the
    interpreter's ``InterpretedFunction`` nor anything else."""
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:
        return False
    return isinstance(kernel, JITFunction)


# ---- the choice ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Choice:
    """Whether a site's call is ``kernelsmith::triton_kernel`` (else ``kernelsmith::kernel``), and why not."""

    triton_op: bool
    reason: str = ""


def choose(
    *, supported: str | None, static: bool, winner: bool, training: bool, kernels: Sequence[Any]
) -> Choice:
    """The op for one site, from what is known about it (module docstring).

    ``supported``: :func:`unsupported_reason`'s answer; ``static``: every input size and stride is
    a plain int; ``winner``: a stored (or carried) kernel decision serves the site; ``training``:
    the graph needs the site's gradient; ``kernels``: the kernels its launcher launches.
    """
    if supported is not None:
        return Choice(False, supported)
    if not static:
        return Choice(False, "the graph has symbolic sizes (the launcher is built for one shape)")
    if not winner:
        return Choice(False, "no kernel winner serves the site")
    if training:
        return Choice(False, "a training graph (the Triton op has no autograd formula; kernelsmith::kernel's runs "
                             "the tuned backward)")
    if not kernels:
        return Choice(False, "its launcher launches no kernel through kernelsmith's launcher")
    foreign = [k for k in kernels if not is_compiled_kernel(k)]
    if foreign:
        kinds = ", ".join(sorted({type(k).__name__ for k in foreign}))
        return Choice(False, f"its kernels are not compiled Triton kernels ({kinds}: the Triton interpreter?), "
                             "which Inductor cannot trace")
    return Choice(True)


_logged: set[tuple[str, str]] = set()
_logged_lock = threading.Lock()


def _log_once(op: str, reason: str) -> None:
    with _logged_lock:
        if (op, reason) in _logged:
            return
        _logged.add((op, reason))
    log.info("%s is called through kernelsmith::kernel, not %s: %s", op, OP_NAME, reason)


def site_decision(
    op: str, inputs: Sequence[torch.Tensor], constants: str, record: Any, mode: str, device: torch.device, *,
    static: bool, training: bool,
) -> str:
    """The ``decision`` argument of ``kernelsmith::triton_kernel`` for a site on ``device`` whose
    inputs look like ``inputs`` (meta tensors are enough), served by the kernel decision
    ``record`` (None: no winner) measured in ``mode``; "" where the site keeps
    ``kernelsmith::kernel`` (the reason is logged once). Never raises: the op is an optimization.
    Answers are kept per site shape and decision: a model's layers repeat their workloads."""
    from kernelsmith import dispatch

    layout = tuple((tuple(t.shape), t.stride(), t.dtype) for t in inputs)
    carried = dispatch.encode_decisions([record], mode) if record is not None else ""
    key = (op, layout, constants, carried, str(device), static, training)
    with _logged_lock:
        if key in _decided:
            return _decided[key]
    decision = _site_decision(op, inputs, constants, record, mode, device, static=static, training=training)
    with _logged_lock:
        _decided[key] = decision
    return decision


_decided: dict[tuple[Any, ...], str] = {}


def _site_decision(
    op: str, inputs: Sequence[torch.Tensor], constants: str, record: Any, mode: str, device: torch.device, *,
    static: bool, training: bool,
) -> str:
    from kernelsmith import dispatch

    try:
        supported = unsupported_reason()
        winner = record is not None and getattr(record, "winner", None) == "kernel"
        decision = dispatch.encode_decisions([record], mode) if winner else ""
        kernels: list[Any] = []
        problem = None
        if supported is None and static and winner and not training:
            try:
                kernels = launched_kernels(op, inputs, constants, decision, mode)
            except Exception as exc:  # a build that fails here fails in the body too
                problem = f"its launcher cannot be built: {type(exc).__name__}: {exc}"
        choice = choose(supported=supported, static=static, winner=winner, training=training, kernels=kernels)
        if choice.triton_op and problem is None:
            problem = _probe(op, inputs, constants, decision, device)
        if choice.triton_op and problem is None and register() is None:
            problem = f"{OP_NAME} could not be registered (logged above)"
    except Exception as exc:
        choice, problem = Choice(False), f"{type(exc).__name__}: {exc}"
    if not choice.triton_op or problem:
        _log_once(op, problem or choice.reason)
        return ""
    return decision


def launched_kernels(
    op: str, inputs: Sequence[torch.Tensor], constants: str, decision: str, mode: str
) -> list[Any]:
    """The kernels the launcher of ``decision`` (measured in ``mode``) for ``inputs`` launches
    through :func:`~kernelsmith.ops._launch.direct_launch` (collected while it is built; nothing
    runs, so meta tensors are enough). LookupError when the decision does not serve ``inputs``."""
    kernels: list[Any] = []

    def collect(kernel: Any, grid: Any) -> Callable[..., Any]:
        kernels.append(kernel)
        return _never_launched

    with launches_through(collect):
        if _build(op, inputs, constants, decision, mode) is None:
            raise LookupError("the decision does not serve these inputs")
    return kernels


def _never_launched(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("a launcher built to list its kernels was launched")


def _probe(
    op: str, inputs: Sequence[torch.Tensor], constants: str, decision: str, device: torch.device
) -> str | None:
    """Trace the op's body once on fake inputs on ``device`` (nothing is allocated or launched),
    as AOTAutograd will: None when it records at least one Triton launch and nothing else fails,
    else why not."""
    graph = trace_body(op, inputs, constants, decision, device)
    if isinstance(graph, str):
        return graph
    if not any(node.target is _kernel_call() for node in graph.graph.nodes):
        return "tracing its launcher recorded no Triton launch"
    return None


def trace_body(
    op: str, inputs: Sequence[torch.Tensor], constants: str, decision: str, device: torch.device
) -> torch.fx.GraphModule | str:
    """The op's body traced (``make_fx``) on fake tensors like ``inputs`` on ``device``, or why it
    cannot be.

    The trace runs *inside* the fake mode that made the examples, as AOTAutograd traces (its
    fake mode entered, then ``make_fx`` in ``"real"`` mode). Tracing outside it, with fake
    arguments and no fake mode on the dispatch stack, works on torch 2.13 but not on 2.11, where
    Triton's kernel-call operator then finds no implementation for FakeTensor arguments
    ("HigherOrderOperator 'triton_kernel_wrapper_mutation' is not supported for the given input
    types") and every site would keep ``kernelsmith::kernel``.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    def body(*tensors: torch.Tensor) -> list[torch.Tensor]:
        return _body(op, list(tensors), constants, decision)

    try:
        with FakeTensorMode():
            examples = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device) for t in inputs]
            return make_fx(body, tracing_mode="real")(*examples)  # type: ignore[no-any-return]
    except Exception as exc:
        return f"its launcher cannot be traced: {type(exc).__name__}: {str(exc)[:300]}"


def _kernel_call() -> Any:
    from torch._higher_order_ops.triton_kernel_wrap import triton_kernel_wrapper_mutation

    return triton_kernel_wrapper_mutation


# ---- the op's body --------------------------------------------------------------------------------
def _traceable(kernel: Any, grid: Any) -> Callable[..., Any]:
    """``wrap_triton(kernel)[grid]``: a launch the tracers record as Triton's kernel-call operator."""
    if not is_compiled_kernel(kernel):
        raise NotTraceable(f"{type(kernel).__name__} is not a compiled Triton kernel (JITFunction)")
    return torch.library.wrap_triton(kernel)[grid]  # type: ignore[no-any-return]


def _tracing() -> bool:
    """Whether the body runs under a tracer (fake or functional tensors), not on real tensors.

    torch's own switch: ``triton_op`` turns ``wrap_triton`` off around an eager call of the body
    with plain tensors, and leaves it on for every trace (a torch without the switch: always on).
    """
    from torch._library import triton as library_triton

    enabled = getattr(library_triton, "is_wrap_triton_enabled", None)
    return True if enabled is None else bool(enabled())


# Eager calls' launchers (kernelsmith's direct launch), by call. Launchers built for a trace are
# never kept: a wrap_triton wrapper holds an index into torch's kernel side table, which
# torch._dynamo.reset() clears.
_RUNNERS: dict[tuple[Any, ...], Any] = {}
_RUNNERS_LOCK = threading.Lock()


def _build(op: str, inputs: Sequence[torch.Tensor], constants: str, decision: str, mode: str | None = None) -> Any:
    """The runner of ``decision`` for ``inputs`` (its workload's or bucket's entry, measured in
    ``mode``: by default the inputs' own), or None when the decision does not serve them (the
    reference runs)."""
    from kernelsmith import dispatch
    from kernelsmith.ops import get_op

    family = get_op(op)
    spec = family.spec_for(*inputs, **json.loads(constants))
    mode = mode or dispatch.mode_for(inputs)
    entry = dispatch.carried_entry(decision, str(mode), family, spec)
    if entry is None:
        log.info("%s(%s): the carried decision does not serve %s; the PyTorch reference runs", OP_NAME, op,
                 spec.describe())
        return None
    return dispatch.build_runner(family, spec, entry)


def _runner(op: str, inputs: Sequence[torch.Tensor], constants: str, decision: str) -> Any:
    """The runner for this call: built for the trace (every launch through ``wrap_triton``) under
    a tracer, else the cached eager one; None where the reference must run."""
    if _tracing():
        with launches_through(_traceable):
            return _built(op, inputs, constants, decision)
    key = (op, constants, decision, *((tuple(t.shape), t.stride(), t.dtype, t.device) for t in inputs))
    with _RUNNERS_LOCK:
        if key in _RUNNERS:
            return _RUNNERS[key]
    runner = _built(op, inputs, constants, decision)
    with _RUNNERS_LOCK:
        _RUNNERS[key] = runner
    return runner


def _built(op: str, inputs: Sequence[torch.Tensor], constants: str, decision: str) -> Any:
    try:
        return _build(op, inputs, constants, decision)
    except (LookupError, NotTraceable) as exc:  # a variant changed since the graph was made; the interpreter
        log.info("%s(%s): the carried decision is not used (%s); the PyTorch reference runs", OP_NAME, op, exc)
        return None


def _body(op: str, inputs: list[torch.Tensor], constants: str, decision: str) -> list[torch.Tensor]:
    """Launch the carried kernel (through ``wrap_triton`` under a tracer), or run the reference."""
    runner = _runner(op, inputs, constants, decision)
    if runner is not None:
        return list(runner(inputs))
    from kernelsmith.ops import get_op

    family = get_op(op)
    return list(family.reference(family.spec_for(*inputs, **json.loads(constants)), inputs))


_REGISTERED: list[Any] = []  # the op's overload once registered (None: this torch cannot)
_REGISTER_LOCK = threading.Lock()


def register() -> Any:
    """Register the op (once per process) and return its overload, or None where torch cannot.

    Not done on import: ``torch.library.triton_op`` imports Inductor (seconds). The backend calls
    it when a graph is to hold the op; a process loading a program that holds it with
    ``torch.export.load`` calls it first."""
    with _REGISTER_LOCK:
        if not _REGISTERED:
            _REGISTERED.append(_register())
        return _REGISTERED[0]


def _register() -> Any:
    if unsupported_reason() is not None:
        return None
    try:
        return torch.ops.kernelsmith.triton_kernel.default  # registered already (a reloaded module)
    except AttributeError:
        pass

    def triton_kernel(op: str, inputs: list[torch.Tensor], constants: str, decision: str) -> list[torch.Tensor]:
        """The carried kernel on ``inputs`` (module docstring)."""
        return _body(op, inputs, constants, decision)

    try:
        torch.library.triton_op(OP_NAME, triton_kernel, mutates_args=())
    except Exception:  # a torch whose triton_op differs: the backend keeps kernelsmith::kernel
        log.warning("kernelsmith could not register %s; compiled graphs call kernelsmith::kernel", OP_NAME,
                    exc_info=True)
        return None
    return torch.ops.kernelsmith.triton_kernel.default


def __getattr__(name: str) -> Any:
    """``OP``: ``torch.ops.kernelsmith.triton_kernel.default``, registered on first use (None where
    this torch has no ``triton_op``)."""
    if name == "OP":
        return register()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
