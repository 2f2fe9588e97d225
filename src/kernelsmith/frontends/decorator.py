"""``@kernelsmith.optimize``: make a user's own function faster without changing it.

>>> import torch, kernelsmith
>>> @kernelsmith.optimize(budget=50)
... def rmsnorm(x, weight, eps=1e-6):
...     xf = x.float()
...     return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight
>>> y = rmsnorm(torch.randn(8, 64), torch.ones(64))  # CPU tensors: the original function runs
>>> rmsnorm.kernelsmith.stats["fallback_calls"]
1

The first call with a new key (shapes, dtypes, strides, device, non-tensor arguments) takes the
slow path, once:

1. fall back to the original function where kernels cannot help: inputs that need gradients
   (no backward kernels for these ops yet), CPU tensors (unless interpreter mode was asked for
   with ``KERNELSMITH_INTERPRET=1`` or ``TRITON_INTERPRET=1``), no recognized op, a workload the
   op's kernels do not support (dtype, layout);
2. recognize the op from the function's captured graph (:mod:`kernelsmith.frontends.recognize`)
   and check, on this call's real inputs, that the function really computes it: its output must
   be as close to the op's float64 reference as PyTorch's own formulation is. A recognizer
   mistake is caught here and the original function keeps running;
3. look the workload's bucket up in the database; by ``mode``: ``"tune"`` (default) tunes a
   missing workload now, ``"db"`` never tunes (a stored winner or the original function),
   ``"background"`` runs the original function while a tuning thread drives worker processes,
   and picks up the winner once it is stored;
4. build the winner's launcher, run it once on this call's inputs and check the result like a
   candidate's; any failure is logged once and the original function is used.

Once served, a kernel is checked where it serves (DESIGN.md rule 12, :mod:`kernelsmith.servecheck`):
its first calls (3) and a secret sample of later ones (1 in 1000) are compared with the original
function on the same inputs; a wrong answer returns the function's result, disables the kernel
for the key and is recorded in the database (``check=`` / ``KERNELSMITH_CHECK=0`` turn this off).

Later calls with the same key find a ready entry in an in-process table: a tuple of shapes and
strides, a dict lookup and the kernel launch. Under ``torch.compile`` a tuned entry is emitted
as the ``kernelsmith::kernel`` custom op; everything else traces the original function.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from kernelsmith import dispatch, servecheck
from kernelsmith.db import DatabaseError, open_database, warn_unusable_database
from kernelsmith.evaluate.errors import check_close
from kernelsmith.frontends.recognize import Match, MatchDoesNotApply, recognize
from kernelsmith.ops import OpFamily, UnsupportedWorkload, get_op
from kernelsmith.spec import OpSpec

log = logging.getLogger(__name__)

MODES = ("tune", "db", "background")
F = TypeVar("F", bound=Callable[..., Any])
Entry = Callable[[tuple[Any, ...], dict[str, Any]], Any]


def _call_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two calls the same workload: tensor metadata and the other arguments' values.

    Raises TypeError for unhashable non-tensor arguments (such calls are never cached). This
    runs on every call, so it is a plain loop (no helper calls, no generators).
    """
    key: list[Any] = [torch.is_grad_enabled()]
    for value in args:
        if isinstance(value, torch.Tensor):
            key.append((value.shape, value.dtype, value.stride(), value.device, value.requires_grad))
        else:
            hash(value)
            key.append((type(value), value))  # 1, 1.0 and True are equal but may compute differently
    if kwargs:
        for name in sorted(kwargs):
            value = kwargs[name]
            if isinstance(value, torch.Tensor):
                key.append((name, value.shape, value.dtype, value.stride(), value.device, value.requires_grad))
            else:
                hash(value)
                key.append((name, type(value), value))
    return tuple(key)


@dataclass
class Optimized:
    """The state behind one decorated function; reachable as ``fn.kernelsmith``."""

    fn: Callable[..., Any]
    budget: int = 50
    strategy: str = "auto"
    mode: str | None = None
    db: Any = None
    check: bool | float | None = None  # serve checks: None reads KERNELSMITH_CHECK(_RATE); see servecheck
    devices: Sequence[int] | str | None = None  # the GPUs tuning runs on (None: every visible one)
    table: dict[tuple[Any, ...], Entry] = field(default_factory=dict)
    stats: dict[str, int] = field(
        default_factory=lambda: {
            "calls": 0, "kernel_calls": 0, "fallback_calls": 0, "checks": 0, "tunes": 0, "evaluations": 0
        }
    )
    reasons: dict[tuple[Any, ...], str] = field(default_factory=dict)
    background: threading.Thread | None = None  # the tuning thread of background mode, if any
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _logged: set[str] = field(default_factory=set)

    # ---- the call -------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.stats["calls"] += 1
        try:
            key = _call_key(args, kwargs)
        except TypeError:
            return self._fallback(args, kwargs)
        entry = self.table.get(key)
        if entry is None:
            return self._first_call(key, args, kwargs)
        return entry(args, kwargs)

    def _fallback(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.stats["fallback_calls"] += 1
        return self.fn(*args, **kwargs)

    def _use_original(self, key: tuple[Any, ...], reason: str) -> None:
        self._log_once(reason)
        self.reasons[key] = reason
        self.table[key] = self._fallback

    def _log_once(self, message: str) -> None:
        if message not in self._logged:
            self._logged.add(message)
            log.info("%s: %s", getattr(self.fn, "__qualname__", self.fn), message)

    @property
    def effective_mode(self) -> str:
        mode = self.mode or os.environ.get("KERNELSMITH_MODE", "tune")
        if mode not in MODES:
            raise ValueError(f"kernelsmith mode {mode!r} is not one of {MODES}")
        return mode

    # ---- the slow path, once per key ------------------------------------------------------------
    def _first_call(self, key: tuple[Any, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
        if torch.compiler.is_compiling():
            return self.fn(*args, **kwargs)  # never tune while being traced
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
        device_mode = dispatch.mode_for(tensors) if tensors else None
        if device_mode is None:
            self._use_original(key, "not CUDA tensors (set KERNELSMITH_INTERPRET=1 to run kernels on the CPU)")
            return self._fallback(args, kwargs)
        self.stats["fallback_calls"] += 1  # this call's result is the original function's
        recognition = recognize(self.fn, args, kwargs)
        if recognition.match is None:
            self._use_original(key, f"no op recognized ({recognition.reason})")
            return recognition.output
        match = recognition.match
        try:
            family = get_op(match.op)
            inputs = match.bind(args, kwargs)
            spec = family.spec_for(*inputs, **match.constants)
        except (UnsupportedWorkload, ValueError) as exc:  # ValueError: a pattern for an unregistered family
            self._use_original(key, f"{match.op} recognized but not supported: {exc}")
            return recognition.output
        problem = _differs_from_op(family, spec, inputs, recognition.output)
        if problem:
            self._use_original(key, f"looks like {match.op} but computes something else: {problem}")
            return recognition.output
        if needs_grad and family.backward is None:
            self._use_original(key, f"inputs require grad and {match.op} has no backward kernel")
            return recognition.output
        detached = tuple(t.detach() for t in inputs)
        forward = self._runner(key, family, spec, device_mode, detached)
        if forward is None:
            return recognition.output
        if not needs_grad:
            self.table[key] = self._kernel_entry(key, match, spec, device_mode, forward)
            return recognition.output
        backward_family = get_op(str(family.backward))
        output = recognition.output.detach()
        dy = torch.randn_like(output)  # the gradient's shape, dtype and device
        backward_inputs = family.backward_inputs((dy,), detached, (output,))
        backward_spec = backward_family.spec_for(*backward_inputs, **match.constants)
        backward = self._runner(key, backward_family, backward_spec, device_mode, backward_inputs)
        if backward is not None:
            self.table[key] = self._kernel_entry(key, match, spec, device_mode, forward, backward)
        return recognition.output

    def _runner(
        self, key: tuple[Any, ...], family: OpFamily, spec: OpSpec, device_mode: str, inputs: tuple[torch.Tensor, ...]
    ) -> dispatch.KernelRunner | None:
        """The checked runner of the stored (or, by mode, freshly tuned) winner for ``spec``.

        None when the original function must run for this key; the reason is recorded and the
        key's table entry set accordingly.
        """
        bucket = family.bucket(spec)
        try:
            with open_database(self.db) as db:
                decision = dispatch.stored_decision(db, device_mode, bucket)
            if decision is None:
                mode = self.effective_mode
                if mode == "db":
                    self._use_original(key, f"{family.name} {bucket.describe()} is not tuned (database-only mode)")
                    return None
                if mode == "background":
                    self._tune_in_background(key, bucket, device_mode)
                    self.table[key] = self._fallback
                    return None
                decision = self._tune(bucket, device_mode)
        except DatabaseError as exc:  # a broken cache is not a broken program: one warning, the user's code
            warn_unusable_database(exc)
            self._use_original(key, f"the database cannot be used: {exc}")
            return None
        if decision is None or decision.winner != "kernel":
            self._use_original(key, f"the baseline wins for {bucket.describe()}")
            return None
        try:
            runner = dispatch.build_runner(family, spec, decision, db=self.db)
            trial = runner(inputs)
            problem = None
            references = family.reference_fp64(spec, inputs)
            lowps = family.reference(spec, inputs)
            for out, ref64, lowp in zip(trial, references, lowps, strict=True):
                problem = problem or check_close(out, ref64, lowp, family.tolerance)
        except Exception as exc:  # a stored kernel that fails here must never break the call
            problem = f"{type(exc).__name__}: {exc}"
        if problem:
            self._use_original(key, f"stored kernel for {bucket.describe()} not used: {problem}")
            return None
        return runner

    def _kernel_entry(
        self,
        key: tuple[Any, ...],
        match: Match,
        spec: OpSpec,
        device_mode: str,
        runner: dispatch.KernelRunner,
        backward: dispatch.KernelRunner | None = None,
    ) -> Entry:
        """The table entry serving ``runner`` (and ``backward``) for calls with this key, with
        serve checks (rule 12, :mod:`kernelsmith.servecheck`): the forward compared with the
        user's function, the backward with its family's reference."""
        bind = match.bind
        op = match.op
        family = get_op(op)
        # Inputs that are all plain positional arguments are picked by index: the call key pins
        # the arguments' count and types, so nothing else about them needs checking.
        positions = [ref.index for ref in match.inputs if ref.kind == "arg" and ref.as_given]
        if len(positions) == len(match.inputs):

            def bind(args: tuple[Any, ...], kwargs: dict[str, Any], check: bool = False) -> tuple[Any, ...]:
                return tuple([args[i] for i in positions])  # type: ignore[index]

        constants = dispatch.constants_json(dict(match.constants))
        stats = self.stats
        # The call key already pins every argument (tensor metadata, other values and types);
        # what it cannot see is a tensor the function reaches by reference (a module's weight),
        # which may have been replaced: only then is the full check worth its microseconds.
        check = any(ref.kind == "external" for ref in match.inputs)
        # Nor can it see a plain value the function reads from outside its arguments (a global
        # eps, ``self.eps``, a closure variable, a default): those are re-read on every call (the
        # full check above includes them), and a changed one makes the function be recognized
        # again, with its new value.
        signature = match.signature
        reads_changed = signature.reads_mismatch if signature is not None and signature.reads and not check else None
        serve, backward_served = self._serve_checks(key, family, device_mode, constants, backward)

        def entry(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if reads_changed is not None:
                changed = reads_changed(args, kwargs)
                if changed is not None:
                    log.debug("%s: recognizing again: %s", getattr(self.fn, "__qualname__", self.fn), changed)
                    self.table.pop(key, None)
                    return self._first_call(key, args, kwargs)
            try:
                inputs = bind(args, kwargs, check=check)
            except MatchDoesNotApply:
                self.table.pop(key, None)  # recognize again, as on a first call
                return self._first_call(key, args, kwargs)
            if backward_served is not None:
                # Under torch.compile the countdown is never touched: Dynamo would guard on it.
                if serve is not None and not torch.compiler.is_compiling():
                    serve.countdown -= 1
                    if serve.countdown <= 0 and serve.due():
                        return self._checked_call(
                            serve, family, spec, runner, inputs, args, kwargs,
                            lambda: dispatch.KernelFunction.apply(family, runner, backward_served, *inputs),
                        )
                stats["kernel_calls"] += 1
                return dispatch.KernelFunction.apply(family, runner, backward_served, *inputs)
            if torch.compiler.is_compiling():  # the op checks itself when the compiled code runs
                return torch.ops.kernelsmith.kernel(op, list(inputs), constants)[0]
            if serve is not None:
                serve.countdown -= 1
                if serve.countdown <= 0 and serve.due():
                    return self._checked_call(serve, family, spec, runner, inputs, args, kwargs,
                                              lambda: runner(inputs)[0])
            stats["kernel_calls"] += 1
            return runner(inputs)[0]

        return entry

    def _serve_checks(
        self,
        key: tuple[Any, ...],
        family: OpFamily,
        device_mode: str,
        constants: str,
        backward: dispatch.KernelRunner | None,
    ) -> tuple[servecheck.ServeCheck | None, dispatch.KernelRunner | dispatch.CheckedRunner | None]:
        """The forward's serve check (None when checking is off) and the backward as served: a
        failure of either makes this key run the user's function from then on."""
        policy = servecheck.CheckPolicy.resolve(self.check)
        if not policy.enabled:
            return None, backward
        name = f"kernelsmith.optimize({getattr(self.fn, '__qualname__', self.fn)})"

        def fall_back(problem: str = "") -> None:
            self._use_original(key, f"the kept kernel failed a serve check: {problem or 'its backward'}")

        serve = servecheck.ServeCheck(policy, name, device_mode, self.db, on_failure=fall_back)
        if backward is None:
            return serve, None
        return serve, dispatch.CheckedRunner(
            backward, str(family.backward), constants, policy, device_mode, self.db, f"{name} backward", fall_back
        )

    def _checked_call(
        self,
        serve: servecheck.ServeCheck,
        family: OpFamily,
        spec: OpSpec,
        runner: dispatch.KernelRunner,
        inputs: tuple[torch.Tensor, ...],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        kernel: Callable[[], Any],
    ) -> Any:
        """One served call compared with the user's own function on the same inputs; returns the
        kernel's result when it passes, else the function's (and the key falls back)."""
        served: list[Any] = []

        def run_kernel() -> list[torch.Tensor]:
            served.append(kernel())
            out = served[0]
            return [out] if isinstance(out, torch.Tensor) else list(out)

        def reference64(clones: Sequence[torch.Tensor]) -> Sequence[torch.Tensor]:
            with torch.no_grad():
                return family.reference_fp64(spec, clones)

        self.stats["checks"] += 1
        results, kernels = serve.run(
            family, spec, runner, inputs, lambda: [self.fn(*args, **kwargs)], reference64, run_kernel
        )
        if kernels:
            self.stats["kernel_calls"] += 1
            return served[0]
        self.stats["fallback_calls"] += 1
        return results[0]

    def _tune(self, bucket: OpSpec, device_mode: str) -> Any:
        from kernelsmith.tuner import tune_spec

        self.stats["tunes"] += 1
        result = tune_spec(
            bucket, budget=self.budget, strategy=self.strategy, db=self.db, mode=device_mode, devices=self.devices
        )
        self.stats["evaluations"] += result.evaluations
        with open_database(self.db) as db:
            return dispatch.stored_decision(db, device_mode, bucket)

    def _tune_in_background(self, key: tuple[Any, ...], bucket: OpSpec, device_mode: str) -> None:
        """Tune in a thread (candidates still run only in worker processes); when the decision
        is stored, drop the key's fallback entry so the next call resolves it again."""

        def work() -> None:
            try:
                self._tune(bucket, device_mode)
            except Exception as exc:
                self._log_once(f"background tuning of {bucket.describe()} failed: {exc}")
                return
            with self._lock:
                self.table.pop(key, None)

        thread = threading.Thread(target=work, name=f"kernelsmith-tune-{bucket.op}", daemon=True)
        self.background = thread
        thread.start()


def _differs_from_op(family: OpFamily, spec: OpSpec, inputs: tuple[torch.Tensor, ...], output: Any) -> str | None:
    """None when ``output`` computes the op on ``inputs`` as well as PyTorch's own formulation."""
    if not isinstance(output, torch.Tensor):
        return f"the function returned {type(output).__name__}, not a tensor"
    expected = family.output_specs(spec)[0]
    if tuple(output.shape) != expected.shape or output.dtype != expected.torch_dtype:
        return f"output {tuple(output.shape)} {output.dtype} differs from {expected}"
    with torch.no_grad():
        ref64 = family.reference_fp64(spec, inputs)[0]
        lowp = family.reference(spec, inputs)[0]
        return check_close(output.detach(), ref64, lowp, family.tolerance)


def optimize(
    fn: F | None = None,
    *,
    budget: int = 50,
    strategy: str = "auto",
    mode: str | None = None,
    db: Any = None,
    check: bool | float | None = None,
    devices: Sequence[int] | str | None = None,
) -> Any:
    """Decorate a function so that calls run a tuned kernel when one beats it.

    Use as ``@optimize`` or ``@optimize(budget=..., strategy=..., mode=..., db=..., check=...)``.
    ``mode`` is "tune" (default; also ``KERNELSMITH_MODE``), "db" or "background"; ``db`` a
    database path or URL (default: ``KERNELSMITH_DB`` or the per-user cache). ``check`` governs
    the serve checks (the first calls of a kept kernel, then a sampled fraction, compared with
    this function): None follows ``KERNELSMITH_CHECK`` and ``KERNELSMITH_CHECK_RATE`` (default:
    on, 1 call in 1000 after the first 3), False turns them off, True on, a number in [0, 1] is
    the sampled fraction. ``devices`` are the GPUs its tuning runs on (such as ``[0, 1]``;
    default: every visible one).
    """
    if mode is not None and mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    servecheck.CheckPolicy.resolve(check)  # a bad rate is an error here, not on a later call

    def decorate(function: F) -> F:
        state = Optimized(function, budget=budget, strategy=strategy, mode=mode, db=db, check=check, devices=devices)

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return state(*args, **kwargs)

        wrapper.kernelsmith = state  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate(fn) if fn is not None else decorate
