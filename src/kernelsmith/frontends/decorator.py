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

Layout: call keys, the pinned-config and output checks, and output packing are in
:mod:`~kernelsmith.frontends._decorator_helpers`; this module holds :class:`Optimized` and
:func:`optimize`.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import torch

from kernelsmith import dispatch, servecheck, settings
from kernelsmith.db import DatabaseError, DecisionRecord, open_database, warn_unusable_database
from kernelsmith.evaluate import errors
from kernelsmith.frontends import compiled
from kernelsmith.frontends._decorator_helpers import (
    _call_key,
    _differs_from_op,
    _pack,
    _served,
    _terminal_progress,
    _unpack,
    _validate_pinned,
)
from kernelsmith.frontends.recognize import Match, MatchDoesNotApply, recognize
from kernelsmith.ops import OpFamily, UnsupportedWorkload, get_op
from kernelsmith.spec import OpSpec

log = logging.getLogger(__name__)

MODES = ("tune", "db", "background")
F = TypeVar("F", bound=Callable[..., Any])
Entry = Callable[[tuple[Any, ...], dict[str, Any]], Any]


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
    config: dict[str, Any] | None = None  # a config pinned in code ("variant" plus the variant's parameters)
    force_retune: bool | None = None  # None: KERNELSMITH_FORCE_RETUNE (kernelsmith.settings)
    require_tuned: bool | None = None  # None: KERNELSMITH_REQUIRE_TUNED
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
    # A pinned config's decision per workload once validated, or why it was refused.
    _pinned: dict[str, DecisionRecord | str] = field(default_factory=dict)
    serial: str = ""  # how a traced call finds this state (kernelsmith.frontends.compiled)

    def __post_init__(self) -> None:
        self.serial = compiled.register(self)

    # ---- the call -------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():  # Dynamo or export: no call key, no table, no tuning
            return compiled.traced_call(self, args, kwargs)
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
        """``mode``, else ``KERNELSMITH_MODE``; "db" whenever tuning is off (``require_tuned``,
        ``KERNELSMITH_DATABASE_ONLY``)."""
        if self.requires_tuned or settings.get("KERNELSMITH_DATABASE_ONLY"):
            return "db"
        mode = self.mode or settings.get("KERNELSMITH_MODE")
        if mode not in MODES:
            raise ValueError(f"kernelsmith mode {mode!r} is not one of {MODES}")
        return str(mode)

    @property
    def requires_tuned(self) -> bool:
        return bool(settings.get("KERNELSMITH_REQUIRE_TUNED") if self.require_tuned is None else self.require_tuned)

    @property
    def forces_retune(self) -> bool:
        return bool(settings.get("KERNELSMITH_FORCE_RETUNE") if self.force_retune is None else self.force_retune)

    # ---- the slow path, once per key ------------------------------------------------------------
    def _first_call(self, key: tuple[Any, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
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
        problem = _differs_from_op(family, spec, inputs, recognition.output, match.returns)
        if problem:
            self._use_original(key, f"looks like {match.op} but computes something else: {problem}")
            return recognition.output
        if needs_grad and match.returns is not None:
            self._use_original(key, f"inputs require grad; {match.op} returning a tuple is served without gradients")
            return recognition.output
        if needs_grad and family.backward is None:
            self._use_original(key, f"inputs require grad and {match.op} has no backward kernel")
            return recognition.output
        detached = tuple(t.detach() for t in inputs)
        forward = self._runner(key, family, spec, device_mode, detached, pin=True)
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
        self,
        key: tuple[Any, ...],
        family: OpFamily,
        spec: OpSpec,
        device_mode: str,
        inputs: tuple[torch.Tensor, ...],
        pin: bool = False,
    ) -> dispatch.KernelRunner | None:
        """The checked runner of the pinned (``pin`` and a ``config``), stored or (by mode)
        freshly tuned winner for ``spec``.

        None when the original function must run for this key; the reason is recorded and the
        key's table entry set accordingly.
        """
        bucket = family.bucket(spec)
        if pin and self.config is not None:
            decision = self.pinned_decision(family, spec, device_mode)
            if decision is None:
                self._use_original(key, str(self._pinned[bucket.workload_hash]))
                return None
        else:
            try:
                decision = self._stored_or_tuned(key, family, spec, device_mode)
            except DatabaseError as exc:  # a broken cache is not a broken program: one warning, the user's code
                warn_unusable_database(exc)
                self._use_original(key, f"the database cannot be used: {exc}")
                return None
            if decision is None and key in self.table:  # not tuned (database-only or background mode)
                return None
        if decision is None or decision.winner != "kernel":
            self._use_original(key, f"the baseline wins for {bucket.describe()}")
            return None
        try:
            runner = dispatch.build_runner(family, spec, decision, db=self.db)
            # (judged as validation judges: references and floors of the inputs before it runs)
            before = errors.pristine_inputs(family, spec, inputs)
            references = errors.references(family, spec, before)
            problem = references.problem(runner(inputs), family.tolerance)
            problem = errors.written_problem(family, spec, inputs, before) or problem
        except Exception as exc:  # a stored kernel that fails here must never break the call
            problem = f"{type(exc).__name__}: {exc}"
        if problem:
            self._use_original(key, f"stored kernel for {bucket.describe()} not used: {problem}")
            return None
        return runner

    def _stored_or_tuned(
        self, key: tuple[Any, ...], family: OpFamily, spec: OpSpec, device_mode: str
    ) -> DecisionRecord | None:
        """The stored decision for ``spec`` (its exact workload, as ``kernelsmith.tune`` stores
        it, else its bucket), or by mode: tuned now, or None with the key's entry set."""
        bucket = family.bucket(spec)
        mode = self.effective_mode
        with open_database(self.db) as db:
            forced = self.forces_retune and mode != "db"
            decision = None if forced else dispatch.lookup_decision(db, device_mode, family, spec)
        if decision is not None:
            return decision
        if mode == "db":  # never tune; a near fingerprint's record is re-validated (kernelsmith.tuner)
            from kernelsmith.tuner import tune_spec

            tune_spec(bucket, db=self.db, mode=device_mode, devices=self.devices, database_only=True,
                      require_tuned=self.requires_tuned)  # NotTunedError reaches the caller
            with open_database(self.db) as db:
                decision = dispatch.stored_decision(db, device_mode, bucket)
            if decision is None:
                self._use_original(key, f"{family.name} {bucket.describe()} is not tuned (database-only mode)")
            return decision
        if mode == "background":
            self._tune_in_background(key, bucket, device_mode)
            self.table[key] = self._fallback
            return None
        return self._tune(bucket, device_mode)

    # ---- a config pinned in code ----------------------------------------------------------------
    def pinned_decision(self, family: OpFamily, spec: OpSpec, device_mode: str) -> DecisionRecord | None:
        """The pinned config as a decision for ``spec``'s bucket, once it passed the harness's
        validation there (every tail shape and value distribution a tuned candidate passes);
        None, with the reason in ``_pinned`` and one warning, when it does not."""
        bucket = family.bucket(spec)
        known = self._pinned.get(bucket.workload_hash)
        if known is None:
            known = _validate_pinned(family, bucket, dict(self.config or {}), device_mode)
            self._pinned[bucket.workload_hash] = known
            if isinstance(known, str):
                log.warning("%s: %s", getattr(self.fn, "__qualname__", self.fn), known)
        return known if isinstance(known, DecisionRecord) else None

    def carried_decisions(
        self, family: OpFamily, spec: OpSpec, device_mode: str, grad_inputs: tuple[torch.Tensor, ...] | None
    ) -> list[DecisionRecord]:
        """The decisions a compiled or exported graph of this function carries for calls like
        ``spec`` at any shape (:mod:`kernelsmith.frontends.compiled`): the pinned config (as a
        decision for every shape), or every stored winner of the op with ``spec``'s constants and
        dtypes; with ``grad_inputs``, its backward family's stored winners too."""
        records: list[DecisionRecord] = []
        with open_database(self.db) as db:
            if self.config is not None:
                pinned = self.pinned_decision(family, spec, device_mode)
                if pinned is None:
                    return []
                records.append(replace(pinned, workload=dispatch.pinned_workload(family.name)))
            else:
                records.extend(dispatch.carried_winners(db, family, spec, device_mode))
            if grad_inputs is not None and family.backward is not None:
                records.extend(
                    dispatch.carried_winners(db, get_op(family.backward), spec, device_mode, compare_dtypes=False)
                )
        return records

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
        returns = match.returns  # None: the function returns the op's first output itself

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
                if serve is not None:
                    serve.countdown -= 1
                    if serve.countdown <= 0 and serve.due():
                        return self._checked_call(
                            serve, family, spec, runner, inputs, args, kwargs,
                            lambda: dispatch.KernelFunction.apply(family, runner, backward_served, *inputs),
                        )
                stats["kernel_calls"] += 1
                return dispatch.KernelFunction.apply(family, runner, backward_served, *inputs)
            if serve is not None:
                serve.countdown -= 1
                if serve.countdown <= 0 and serve.due():
                    return self._checked_call(serve, family, spec, runner, inputs, args, kwargs,
                                              lambda: _served(runner(inputs), returns), returns)
            stats["kernel_calls"] += 1
            outputs = runner(inputs)
            return outputs[0] if returns is None else _pack(outputs, returns)

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
        returns: tuple[int | None, ...] | None = None,
    ) -> Any:
        """One served call compared with the user's own function on the same inputs; returns the
        kernel's result when it passes, else the function's (and the key falls back). ``returns``
        is the match's: how the function's tuple holds the op's outputs (None: it returns one)."""
        served: list[Any] = []

        def run_kernel() -> list[torch.Tensor]:
            served.append(kernel())
            out = served[0]
            if returns is not None:
                return _unpack(out, returns) or []
            return [out] if isinstance(out, torch.Tensor) else list(out)

        original: list[Any] = []  # the function's own return value, returned when the check fails

        def trusted() -> list[Any]:
            original.append(self.fn(*args, **kwargs))
            out = original[0]
            return [out] if returns is None else (_unpack(out, returns) or [out])

        def reference64(clones: Sequence[torch.Tensor]) -> errors.References:
            with torch.no_grad():
                return errors.references(family, spec, clones, lowp=False)

        self.stats["checks"] += 1
        results, kernels = serve.run(
            family, spec, runner, inputs, trusted, reference64, run_kernel
        )
        if kernels:
            self.stats["kernel_calls"] += 1
            return served[0]
        self.stats["fallback_calls"] += 1
        return original[0] if original else results[0]

    def _tune(self, bucket: OpSpec, device_mode: str) -> Any:
        from kernelsmith.tuner import tune_spec

        self.stats["tunes"] += 1
        name = getattr(self.fn, "__qualname__", self.fn)
        log.info("%s: tuning %s (budget %d); this call waits for the search, later ones do not",
                 name, bucket.describe(), self.budget)
        result = tune_spec(
            bucket, budget=self.budget, strategy=self.strategy, db=self.db, mode=device_mode, devices=self.devices,
            progress=_terminal_progress(f"kernelsmith: tuning {bucket.describe()}"), force=self.forces_retune,
        )
        log.info("%s: tuned %s: %s after %d evaluations", name, bucket.describe(), result.winner, result.evaluations)
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


def optimize(
    fn: F | None = None,
    *,
    budget: int = 50,
    strategy: str = "auto",
    mode: str | None = None,
    db: Any = None,
    check: bool | float | None = None,
    devices: Sequence[int] | str | None = None,
    config: Mapping[str, Any] | None = None,
    force_retune: bool | None = None,
    require_tuned: bool | None = None,
) -> Any:
    """Decorate a function so that calls run a tuned kernel when one beats it.

    Use as ``@optimize`` or ``@optimize(budget=..., strategy=..., mode=..., db=..., check=...)``.
    ``mode`` is "tune" (default; also ``KERNELSMITH_MODE``), "db" or "background"; ``db`` a
    database path or URL (default: ``KERNELSMITH_DB`` or the per-user cache). ``check`` governs
    the serve checks (the first calls of a kept kernel, then a sampled fraction, compared with
    this function): None follows ``KERNELSMITH_CHECK`` and ``KERNELSMITH_CHECK_RATE`` (default:
    on, 1 call in 1000 after the first 3), False turns them off, True on, a number in [0, 1] is
    the sampled fraction. ``devices`` are the GPUs its tuning runs on (such as ``[0, 1]``;
    default: every visible one). ``config`` pins a config in code instead of tuning (as Helion's
    ``config=``): ``{"variant": "multi_row", "ROWS": 4, "num_warps": 4, "num_stages": 1}``; it is
    validated like any candidate before first use, and a config that fails is refused with a
    warning (the original function runs), never served. ``force_retune=True`` tunes each workload
    again on its first call in this process even where a decision is stored; ``require_tuned=True``
    never tunes and raises :class:`kernelsmith.NotTunedError` naming the workload where none is
    stored (for CI and deployment; ``mode="db"`` is the quiet form: the original function runs).
    None reads ``KERNELSMITH_FORCE_RETUNE`` / ``KERNELSMITH_REQUIRE_TUNED``;
    ``KERNELSMITH_DATABASE_ONLY=1`` makes every decorated function ``mode="db"``.
    """
    if config is not None and not isinstance(config, Mapping):
        raise TypeError(f"config must be a mapping of parameter names to values, not {type(config).__name__}")
    if mode is not None and mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    if force_retune and (require_tuned or mode == "db"):
        raise ValueError("force_retune contradicts require_tuned / mode='db', which never tune")
    servecheck.CheckPolicy.resolve(check)  # a bad rate is an error here, not on a later call

    def decorate(function: F) -> F:
        state = Optimized(
            function, budget=budget, strategy=strategy, mode=mode, db=db, check=check, devices=devices,
            config=dict(config) if config is not None else None, force_retune=force_retune,
            require_tuned=require_tuned,
        )

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return state(*args, **kwargs)

        wrapper.kernelsmith = state  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate(fn) if fn is not None else decorate
