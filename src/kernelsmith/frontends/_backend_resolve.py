"""Which sites the backend replaces: stored (or freshly tuned) winners, checked on fresh inputs.

Step 2 of the ``kernelsmith`` torch.compile backend (:mod:`kernelsmith.frontends.backend`): for
each site found in the graph, the resolver looks up the database's decision for its workload's
bucket (tuning it now with ``tune=True``), builds the stored kernel and checks its output on fresh
inputs against the float64 reference, the same check as ``@kernelsmith.optimize``; in a training
graph the family's backward kernel must have won too. Kept sites are then rewritten.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kernelsmith import dispatch
from kernelsmith.db import DatabaseError, DecisionRecord, open_database, warn_unusable_database
from kernelsmith.evaluate import errors
from kernelsmith.frontends import triton_ops
from kernelsmith.frontends._backend_sites import Site, _dynamic, _input_meta, _value
from kernelsmith.ops import OpFamily, UnsupportedWorkload, get_op
from kernelsmith.spec import OpSpec

log = logging.getLogger("kernelsmith.frontends.backend")  # this code's logger in backend.py


# ---------------------------------------------------------------------------------------------
# Which sites to replace: stored (or freshly tuned) winners, checked on fresh inputs
# ---------------------------------------------------------------------------------------------


@dataclass
class _Resolver:
    db: Any
    tune: bool
    budget: int
    strategy: str
    # (family, workload, mode, device) -> the checked runner and its decision, or (status, reason):
    # a model's layers repeat their workloads, which are looked up, tuned and checked once.
    _done: dict[tuple[str, str, str, str], Any] = field(default_factory=dict)

    def resolve(self, site: Site, mode: str | None) -> None:
        """Set ``site.status`` (and its runners when it is to be replaced)."""
        if site.status != "found":
            return
        if mode is None:
            site.status = "unsupported"
            site.reason = "not CUDA tensors (set KERNELSMITH_INTERPRET=1 to run kernels on the CPU)"
            return
        family = get_op(site.op)
        device = _value(site.output).device
        if any(_dynamic(_value(i.node)) for i in site.inputs):
            self._resolve_dynamic(site, family, mode, device)
            return
        forward = self._runner(site, family, site.spec, mode, device)
        if forward is None:
            return
        site.speedup = forward[1].metrics.get("speedup")
        runners = [(site.op, [_input_meta(i) for i in site.inputs], forward[0])]
        if site.needs_grad:
            if family.backward is None:
                site.status, site.reason = "no backward", f"{site.op} has no backward kernel family"
                return
            backward_family = get_op(family.backward)
            try:
                backward_inputs = _backward_metas(family, site)
                backward_spec = backward_family.spec_for(*backward_inputs, **site.constants)
            except UnsupportedWorkload as exc:
                site.status, site.reason = "no backward", str(exc)
                return
            backward = self._runner(site, backward_family, backward_spec, mode, device)
            if backward is None:
                site.reason = f"backward: {site.reason}"
                return
            site.backward_speedup = backward[1].metrics.get("speedup")
            runners.append((backward_family.name, list(backward_inputs), backward[0]))
        site.status, site.runners = "replaced", runners
        site.triton_decision = triton_ops.site_decision(
            site.op, runners[0][1], dispatch.constants_json(site.constants), forward[1], mode, device,
            static=True, training=site.needs_grad)

    def _resolve_dynamic(self, site: Site, family: OpFamily, mode: str, device: torch.device) -> None:
        """A site of a graph with symbolic sizes: its op call carries every stored winner of its
        family with its constants and dtypes (and, in training, its backward family's), and the
        concrete shape of each call picks one (``kernelsmith::kernel``'s ``decisions``). With
        ``tune``, the workload of the graph's example shape is tuned (and checked) first."""
        if any(i.reshape is not None for i in site.inputs):
            site.status, site.reason = "unsupported", "an input is reshaped, in a graph with symbolic sizes"
            return
        if family.backward is None and site.needs_grad:
            site.status, site.reason = "no backward", f"{site.op} has no backward kernel family"
            return
        if self.tune:
            self._runner(site, family, site.spec, mode, device)  # tunes the example shape's bucket
        try:
            with open_database(self.db) as db:
                # after an upgrade: the winners tuned before it, re-validated here
                dispatch.revalidate_near_winners(db, family, site.spec, mode)
                records = dispatch.carried_winners(db, family, site.spec, mode)
                if records and site.needs_grad and family.backward is not None:
                    backward = get_op(family.backward)  # its winners match on the constants alone
                    dispatch.revalidate_near_winners(db, backward, site.spec, mode, compare_dtypes=False)
                    records += dispatch.carried_winners(db, backward, site.spec, mode, compare_dtypes=False)
        except DatabaseError as exc:
            warn_unusable_database(exc)
            site.status, site.reason = "no database", f"the database cannot be used: {exc}"
            return
        if not records:
            site.status = "not tuned"
            site.reason = (f"no stored {site.op} winner with these constants and dtypes (tune it, or pass "
                           "options={'tune': True})")
            return
        site.status, site.reason = "replaced", f"{len(records)} winner(s) carried, one chosen per call's shape"
        site.decisions = dispatch.encode_decisions(records, mode)

    def _runner(
        self, site: Site, family: OpFamily, spec: OpSpec, mode: str, device: torch.device
    ) -> tuple[dispatch.KernelRunner, DecisionRecord] | None:
        key = (family.name, spec.workload_hash, mode, str(device))
        if key not in self._done:
            self._done[key] = self._resolve_workload(family, spec, mode, device)
        found = self._done[key]
        if isinstance(found[0], str):
            site.status, site.reason = found
            return None
        return found  # type: ignore[no-any-return]

    def _resolve_workload(
        self, family: OpFamily, spec: OpSpec, mode: str, device: torch.device
    ) -> tuple[dispatch.KernelRunner, DecisionRecord] | tuple[str, str]:
        bucket = family.bucket(spec)
        try:
            decision = self._decision(family, bucket, mode)
            if decision is None and self.tune:
                from kernelsmith.tuner import tune_spec

                log.info("tuning %s (budget %d)", bucket.describe(), self.budget)
                tune_spec(bucket, budget=self.budget, strategy=self.strategy, db=self.db, mode=mode)
                decision = self._decision(family, bucket, mode)
        except DatabaseError as exc:  # a broken cache is not a broken program: one warning, Inductor's code
            warn_unusable_database(exc)
            return "no database", f"the database cannot be used: {exc}"
        if decision is None:
            hint = "tune it, or pass options={'tune': True}"
            return "not tuned", f"no stored decision for {bucket.describe()} ({hint})"
        if decision.winner != "kernel":
            return "baseline wins", f"the baseline wins for {bucket.describe()}"
        return self._checked_runner(family, spec, decision, device)

    def _checked_runner(
        self, family: OpFamily, spec: OpSpec, decision: DecisionRecord, device: torch.device
    ) -> tuple[dispatch.KernelRunner, DecisionRecord] | tuple[str, str]:
        """The runner of ``decision``'s variant and config for ``spec`` (the exact call, not its
        bucket) and the decision, once its outputs on fresh inputs are within the family's
        tolerance of the float64 reference; else ``("check failed", why)``. (Also the check of a
        candidate that lost on time and is served for memory: ``hf_lm_loss``'s ``max_slowdown``.)"""
        bucket = family.bucket(spec)
        try:
            runner = dispatch.build_runner(family, spec, decision, db=self.db)
            inputs = family.make_inputs(spec, seed=20240611, device=device)
            # (judged as validation judges: references and floors of the inputs before it runs;
            # the inputs a family writes are checked where it serves, by its serve check)
            references = errors.references(family, spec, errors.pristine_inputs(family, spec, inputs))
            problem = references.problem(runner(inputs), family.tolerance)
        except Exception as exc:  # a stored kernel that fails here must never break compilation
            problem = f"{type(exc).__name__}: {exc}"
        if problem:
            return "check failed", f"stored kernel for {bucket.describe()} not used: {problem}"
        return runner, decision

    def kernel_decided(self, site: Site) -> bool:
        """The ``rope_decided`` test of :func:`find_sites`: a fused site is offered only when its
        kernel is what this resolver would serve: tuning is asked for and nothing is stored for its
        bucket (it will be tuned), or the decision stored (or a near fingerprint's, re-validated
        here) says the kernel wins. Not decided: no decision and no tuning, a baseline win, tensors
        the kernels do not run on here, a database that cannot be used; the smaller sites that then
        take the nodes get their own status, and reason, from :meth:`resolve`."""
        mode = dispatch.mode_for([_value(i.node) for i in site.inputs])
        if mode is None:
            return False
        family = get_op(site.op)
        try:
            decision = self._decision(family, family.bucket(site.spec), mode)
        except DatabaseError:
            return False
        return self.tune if decision is None else decision.winner == "kernel"

    def _decision(self, family: OpFamily, bucket: OpSpec, mode: str) -> DecisionRecord | None:
        """The decision stored for ``bucket`` here, or a near fingerprint's re-validated here
        (another driver build or kernelsmith release: :func:`dispatch.lookup_or_revalidate`).
        With ``tune`` the stored one only: ``tune_spec``, which runs next on a miss, carries a
        near fingerprint's record over itself before it searches."""
        with open_database(self.db) as db:
            if self.tune:
                return dispatch.stored_decision(db, mode, bucket)
            return dispatch.lookup_or_revalidate(db, mode, family, bucket)


def _backward_metas(family: OpFamily, site: Site) -> tuple[torch.Tensor, ...]:
    """The backward family's inputs as the autograd formula builds them, as meta tensors."""
    inputs = [_input_meta(i) for i in site.inputs]
    outputs = [torch.empty(t.shape, dtype=t.torch_dtype, device="meta") for t in family.output_specs(site.spec)]
    grads = [torch.empty_like(o, memory_format=torch.contiguous_format) for o in outputs]
    return tuple(family.backward_inputs(grads, inputs, outputs))


def _install(op: str, inputs: Sequence[torch.Tensor], constants: str, runner: dispatch.KernelRunner,
             device: torch.device, db: Any = None) -> None:
    """Serve ``runner`` to ``kernelsmith::kernel`` calls with exactly these inputs in this process,
    with serve checks against the op's reference (a failure is recorded in ``db``).

    A call that misses (other strides) resolves from the default database as usual.
    """
    dispatch.install_runner(op, inputs, constants, runner, device, db)


