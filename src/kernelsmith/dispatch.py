"""Call-time dispatch: from a stored decision to a launcher, and the ``torch.library`` op.

A :class:`KernelRunner` is a built launcher plus the shapes of the outputs it writes: calling it
allocates the outputs and launches, nothing else. Front doors keep runners in in-process tables
keyed by the call's shapes, dtypes, strides and device, so a repeated call does no hashing of
large objects, no database query and no tracing.

``torch.ops.kernelsmith.kernel(op, inputs, constants, decisions)`` exposes every tuned kernel as
one ``torch.library`` custom op (defined in :mod:`kernelsmith.frontends.torch_op`, which
``import kernelsmith`` registers) with a fake (meta) implementation, so that torch.compile graphs
and torch.export can hold kernelsmith kernels. Its implementation (:func:`run_kernel`) serves, for
the concrete inputs' workload, the decision the graph carries in ``decisions`` (see
:func:`encode_decisions`), else the stored winner, else the op's PyTorch reference.

Kernels written outside the package. A decision may name a variant that is not one of the
family's built-in ones: a kernel file (``docs/kernel-files.md``: Triton device code and a
declarative launch, no host Python) a coding agent (``kernelsmith agent bench``) or an LLM
proposed, whose text the database keeps by source hash (``Database.put_variant_source``). Such
source is evaluated in worker processes; serving its winner means compiling its kernels in the
caller's process and launching them with kernelsmith's own launcher (the file's Python never
runs, but its device code reads and writes the call's tensors), which is a trust decision:
:func:`build_runner` loads only text that

- this user trusts: the tool itself stored it after it passed the full harness (static gate,
  validation on every distribution and tail shape, timing checks) in a worker, or the user
  trusted it with ``kernelsmith db trust`` (imported text, and text in a database someone else
  wrote, is never read before that; see :mod:`kernelsmith.db.trust`);
- still hashes to the hash the decision names (a row edited by hand is refused);
- passes the kernel-file gate again, as it did before evaluation (only the Triton language in
  kernel bodies, only literal launch data);

and the front doors check the first call's output against the float64 reference before they
adopt the runner, then check its first served calls and a secret sample of later ones on the
user's real inputs (:class:`CheckedRunner`, :mod:`kernelsmith.servecheck`). Device code is not
a sandbox: a kernel reaches whatever memory its pointers do, so the gate keeps host code out and
trust keeps unknown device code out; neither stops a determined attacker with write access to
the database, who could equally edit the package.

The pieces, one module each, every public name re-exported here: the runners and their serve
checks (:mod:`kernelsmith._dispatch_runners`), which decision serves a call, stored or carried by
a graph (:mod:`kernelsmith._dispatch_decisions`), and the refusals and stored kernel files of
:func:`build_runner` (:mod:`kernelsmith._dispatch_trust`). This module builds runners from
decisions and holds the op's call-time table (:func:`runner_for`). Tests replace
``build_runner``, ``load_stored_source`` and ``_RUNNERS`` on this module, so the code that looks
those names up lives here too.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from typing import Any

import torch

from kernelsmith import servecheck
from kernelsmith._dispatch_decisions import DECISIONS_VERSION as DECISIONS_VERSION
from kernelsmith._dispatch_decisions import carried_entry as carried_entry
from kernelsmith._dispatch_decisions import carried_winners as carried_winners
from kernelsmith._dispatch_decisions import embeddable as embeddable
from kernelsmith._dispatch_decisions import encode_decisions as encode_decisions
from kernelsmith._dispatch_decisions import interpreter_enabled as interpreter_enabled
from kernelsmith._dispatch_decisions import lookup_decision as lookup_decision
from kernelsmith._dispatch_decisions import lookup_or_revalidate as lookup_or_revalidate
from kernelsmith._dispatch_decisions import mode_for as mode_for
from kernelsmith._dispatch_decisions import parse_decisions as parse_decisions
from kernelsmith._dispatch_decisions import pinned_workload as pinned_workload
from kernelsmith._dispatch_decisions import revalidate_near_winners as revalidate_near_winners
from kernelsmith._dispatch_decisions import stored_decision as stored_decision
from kernelsmith._dispatch_runners import CheckedRunner as CheckedRunner
from kernelsmith._dispatch_runners import KernelFunction as KernelFunction
from kernelsmith._dispatch_runners import KernelRunner as KernelRunner
from kernelsmith._dispatch_runners import _family_spec, _reference, _spec_of
from kernelsmith._dispatch_trust import load_stored_source as load_stored_source
from kernelsmith._dispatch_trust import refuse_unservable as refuse_unservable
from kernelsmith._dispatch_trust import refuse_untrusted_source as refuse_untrusted_source
from kernelsmith.db import DatabaseError, DecisionRecord, open_database, warn_unusable_database
from kernelsmith.frontends.torch_op import KERNEL as KERNEL  # re-exported: the op lives there
from kernelsmith.frontends.torch_op import kernel_op as kernel_op
from kernelsmith.ops import OpFamily, UnsupportedWorkload
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec

log = logging.getLogger(__name__)


def build_runner(family: OpFamily, spec: OpSpec, decision: DecisionRecord, db: Any = None) -> KernelRunner:
    """The runner of a "kernel" decision for ``spec`` (the exact call, not its bucket).

    A built-in variant is built from the package; any other variant name is a kernel written
    outside the package, loaded from its source in the database ``db`` (default: the default
    database) by :func:`load_stored_source` (see the module docstring for why that is trusted).
    Raises LookupError when the stored variant no longer exists or its source changed since it
    was measured: a decision is only as good as the code it was measured on. Also, before any
    stored text is read (DESIGN.md rule 13), for an imported claim not validated here
    (:func:`refuse_unservable`) and for a kernel source this user has not trusted
    (:func:`refuse_untrusted_source`).
    """
    config = Config(decision.config)
    failed = servecheck.disabled(decision.workload, decision.variant, decision.source_hash, decision.config)
    if failed:
        raise LookupError(f"{family.name}/{decision.variant} is disabled here by a failed serve check: {failed}")
    if decision.variant not in {v.name for v in family.variants}:
        refuse_untrusted_source(family.name, decision.source_hash, db)
        refuse_unservable(family.name, decision)
        build = load_stored_source(family.name, decision.source_hash, db)
        return KernelRunner.build(family, spec, build(spec, config), decision.variant, config, decision.source_hash)
    refuse_unservable(family.name, decision)
    variant = family.variant(decision.variant)
    if decision.source_hash and decision.source_hash != variant.source_hash:
        raise LookupError(f"{family.name}/{variant.name} changed since it was tuned (source hash differs)")
    return KernelRunner.build(family, spec, variant.build(spec, config), variant.name, config, decision.source_hash)


# ---- the torch.library op ------------------------------------------------------------------------
# Per call key: the checked runner serving it, or None where the op's PyTorch reference runs.
_RUNNERS: dict[tuple[Any, ...], CheckedRunner | None] = {}
_RUNNERS_LOCK = threading.Lock()


def _served(
    key: tuple[Any, ...], runner: KernelRunner, op: str, constants: str, mode: str, db: Any = None
) -> CheckedRunner:
    """``runner`` as ``kernelsmith::kernel`` serves it for ``key``: checked, and replaced in the
    table by the reference when a check fails (the policy is read from the environment now)."""

    def fall_back() -> None:
        with _RUNNERS_LOCK:
            _RUNNERS[key] = None

    return CheckedRunner(runner, op, constants, servecheck.CheckPolicy.resolve(), mode, db, on_failure=fall_back)


def _runner_key(
    op: str, inputs: Sequence[torch.Tensor], constants: str, device: torch.device | None = None, decisions: str = "",
    written: tuple[int, ...] = (),
) -> tuple[Any, ...]:
    """The call key: the op, its constants and decisions, each input's layout, and (last) the
    inputs ``kernelsmith::kernel_mutating`` declares ``written``, so that ``kernelsmith::kernel``
    never finds a runner that writes its inputs."""
    shapes = ((tuple(t.shape), t.dtype, t.stride(), device or t.device) for t in inputs)
    return (op, constants, decisions, *shapes, written)


def install_runner(
    op: str,
    inputs: Sequence[torch.Tensor],
    constants: str,
    runner: KernelRunner,
    device: torch.device | None = None,
    db: Any = None,
) -> None:
    """Serve ``runner`` to ``kernelsmith::kernel`` calls with exactly these inputs' shapes,
    dtypes, strides and device (``device`` overrides theirs: the compile backend installs from
    example tensors) in this process, with serve checks (a failure is recorded in ``db``);
    other calls resolve from the database as usual."""
    family, spec = _family_spec(op, inputs, constants)
    key = _runner_key(op, inputs, constants, device, written=tuple(family.written_inputs(spec)))
    where = device or inputs[0].device
    mode = "gpu" if where.type == "cuda" else "interpreter"
    with _RUNNERS_LOCK:
        _RUNNERS[key] = _served(key, runner, op, constants, mode, db)


def runner_for(op: str, inputs: Sequence[torch.Tensor], constants: str, decisions: str = "",
               written: tuple[int, ...] = ()) -> CheckedRunner | None:  # fmt: skip
    """The (checked) runner ``kernelsmith::kernel`` uses for these inputs: installed, or built
    from the decision ``decisions`` carry for their bucket, or from the stored decision (cached),
    or None when the op's PyTorch reference must run. ``kernelsmith::kernel_mutating`` looks its
    runners up here too, ``written`` the inputs it declares written (a call whose family writes
    others is refused, and runs the reference, which refuses it too)."""
    key = _runner_key(op, inputs, constants, decisions=decisions, written=written)
    if key in _RUNNERS:
        return _RUNNERS[key]
    runner: CheckedRunner | None = None
    mode = mode_for(inputs)
    try:
        family, spec = _spec_of(op, inputs, constants, written)
        if mode is not None:
            runner = _carried_runner(key, family, spec, constants, mode, decisions)
            if runner is None:
                with open_database() as db:
                    decision = lookup_or_revalidate(db, mode, family, spec)
                if decision is not None and decision.winner == "kernel":
                    runner = _served(key, build_runner(family, spec, decision), op, constants, mode)
    except (UnsupportedWorkload, LookupError, KeyError) as exc:
        log.info("kernelsmith::kernel(%s) uses the PyTorch reference: %s", op, exc)
    except DatabaseError as exc:  # a broken cache is not a broken program
        warn_unusable_database(exc)
    with _RUNNERS_LOCK:
        _RUNNERS[key] = runner
    return runner


def _carried_runner(
    key: tuple[Any, ...], family: OpFamily, spec: OpSpec, constants: str, mode: str, decisions: str
) -> CheckedRunner | None:
    """The runner of the decision the graph carries for ``spec`` (its exact workload, else its
    bucket), or None. A carried decision that cannot be built here (a kernel file, whose source
    lives in a database; a variant changed since) is logged and the database is asked instead."""
    if not decisions:
        return None
    entry = carried_entry(decisions, mode, family, spec)
    if entry is None:
        return None
    try:
        runner = build_runner(family, spec, entry)
    except LookupError as exc:
        log.info("kernelsmith::kernel(%s): the carried decision is not used: %s", family.name, exc)
        return None
    return _served(key, runner, family.name, constants, mode)


def run_kernel(op: str, inputs: Sequence[torch.Tensor], constants: str, decisions: str = "",
               written: tuple[int, ...] = ()) -> list[torch.Tensor]:  # fmt: skip
    """The implementation of ``kernelsmith::kernel`` and, with the inputs it declares ``written``,
    of ``kernelsmith::kernel_mutating`` (:mod:`kernelsmith.frontends.torch_op`): one runner table."""
    runner = runner_for(op, inputs, constants, decisions, written)
    if runner is None:
        return _reference(op, inputs, constants, written)
    return runner(inputs)


def constants_json(constants: dict[str, Any]) -> str:
    """The ``constants`` argument of ``kernelsmith::kernel``: sorted JSON, so that equal constants
    make equal call keys."""
    return json.dumps(constants, sort_keys=True)
