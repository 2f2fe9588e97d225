"""Launching a compiled Triton kernel without Triton re-binding its arguments on every call.

``kernel[grid](*args, **meta)`` runs a good deal of Python on every call before the launch
itself: it binds the arguments to the kernel's signature, works out the specialization of each
one (a tensor's dtype and whether its address is 16-byte aligned; an integer's width and whether
it is 1 or a multiple of 16), hashes that into a key and looks the compiled kernel up. For the
small, launch-bound calls a decorated function serves, that is most of the host time.

:func:`direct_launch` returns a callable taking the same arguments. Its first call goes through
Triton (which compiles, or finds the compiled kernel) and records what the compiled kernel's
specialization depended on: every tensor argument's dtype and alignment, every other argument's
value, the keyword arguments and the current device. A later call that agrees on all of those
launches the compiled kernel directly, through the same ``CompiledKernel.run`` Triton's own
launch ends in; a call that differs in any of them, or any argument of another kind (a host
tensor descriptor, say), goes through Triton as before, so the result never depends on which path
ran. Triton's launch hooks (used by its profiler) are honoured by taking Triton's path whenever
one is set.

Set ``KERNELSMITH_DIRECT_LAUNCH=0`` to always go through Triton (for example to compare, or with
a Triton whose internals moved). Under the Triton interpreter every call goes through Triton.

Launchers built for tracing. ``kernelsmith::triton_kernel`` (:mod:`kernelsmith.frontends.
triton_ops`) builds a family's launcher inside :func:`launches_through`, which makes
:func:`direct_launch` return what it is given instead (``wrap_triton(kernel)[grid]``, which
Inductor traces) for launchers built in that block, on that thread. The switch is read when a
launcher is built, never when it launches: the eager hot path is unchanged.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from kernelsmith import settings

log = logging.getLogger(__name__)

# Argument kinds whose specialization is fully described by their value (or, for a tensor, by
# its dtype and alignment). Anything else makes a launcher go through Triton on every call.
_SCALARS = (int, float, bool, str, type(None))


def direct_launch_enabled() -> bool:
    return bool(settings.get("KERNELSMITH_DIRECT_LAUNCH"))


def direct_launch(kernel: Any, grid: Sequence[int]) -> Callable[..., Any]:
    """``kernel[grid]``, launching directly once the compiled kernel is known (module docstring).

    Falls back to plain ``kernel[grid]`` for a grid given as a function, for the interpreter
    (which has no compiled kernel) and when ``KERNELSMITH_DIRECT_LAUNCH=0``; inside
    :func:`launches_through`, whatever that was given makes of ``kernel`` and ``grid``.
    """
    make = getattr(_BUILDING, "make", None)
    if make is not None:
        return make(kernel, grid)
    from triton.runtime.jit import JITFunction

    if callable(grid) or not isinstance(kernel, JITFunction) or not direct_launch_enabled():
        return kernel[grid]  # type: ignore[no-any-return]
    return DirectLaunch(kernel, grid)


_BUILDING = threading.local()  # .make: the launch maker of the innermost launches_through, this thread


@contextlib.contextmanager
def launches_through(make: Callable[[Any, Any], Callable[..., Any]]) -> Iterator[None]:
    """Launchers built in this block (on this thread) launch through ``make(kernel, grid)``
    instead of :func:`direct_launch`'s own (module docstring)."""
    previous = getattr(_BUILDING, "make", None)
    _BUILDING.make = make
    try:
        yield
    finally:
        _BUILDING.make = previous


class DirectLaunch:
    """One kernel at one grid; see the module docstring. Public for tests, which drive it with
    a stand-in for a Triton kernel."""

    def __init__(self, kernel: Any, grid: Sequence[int]) -> None:
        grid = tuple(int(g) for g in grid)
        self.kernel = kernel
        self.grid = (*grid, 1, 1)[:3]
        self.through_triton = kernel[grid]
        self.launches = {"direct": 0, "triton": 0}  # counts, for tests and curiosity
        self._run: Any = None  # CompiledKernel.run of the recorded call, once there is one
        self._given_up = False  # an argument kind this launcher cannot check: Triton every time

    def __call__(self, *args: Any, **meta: Any) -> None:
        run = self._run
        if run is not None:
            device = _current_device()
            if device == self._device and self._matches(args, meta):
                self.launches["direct"] += 1
                run(*self.grid, _current_stream(device), self._function, self._packed, None, None, None,
                    *args, *self._tail)
                return
        self.launches["triton"] += 1
        compiled = self.through_triton(*args, **meta)
        if run is None and not self._given_up:
            self._record(compiled, args, meta)

    # ---- what a direct call must agree on ----------------------------------------------------------
    def _record(self, compiled: Any, args: tuple[Any, ...], meta: dict[str, Any]) -> None:
        if compiled is None or not hasattr(compiled, "packed_metadata"):
            self._given_up = True  # the interpreter, or a Triton that launches differently
            return
        tensors, values = [], []
        for index, value in enumerate(args):
            if isinstance(value, torch.Tensor):
                tensors.append((index, value.dtype, value.data_ptr() % 16 == 0))
            elif isinstance(value, _SCALARS):
                values.append((index, type(value), value))
            else:
                self._given_up = True
                return
        for value in meta.values():
            if not isinstance(value, _SCALARS):
                self._given_up = True
                return
        # Triton launches with every parameter of the kernel in order, constexprs included and
        # defaults applied; the call's positional arguments are a prefix of them.
        names = self.kernel.signature.parameters
        bound = self.kernel.signature.bind(*args, **{k: v for k, v in meta.items() if k in names})
        bound.apply_defaults()
        every = list(bound.arguments.values())
        if len(every) != len(names) or any(a is not b for a, b in zip(args, every, strict=False)):
            self._given_up = True
            return
        self._count = len(args)
        self._tensors = tuple(tensors)
        self._values = tuple(values)
        self._meta = dict(meta)
        self._tail = tuple(every[len(args) :])
        self._device = _current_device()
        self._function = compiled.function
        self._packed = compiled.packed_metadata
        self._run = compiled.run

    def _matches(self, args: tuple[Any, ...], meta: dict[str, Any]) -> bool:
        if len(args) != self._count or meta != self._meta or _hooks_set():
            return False
        for index, dtype, aligned in self._tensors:
            tensor = args[index]
            if not isinstance(tensor, torch.Tensor):
                return False
            if tensor.dtype != dtype or (tensor.data_ptr() % 16 == 0) != aligned:
                return False
        for index, kind, value in self._values:
            given = args[index]
            if type(given) is not kind or given != value:
                return False
        return True


# ---- tensor descriptors (TMA) --------------------------------------------------------------------
def tensor_descriptor_class() -> Any:
    """Triton's host-side ``TensorDescriptor`` class, or None when this Triton has none."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:
        return None
    return TensorDescriptor


def tma_available(interpreted: bool) -> bool:
    """Whether kernels may take tensor descriptors here: Triton has them, and the device is a
    Hopper or newer GPU (compute capability 9.0+), or kernels run in the interpreter."""
    if tensor_descriptor_class() is None:
        return False
    if interpreted:
        return True
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


# ---- the few Triton and CUDA facts a direct launch needs, looked up once ----------------------------
def _hooks_set() -> bool:
    """Whether a Triton launch hook is installed. Triton 3.6+ keeps its hooks in ``HookChain``
    objects that are never None (an empty chain calls nothing); an older Triton kept a plain
    callable or None."""
    runtime = _runtime_knobs()
    if runtime is None:
        return False
    for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


def _runtime_knobs() -> Any:
    global _RUNTIME
    if _RUNTIME is _UNSET:
        try:
            from triton import knobs

            _RUNTIME = knobs.runtime
        except ImportError:
            _RUNTIME = None
    return _RUNTIME


_UNSET = object()
_RUNTIME: Any = _UNSET


# torch's raw getters (what Triton itself uses), looked up once: these run on every direct launch.
_GET_DEVICE = getattr(torch._C, "_cuda_getDevice", None)
_GET_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _current_device() -> int:
    return int(_GET_DEVICE()) if _GET_DEVICE is not None else torch.cuda.current_device()


def _current_stream(device: int) -> int:
    if _GET_RAW_STREAM is not None:
        return int(_GET_RAW_STREAM(device))
    return int(torch.cuda.current_stream(device).cuda_stream)


__all__ = ["DirectLaunch", "direct_launch", "direct_launch_enabled", "launches_through", "tensor_descriptor_class",
           "tma_available"]
