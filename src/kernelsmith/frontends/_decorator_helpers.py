"""The decorator's helpers: call keys, pinned-config checks, the output check, packing outputs.

Part of ``@kernelsmith.optimize`` (:mod:`kernelsmith.frontends.decorator`): the key a call is
cached under (:func:`_call_key`), the check of a pinned configuration before it is served
(:func:`_validate_pinned`), :func:`_differs_from_op`, which compares the function's own output
with the recognized op's before a match is trusted (the backend and the compiled front end use it
too), the tuning progress line, and how a kernel's outputs are packed into the function's return
value and back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from kernelsmith.db import DecisionRecord
from kernelsmith.evaluate import errors
from kernelsmith.frontends import compiled
from kernelsmith.ops import OpFamily
from kernelsmith.spec import OpSpec


def _call_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two calls the same workload: grad and autocast state, tensor metadata and the
    other arguments' values.

    Raises TypeError for unhashable non-tensor arguments (such calls are never cached). This
    runs on every call, so it is a plain loop (no generators; one helper, for autocast).
    """
    key: list[Any] = [torch.is_grad_enabled(), compiled.autocast_state()]
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


def _validate_pinned(family: OpFamily, bucket: OpSpec, config: dict[str, Any], mode: str) -> DecisionRecord | str:
    """A pinned config as a decision for ``bucket`` once it passed validation, else why not.

    The config names its variant (``"variant"``; default: the first whose space holds it), must
    be in that variant's space for the bucket, and passes :func:`kernelsmith.evaluate.validate.
    validate` (the tail shapes and value distributions every tuned candidate passes), here, in
    this process: the variant is the package's own code, not an untrusted candidate.
    """
    from kernelsmith.evaluate.validate import Rejected, validate
    from kernelsmith.space import Config

    values = dict(config)
    name = values.pop("variant", None)
    chosen = Config(values)
    variants = [family.variant(str(name))] if name is not None else list(family.variants)
    for variant in variants:
        problems = variant.space(bucket).violations(chosen)
        if not problems:
            break
    else:
        where = f"variant {name}" if name is not None else f"any {family.name} variant"
        return f"the pinned config {config} is not valid for {where} at {bucket.describe()}: {'; '.join(problems)}"
    device = "cuda" if mode == "gpu" else "cpu"
    synchronize = torch.cuda.synchronize if mode == "gpu" else (lambda: None)
    try:
        validate(family, bucket, variant.build, chosen, device, synchronize, variant.library_ops)
    except Rejected as exc:
        return f"the pinned config {config} failed validation at {bucket.describe()} ({exc.kind}): {exc}"
    except Exception as exc:  # a config that does not even build or launch is refused, not raised
        return f"the pinned config {config} failed at {bucket.describe()}: {type(exc).__name__}: {exc}"
    return DecisionRecord(
        "pinned", bucket.workload_hash, family.name, bucket.to_dict(), "kernel", variant.name, variant.source_hash,
        chosen.to_dict(), {"note": "pinned in code"}, origin="pinned",
    )


def _terminal_progress(title: str) -> Callable[[int, int, Any], None] | None:
    """A progress line on standard error while a first call tunes, when it is a terminal."""
    import sys

    stream = sys.stderr
    if not getattr(stream, "isatty", lambda: False)():
        return None

    def show(done: int, total: int, result: Any) -> None:
        end = "\n" if done >= total else ""
        stream.write(f"\r{title}: {done}/{total} candidates{end}")
        stream.flush()

    return show


def _differs_from_op(
    family: OpFamily,
    spec: OpSpec,
    inputs: tuple[torch.Tensor, ...],
    output: Any,
    returns: tuple[int | None, ...] | None = None,
) -> str | None:
    """None when ``output`` computes the op on ``inputs`` as well as PyTorch's own formulation:
    the op's first output, or with ``returns`` (a match's) the tuple of its outputs it describes."""
    outputs = _unpack(output, returns)
    if outputs is None:
        shape = "a tensor" if returns is None else f"a tuple of the op's outputs {returns}"
        return f"the function returned {type(output).__name__}, not {shape}"
    expected = family.output_specs(spec)
    if len(outputs) > len(expected):
        return f"the function returns {len(outputs)} of the op's outputs, which has {len(expected)}"
    for out, want in zip(outputs, expected, strict=False):
        if tuple(out.shape) != want.shape or out.dtype != want.torch_dtype:
            return f"output {tuple(out.shape)} {out.dtype} differs from {want}"
    with torch.no_grad():  # (the family's floors too: the function's output is judged as a kernel's)
        references = errors.references(family, spec, inputs)
        return references.problem(outputs, family.tolerance, references.lowp[: len(outputs)])


def _served(outputs: Sequence[Any], returns: tuple[int | None, ...] | None) -> Any:
    """What the function returns, from the op's outputs: the first, or the tuple ``returns`` says."""
    return outputs[0] if returns is None else _pack(outputs, returns)


def _pack(outputs: Sequence[Any], returns: tuple[int | None, ...]) -> tuple[Any, ...]:
    """The function's tuple from the op's outputs, as the match's ``returns`` describes it."""
    return tuple(None if i is None else outputs[i] for i in returns)


def _unpack(value: Any, returns: tuple[int | None, ...] | None) -> list[torch.Tensor] | None:
    """The op's outputs (in the op's order) in a function's return value, or None when the value
    is not of the shape ``returns`` describes (None: a single tensor, the op's first output)."""
    if returns is None:
        return [value] if isinstance(value, torch.Tensor) else None
    if not isinstance(value, tuple) or len(value) != len(returns):
        return None
    found: dict[int, torch.Tensor] = {}
    for index, element in zip(returns, value, strict=True):
        if index is None and element is None:
            continue
        if index is None or not isinstance(element, torch.Tensor):
            return None
        found[index] = element
    if sorted(found) != list(range(len(found))):
        return None
    return [found[i] for i in range(len(found))]


