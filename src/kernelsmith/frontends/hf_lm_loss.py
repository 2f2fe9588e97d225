"""The LM head's loss of a Hugging Face causal LM without its logits: an opt-in forward patch.

Why a patch. ``LlamaForCausalLM.forward`` computes ``logits = self.lm_head(hidden_states)`` and
returns them beside the loss. Under ``torch.compile`` the logits are then a graph output, so the
``(tokens x vocabulary)`` product must be computed and kept whatever the loss does: a fused
linear + cross-entropy can replace only the upcast and the loss, which adds work and saves no
memory (the in-context training-step decision rightly says "baseline wins"). The memory is only
saved by not returning the logits, which changes what the model returns, so it is the user's
choice, as in Liger-Kernel's patched forwards.

What :func:`fuse_lm_loss` does. It wraps the model's ``forward`` (the instance's, not the class's)
so that when ``labels`` are given, the model is training and autograd is on, the loss is
computed by kernelsmith's fused linear + cross-entropy (``linear_cross_entropy_fused``: the loss
and the gradients of the hidden states, the LM head's weight and its bias, chunk by chunk, so
the float32 logits and their gradient never exist in full) from the final hidden states and
``lm_head.weight`` (tied to the embedding or not), with Hugging Face's causal-LM loss semantics:
labels shifted by one (or the ``shift_labels`` given), ``ignore_index`` -100, the mean over the
non-ignored tokens, or the sum divided by ``num_items_in_batch`` when given, and Gemma 2's
final-logit soft-capping from ``config.final_logit_softcapping``. **The output's ``logits`` is
then None.** Without labels, in eval mode, under ``torch.no_grad()``, with ``logits_to_keep`` not
0, or when the call passes ``skip_logits=False``, Hugging Face's own forward runs unchanged
(logits returned). ``skip_logits=True`` forces the fused loss (labels required), also in eval mode
(without autograd it runs the forward-only ``linear_cross_entropy`` family).

Which kernels. The first call of each shape (per process and set of options: models patched
alike share their resolutions) looks up the stored winner of the family's workload
(tuning it now within ``budget`` evaluations when ``tune=True``) and checks it on fresh inputs
against the float64 reference, as the compile backend does for its sites; the call then carries
that decision into ``kernelsmith::kernel`` (a ``torch.library`` custom op, so the same code runs
eagerly and under ``torch.compile``, whose graph keeps the op opaque). Where no kernel wins (or
the tensors are CPU tensors outside the interpreter) the op runs its PyTorch reference: the same
loss, computed with the logits (no memory saved), which the log says once per shape, and
:func:`fallback_reasons` returns.

Memory for time (``max_slowdown``). The stored decision is a race on time alone, but the user
who calls :func:`fuse_lm_loss` asked for memory. So where the decision says the baseline wins,
the best candidate its search measured (a baseline decision keeps that candidate's variant,
config and times) is served anyway when its median time is at most ``1 + max_slowdown`` times
the reference's (the two medians the decision stored) and it passes the same check on fresh
inputs against float64 at the call's own shape as a winner. Never served: a decision whose
search had no candidate pass validation, a claim not validated here (or failed), a kernel file
(only built-in variants are carried in the op's decisions), a record without both times, a
candidate farther behind. The log says what was traded (how much slower, for how many MiB of
logits not materialized) once per shape, and :func:`tradeoffs` returns it. ``max_slowdown=0``
serves winners only (time first). The default, :data:`DEFAULT_MAX_SLOWDOWN`, says why it is 0.5.

Under ``torch.compile`` the resolution runs while Dynamo traces
(``torch.compiler.assume_constant_result``: it takes shapes and dtypes, never tensor data, and its
result, the decisions string, is a constant of the graph), so the forward stays one graph. Sizes
are specialized (one decision per token count). The targets are not checked against the
vocabulary on the host (a check would synchronize every step): a label outside ``[0, V)`` that is
not ``ignore_index`` makes the loss NaN, where Hugging Face's forward raises.

Why no variant that writes bf16 logits as well: it would save only their float32 copies and add
a ``(tokens x vocabulary)`` write; a caller who needs the logits runs the model's own forward.

Which models. Only forwards this module knows: a class from ``transformers`` named in
:data:`KNOWN_CLASSES` whose ``forward`` is that class's own (not patched by another library, not
overridden by a subclass), with ``model``, an ``nn.Linear`` ``lm_head`` of ``config.vocab_size``
rows and Hugging Face's ``ForCausalLMLoss`` as its ``loss_function``. Anything else is refused:
the model is returned unchanged and the reason is logged (:func:`refusal` returns it).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import logging
import math
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from kernelsmith.space import Config

if TYPE_CHECKING:
    from kernelsmith.db import DecisionRecord
    from kernelsmith.frontends._backend_resolve import _Resolver
    from kernelsmith.ops import OpFamily
    from kernelsmith.spec import OpSpec

log = logging.getLogger(__name__)

KNOWN_CLASSES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "GemmaForCausalLM",
    "Gemma2ForCausalLM",
)
IGNORE_INDEX = -100  # Hugging Face's and F.cross_entropy's default
FORWARD_ONLY = "linear_cross_entropy"
FUSED = "linear_cross_entropy_fused"
# The loss kernel may take up to 1.5x the reference's time where it loses (see "Memory for time"
# above). Why 0.5: the user opted in to save memory, and the reference costs much of it: it
# materializes tensors of the (tokens x vocabulary) logits' size in the head's dtype and in float32
# (the upcast), and their gradients (2 x 2048 tokens at a 128256 vocabulary in bfloat16: 1 GiB and
# 2 GiB each), where the kernel holds one float32 chunk. The op is one of a step's many (the
# LM head's three products beside every layer's), so 50% more time on it is a fraction of that
# on the step. And a loss on time is what a short search gives: on an H200 (issue 18) a budget-4
# search at 2 x 1024 tokens and a 65536 vocabulary lost to the reference, so with winners only
# the patch saved nothing there. Farther behind than 1.5x, the tiles are far from the vendor GEMMs'
# (tune longer), and the reference's speed is the better default. max_slowdown=0: time first.
DEFAULT_MAX_SLOWDOWN = 0.5
_ATTRIBUTE = "_kernelsmith_lm_loss"  # the instance attribute holding the patch's state


# ---------------------------------------------------------------------------------------------
# Which models
# ---------------------------------------------------------------------------------------------


def _known_class(model: nn.Module) -> type[nn.Module] | None:
    for cls in type(model).__mro__:
        if cls.__name__ in KNOWN_CLASSES and cls.__module__.startswith("transformers."):
            return cls
    return None


def refusal(model: nn.Module) -> str | None:
    """Why :func:`fuse_lm_loss` would not patch ``model`` (None: it would)."""
    cls = _known_class(model)
    if cls is None:
        return (f"{type(model).__name__} is not one of the Hugging Face causal LMs whose forward kernelsmith "
                f"knows ({', '.join(KNOWN_CLASSES)})")  # fmt: skip
    if type(model).forward is not cls.forward:
        return f"{type(model).__name__}.forward is not {cls.__name__}'s own (overridden or patched by another library)"
    if "forward" in vars(model) and not hasattr(model, _ATTRIBUTE):
        return "the model's forward is already replaced on the instance"
    config = getattr(model, "config", None)
    vocab = getattr(config, "vocab_size", None)
    head = getattr(model, "lm_head", None)
    if not isinstance(getattr(model, "model", None), nn.Module):
        return "the model has no base model (model.model)"
    if not isinstance(head, nn.Linear) or not isinstance(vocab, int) or head.weight.shape[0] != vocab:
        return "the model has no nn.Linear lm_head of config.vocab_size outputs"
    try:
        from transformers.loss.loss_utils import ForCausalLMLoss
    except ImportError:
        return "this transformers has no transformers.loss.loss_utils.ForCausalLMLoss"
    loss_function = getattr(model, "loss_function", None)
    if getattr(loss_function, "__func__", loss_function) is not ForCausalLMLoss:
        return (
            f"the model's loss_function is {getattr(loss_function, '__name__', loss_function)!r}, not ForCausalLMLoss"
        )
    return None


# ---------------------------------------------------------------------------------------------
# The loss
# ---------------------------------------------------------------------------------------------


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """The fused op's loss, whose gradients it computed with the loss (for an upstream gradient
    of 1): the backward only scales them by the upstream gradient (Liger-Kernel's form; one
    product fewer than recomputing the logits in the backward)."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,  # type: ignore[override]
                bias: torch.Tensor | None, constants: str, decisions: str) -> torch.Tensor:  # fmt: skip
        from kernelsmith.frontends.torch_op import kernel_op

        inputs = [hidden, weight, target] + ([bias] if bias is not None else [])
        loss, *grads = kernel_op(FUSED, inputs, constants, decisions)
        ctx.save_for_backward(*grads)
        ctx.has_bias = bias is not None
        return loss

    @staticmethod
    def backward(ctx: Any, upstream: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        grads = [g * upstream.to(g.dtype) for g in ctx.saved_tensors]
        dbias = grads[2] if ctx.has_bias else None
        return grads[0], grads[1], None, dbias, None, None


def constants_json(ignore_index: int, reduction: str, softcap: float | None) -> str:
    """The op's constants as :func:`kernelsmith.dispatch.constants_json` writes them (sorted JSON),
    built by concatenation: Dynamo cannot trace ``json.dumps``, and this runs inside the graph."""
    cap = str(float(softcap)) if softcap else "null"
    return (f'{{"ignore_index": {ignore_index}, "label_smoothing": 0.0, "reduction": "{reduction}", '
            f'"softcap": {cap}}}')  # fmt: skip


def causal_lm_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor | None,
    *,
    bias: torch.Tensor | None = None,
    softcap: float | None = None,
    num_items_in_batch: torch.Tensor | int | None = None,
    ignore_index: int = IGNORE_INDEX,
    shift_labels: torch.Tensor | None = None,
    decisions: Callable[[list[torch.Tensor], str, str], str] | None = None,
) -> torch.Tensor:
    """Hugging Face's ``ForCausalLMLoss`` of ``lm_head(hidden)`` (soft-capped by ``softcap``)
    computed by the fused linear + cross-entropy, logits never stored: ``labels`` shifted by one
    (padded with ``ignore_index``) unless ``shift_labels`` are given, the mean over the tokens not
    ignored, or their sum divided by ``num_items_in_batch``. ``decisions(inputs, op, constants)``
    gives the kernel decisions the op call carries (None: the op serves the default database's
    winner, else its PyTorch reference)."""
    if shift_labels is None:
        if labels is None:
            raise ValueError("causal_lm_loss needs labels or shift_labels")
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    # The op takes h in W's dtype (F.linear would refuse a mix outside autocast; under autocast
    # the hidden states and a float32 head are both float32).
    h = hidden.reshape(-1, hidden.shape[-1]).to(weight.dtype).contiguous()
    target = shift_labels.reshape(-1).to(device=h.device, dtype=torch.int64).contiguous()
    reduction = "sum" if num_items_in_batch is not None else "mean"
    constants = constants_json(int(ignore_index), reduction, softcap)
    inputs = [h, weight, target] + ([bias] if bias is not None else [])
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (h, weight, bias) if t is not None)
    op = FUSED if grad else FORWARD_ONLY
    carried = decisions(inputs, op, constants) if decisions is not None else ""
    if grad:
        loss = _FusedLinearCrossEntropy.apply(h, weight, target, bias, constants, carried)
    else:
        from kernelsmith.frontends.torch_op import kernel_op

        (loss,) = kernel_op(FORWARD_ONLY, inputs, constants, carried)
    if num_items_in_batch is not None:
        if isinstance(num_items_in_batch, torch.Tensor):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss


# ---------------------------------------------------------------------------------------------
# Kernel decisions, resolved once per shape outside any graph
# ---------------------------------------------------------------------------------------------


Meta = tuple[tuple[int, ...], str]  # an input's shape and dtype name ("torch.bfloat16")


Options = tuple[str, bool, int, str, float]  # (db, tune, budget, strategy, max_slowdown)


class _Decisions:
    """The decisions string each ``(op, shapes, dtypes, device, constants)`` call carries: the
    stored (or freshly tuned) winner, checked on fresh inputs, or, within ``max_slowdown``, the
    checked best candidate of a baseline decision (module docstring: "Memory for time"), or ""
    where the op's reference runs. One per set of options (:data:`_SHARED`), so that a traced call
    can name it by constants."""

    def __init__(self, db: Any, tune: bool, budget: int, strategy: str, max_slowdown: float) -> None:
        self.db, self.tune, self.budget, self.strategy = db, tune, budget, strategy
        self.max_slowdown = max_slowdown
        self.options: Options = (str(db), tune, budget, strategy, max_slowdown)
        self.found: dict[str, str] = {}
        self.reasons: dict[str, str] = {}  # key -> why the reference runs there
        self.traded: dict[str, str] = {}  # key -> what serving a slower kernel traded there

    def resolve(self, op: str, constants: str, metas: tuple[Meta, ...], device: torch.device) -> str:
        from kernelsmith import dispatch
        from kernelsmith.frontends._backend_resolve import _Resolver
        from kernelsmith.ops import UnsupportedWorkload, get_op

        key = _key(op, constants, metas, device.type)
        if key in self.found:
            return self.found[key]
        mode = dispatch.mode_for([torch.empty(0, device=device)])
        decisions, reason = "", ""
        if mode is None:
            reason = "not CUDA tensors (set KERNELSMITH_INTERPRET=1 to run kernels on the CPU)"
        else:
            family = get_op(op)
            # Meta tensors: the spec needs shapes and dtypes only (and a traced call has no data).
            inputs = [torch.empty(shape, dtype=getattr(torch, dtype.split(".")[-1]), device="meta")
                      for shape, dtype in metas]  # fmt: skip
            try:
                spec = family.spec_for(*inputs, **json.loads(constants))
            except UnsupportedWorkload as exc:
                spec, reason = None, str(exc)
            if spec is not None:
                resolver = _Resolver(self.db, self.tune, self.budget, self.strategy)
                found = resolver._resolve_workload(family, spec, mode, device)
                if isinstance(found[0], str):
                    reason = f"{found[0]}: {found[1]}"
                    if found[0] == "baseline wins" and self.max_slowdown > 0:
                        served, why = self._memory_trade(resolver, family, spec, mode, device, metas)
                        if served is not None:
                            decisions, reason = dispatch.encode_decisions([served], mode), ""
                            self.traded[key] = why
                        else:
                            reason += f"; its best candidate is not served for memory either: {why}"
                else:
                    decisions = dispatch.encode_decisions([found[1]], mode)
        if reason:
            self.reasons[key] = reason
            log.warning("kernelsmith's fused LM loss (%s) runs its PyTorch reference, with the logits, "
                        "for %s: %s", op, key, reason)  # fmt: skip
        elif key in self.traded:
            log.warning("kernelsmith's fused LM loss (%s) for %s: %s", op, key, self.traded[key])
        else:
            log.info("kernelsmith's fused LM loss serves a tuned %s kernel for %s", op, key)
        self.found[key] = decisions
        return decisions

    def _memory_trade(self, resolver: _Resolver, family: OpFamily, spec: OpSpec, mode: str, device: torch.device,
                      metas: tuple[Meta, ...]) -> tuple[DecisionRecord | None, str]:  # fmt: skip
        """``(the decision to carry, what it trades)`` for the best candidate of the baseline
        decision of ``spec``'s bucket when it may serve for memory (module docstring: "Memory for
        time"), else ``(None, why not)``. The decision carried is the stored one marked a kernel
        decision (only its variant, source hash and config travel in the decisions string)."""
        from kernelsmith import dispatch
        from kernelsmith.db import DatabaseError

        try:
            decision = resolver._decision(family, family.bucket(spec), mode)
        except DatabaseError as exc:
            return None, f"the database cannot be used: {exc}"
        if decision is None or not decision.variant:  # decide() keeps no candidate when none validated
            note = decision.metrics.get("note") if decision is not None else None
            return None, f"its decision has no candidate that passed validation ({note or 'none recorded'})"
        if not decision.servable:
            return None, f"its decision is an imported claim in state {decision.claim_state!r}, not servable here"
        carried = dataclasses.replace(decision, winner="kernel")
        if not dispatch.embeddable(carried, family):
            return None, f"its candidate {decision.variant!r} is not a built-in variant (not carried in decisions)"
        ratio = _time_ratio(decision.metrics)
        if ratio is None:
            return None, "its decision does not hold both the candidate's and the reference's median times"
        if ratio - 1 > self.max_slowdown:
            return None, (f"it takes {ratio:.2f}x the reference's time, beyond max_slowdown={self.max_slowdown:g} "
                          f"(at most {1 + self.max_slowdown:.2f}x)")  # fmt: skip
        checked = resolver._checked_runner(family, spec, carried, device)
        if isinstance(checked[0], str):
            return None, f"{checked[0]}: {checked[1]}"
        scratch = getattr(family, "scratch_bytes", None)
        kernel_scratch = f"; the kernel's scratch: {_mib(scratch(spec, Config(decision.config)))}" if scratch else ""
        return carried, (
            f"serves {decision.variant} {ratio:.2f}x the time of the PyTorch reference "
            f"({decision.metrics['median_us']:.1f} us vs {decision.metrics['baseline_median_us']:.1f} us, as the "
            f"decision measured; the baseline won on time), for not materializing {_logits_held(metas)}"
            f"{kernel_scratch} (max_slowdown={self.max_slowdown:g})"
        )


def _time_ratio(metrics: dict[str, Any]) -> float | None:
    """The candidate's median time over the reference's, as the decision measured them (the
    reference timed eagerly, as ``kernelsmith::kernel`` runs it: the op is opaque to
    ``torch.compile``); None when either is missing or not a positive finite number."""
    times = [metrics.get("median_us"), metrics.get("baseline_median_us")]
    if not all(isinstance(t, int | float) and math.isfinite(t) and t > 0 for t in times):
        return None
    return float(times[0]) / float(times[1])  # type: ignore[arg-type]


def _logits_held(metas: tuple[Meta, ...]) -> str:
    """What the reference materializes and the kernel does not, for ``(h, W, target[, b])``: the
    ``(T, V)`` logits in W's dtype and in float32 (``reference_loss``: ``F.linear(h, W).float()``;
    one tensor for a float32 head), and as much again for their gradients in the backward."""
    tokens, vocab = metas[0][0][0], metas[1][0][0]
    dtype = metas[1][1].split(".")[-1]
    element = getattr(torch, dtype).itemsize
    sizes = f"{_mib(tokens * vocab * element)} in {dtype}"
    if element != 4:
        sizes += f", {_mib(tokens * vocab * 4)} in float32"
    return f"the {tokens}x{vocab} logits ({sizes}, and as much again for their gradients)"


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


# The resolutions by (db, tune, budget, strategy), shared by every patched model: a workload is
# looked up, tuned and checked once per process (models of one size share their LM head's shapes).
_SHARED: dict[Options, _Decisions] = {}
_SHARED_LOCK = threading.Lock()


def _key(op: str, constants: str, metas: tuple[Meta, ...], device_type: str) -> str:
    """A call's resolution key (plain string joins: it is computed inside traced code too)."""
    shapes = ";".join("x".join(str(s) for s in shape) + ":" + dtype for shape, dtype in metas)
    return op + "|" + shapes + "|" + device_type + "|" + constants


@torch.compiler.assume_constant_result
def _resolved(options: Options, op: str, constants: str, metas: tuple[Meta, ...],
              device_type: str, device_index: int | None) -> str:  # fmt: skip
    """:meth:`_Decisions.resolve` for the options' resolutions. Its arguments are constants and
    its result is one too: Dynamo runs it while tracing (database, tuning workers, a check on fresh
    inputs: never traced) and puts the string in the graph, so no graph break."""
    device = torch.device(device_type, device_index) if device_index is not None else torch.device(device_type)
    return _SHARED[options].resolve(op, constants, metas, device)


# ---------------------------------------------------------------------------------------------
# The patch
# ---------------------------------------------------------------------------------------------


class _Patch:
    """The state of one patched model: its own forward and the decisions of its shapes."""

    def __init__(self, model: nn.Module, decisions: _Decisions) -> None:
        self.original = model.forward
        parameters = inspect.signature(self.original).parameters.values()
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        self.positional = [p.name for p in parameters if p.kind in positional]
        self.decisions = decisions
        self.softcap = getattr(model.config, "final_logit_softcapping", None)
        self.logged: set[str] = set()
        self.used: set[str] = set()  # the resolution keys of this model's calls

    def carried(self, inputs: list[torch.Tensor], op: str, constants: str) -> str:
        """The decisions this call carries (resolved once per key, shared with models patched alike)."""
        metas = tuple((tuple(int(s) for s in t.shape), str(t.dtype)) for t in inputs)
        device = inputs[0].device
        self.used.add(_key(op, constants, metas, device.type))
        return _resolved(self.decisions.options, op, constants, metas, device.type, device.index)

    def _unchanged(self, why: str) -> None:
        if why not in self.logged:
            self.logged.add(why)
            log.info("kernelsmith's fused LM loss is not used (the model's own forward runs): %s", why)

    def forward(self, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], skip_logits: bool | None) -> Any:
        # The call's arguments by name (a plain dict, which Dynamo traces; Signature.bind is not).
        arguments = dict(zip(self.positional, args, strict=False))
        arguments.update(kwargs)
        labels, shift_labels = arguments.get("labels"), arguments.get("shift_labels")
        if skip_logits is None:
            skip_logits = (
                model.training and torch.is_grad_enabled() and (labels is not None or shift_labels is not None)
            )
            if not skip_logits:
                return self.original(*args, **kwargs)
        elif not skip_logits:
            return self.original(*args, **kwargs)
        if labels is None and shift_labels is None:
            raise ValueError("skip_logits=True needs labels (or shift_labels): without them there is no loss")
        logits_to_keep = arguments.pop("logits_to_keep", 0)
        if not isinstance(logits_to_keep, int) or logits_to_keep != 0:
            self._unchanged("logits_to_keep is not 0")
            return self.original(*args, **kwargs)
        return_dict = arguments.pop("return_dict", None)  # (the base model's output is read by name)
        arguments.pop("labels", None)
        base: Any = model.model  # (checked by refusal(): a module, and an nn.Linear head)
        head: Any = model.lm_head
        outputs = base(**arguments)
        loss = causal_lm_loss(
            outputs.last_hidden_state, head.weight, labels, bias=head.bias, softcap=self.softcap,
            num_items_in_batch=arguments.get("num_items_in_batch"),
            ignore_index=arguments.get("ignore_index", IGNORE_INDEX), shift_labels=shift_labels,
            decisions=self.carried,
        )  # fmt: skip
        from transformers.modeling_outputs import CausalLMOutputWithPast

        fields = CausalLMOutputWithPast.__dataclass_fields__
        rest = {k: v for k, v in outputs.items() if k in fields and k not in ("loss", "logits")}
        result = CausalLMOutputWithPast(loss=loss, logits=None, **rest)
        return result.to_tuple() if return_dict is False else result


def fuse_lm_loss(
    model: nn.Module,
    *,
    tune: bool = True,
    budget: int = 8,
    strategy: str = "auto",
    db: Any = None,
    max_slowdown: float = DEFAULT_MAX_SLOWDOWN,
) -> nn.Module:
    """Patch ``model`` (a Hugging Face causal LM this module knows) so that its training calls
    with labels compute the loss without materializing the logits, and return ``logits=None``
    (see the module docstring for exactly when); returns ``model`` itself.

    ``tune``/``budget``/``strategy``/``db``: how the first call of each shape gets its kernel
    (a stored winner in ``db``, else one tuned within ``budget`` evaluations when ``tune``).
    ``max_slowdown``: where the baseline won on time, the decision's best candidate still serves
    (checked against float64 first) if it took at most ``1 + max_slowdown`` times the reference's
    time; 0: winners only. Default :data:`DEFAULT_MAX_SLOWDOWN` (0.5; the comment there says why);
    :func:`tradeoffs` lists where it served. A model this module does not know is returned
    unchanged, and the reason is logged (:func:`refusal`). :func:`unfuse_lm_loss` undoes the patch.
    A model already patched is returned as it is (unfuse it first to change its options)."""
    if not (isinstance(max_slowdown, int | float) and max_slowdown >= 0):  # (NaN fails >= too)
        raise ValueError(f"max_slowdown must be a number >= 0 (0: winners only), not {max_slowdown!r}")
    why = refusal(model)
    if why is not None:
        log.warning("kernelsmith.fuse_lm_loss leaves %s unchanged: %s", type(model).__name__, why)
        return model
    if hasattr(model, _ATTRIBUTE):
        return model
    options: Options = (str(db), tune, budget, strategy, float(max_slowdown))
    with _SHARED_LOCK:
        decisions = _SHARED.setdefault(options, _Decisions(db, tune, budget, strategy, float(max_slowdown)))
    patch = _Patch(model, decisions)

    @functools.wraps(patch.original)
    def forward(*args: Any, skip_logits: bool | None = None, **kwargs: Any) -> Any:
        return patch.forward(model, args, kwargs, skip_logits)

    setattr(model, _ATTRIBUTE, patch)
    model.forward = forward  # type: ignore[method-assign]
    return model


def is_fused(model: nn.Module) -> bool:
    """Whether :func:`fuse_lm_loss` patched ``model``."""
    return hasattr(model, _ATTRIBUTE)


def unfuse_lm_loss(model: nn.Module) -> nn.Module:
    """Undo :func:`fuse_lm_loss`: the model's own forward again (returns ``model``)."""
    if hasattr(model, _ATTRIBUTE):
        delattr(model, _ATTRIBUTE)
        del model.forward
    return model


def fallback_reasons(model: nn.Module) -> dict[str, str]:
    """Per call shape of this model's, why its loss ran the op's PyTorch reference (with the
    logits) instead of a kernel; empty when every shape has a kernel (or nothing ran yet)."""
    patch = getattr(model, _ATTRIBUTE, None)
    if patch is None:
        return {}
    return {key: why for key, why in patch.decisions.reasons.items() if key in patch.used}


def tradeoffs(model: nn.Module) -> dict[str, str]:
    """Per call shape of this model's where its loss is served by a kernel that lost to the
    reference on time but is within ``max_slowdown`` of it, what was traded (how much slower,
    for how many MiB not materialized); empty when every kernel served won (or nothing ran)."""
    patch = getattr(model, _ATTRIBUTE, None)
    if patch is None:
        return {}
    return {key: what for key, what in patch.decisions.traded.items() if key in patch.used}


__all__ = [
    "DEFAULT_MAX_SLOWDOWN",
    "KNOWN_CLASSES",
    "causal_lm_loss",
    "fallback_reasons",
    "fuse_lm_loss",
    "is_fused",
    "refusal",
    "tradeoffs",
    "unfuse_lm_loss",
]
