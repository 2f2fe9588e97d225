"""The LLM strategy's kernel-file example and the helpers it builds prompts and reads answers with.

Part of the LLM search strategy (:mod:`kernelsmith.strategies.llm`): :data:`KERNEL_EXAMPLE` is the
kernel file every prompt shows (tests check that it passes the gate and the harness); the helpers
load the answer schema, describe the hardware and past results, and map a proposed configuration
onto the nearest point of the op's space.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from numbers import Real
from typing import TYPE_CHECKING, Any

from kernelsmith.evaluate.protocol import Candidate, EvalResult
from kernelsmith.space import Config
from kernelsmith.spec import OpSpec
from kernelsmith.strategies._base import variant_label

if TYPE_CHECKING:
    from kernelsmith.ops import OpFamily


ERROR_CHARS = 240
# A kernel file, for the prompt; tests check that it passes the gate and the harness.
KERNEL_EXAMPLE = '''"""Doubles every element: one program per row."""

import triton
import triton.language as tl


@triton.jit
def _double_kernel(x_ptr, y_ptr, x_row_stride, y_row_stride, N, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * y_row_stride + cols, (2.0 * x).to(y_ptr.dtype.element_ty), mask=mask)


SPACE = {"num_warps": [1, 2, 4, 8]}

CONSTRAINTS = ["num_warps == 1 or 32 * num_warps <= next_power_of_two(N)"]

LAUNCH = {
    "kernel": "_double_kernel",
    "grid": ["rows"],
    "args": ["in0", "out0", "row_stride(in0)", "row_stride(out0)", "N"],
    "constexprs": {"BLOCK_N": "next_power_of_two(N)"},
    "num_warps": "num_warps",
}
'''


# ---- helpers ---------------------------------------------------------------------------------------
def _import_schema(sources: bool) -> type:
    try:
        from kernelsmith.llm.schema import ParamRound, Round
    except ImportError as exc:
        from kernelsmith.extras import missing

        raise ImportError(missing("the 'llm' strategy", "llm", "pydantic")) from exc
    return Round if sources else ParamRound


def _template(family: OpFamily | None) -> str | None:
    """The agent workspace's kernel file for ``family``, if it has one."""
    if family is None:
        return None
    from kernelsmith.agent.templates import template_source

    return template_source(family.name)


def _family(spec: OpSpec | None) -> OpFamily | None:
    if spec is None:
        return None
    from kernelsmith.ops import get_op

    try:
        return get_op(spec.op)
    except (KeyError, ValueError):
        return None


def _hardware(db: Any, fingerprint: str | None) -> str:
    if db is None or not fingerprint:
        return "unknown"
    try:
        fp = db.get_fingerprint(fingerprint)
        copy_gbps = db.get_ceiling(fingerprint, "copy_gbps")
    except Exception:  # the prompt says less rather than the search failing
        return "unknown"
    if fp is None:
        return "unknown"
    lines = [fp.describe()]
    if fp.mode == "interpreter":
        lines.append(
            "Kernels run in the Triton interpreter on the CPU: times are host-clock times, not GPU performance; "
            "use them to learn what builds and validates."
        )
    if copy_gbps:
        lines.append(f"Measured copy bandwidth (bytes read + written per second): {copy_gbps:.0f} GB/s")
    return "\n".join(lines)


def _tried_by_label(results: Iterable[EvalResult], proposed: Iterable[Candidate]) -> dict[str, int]:
    seen = {r.candidate for r in results} | set(proposed)
    counts: dict[str, int] = {}
    for c in seen:
        counts[variant_label(c)] = counts.get(variant_label(c), 0) + 1
    return counts


def _outcome(result: EvalResult) -> str:
    if result.ok:
        text = f"ok, {result.median_us:.2f} us"
        baseline = result.metrics.get("baseline_median_us")
        if baseline and result.median_us > 0:
            text += f" ({float(baseline) / result.median_us:.2f}x eager)"
        return text
    return f"{result.status}: {_line(result.error, ERROR_CHARS)}"


def _scalar_config(raw: Mapping[str, Any]) -> Config | None:
    """The proposal's config, or None when a value is not a JSON scalar (a Config must hash)."""
    if not isinstance(raw, Mapping):
        return None
    if not all(isinstance(v, str | int | float | bool) or v is None for v in raw.values()):
        return None
    return Config({str(k): v for k, v in raw.items()})


def _coerce(value: Any, values: Sequence[Any]) -> Any:
    """A proposed value as the space's own value when they mean the same (4.0 or "4" for 4)."""
    for v in values:
        if type(v) is type(value) and v == value:
            return v
    for v in values:
        if _number(v) and _number(value) and float(v) == float(value):
            return v
        if isinstance(value, str) and str(v) == value.strip():
            return v
    return value


def _number(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _position(values: Sequence[Any], value: Any) -> int | None:
    """Index of ``value`` in the ordered ``values``, or of the nearest number (log scale for
    positive numbers); None for a value that has no place on the axis."""
    for i, v in enumerate(values):
        if type(v) is type(value) and v == value:
            return i
    if not _number(value) or not values or not all(_number(v) for v in values):
        return None
    if value > 0 and all(v > 0 for v in values):
        return min(range(len(values)), key=lambda i: abs(math.log2(values[i] / value)))
    return min(range(len(values)), key=lambda i: abs(values[i] - value))


def _steps(values: Sequence[Any], have: Any, want: Any) -> float:
    i, j = _position(values, have), _position(values, want)
    if i is None or j is None:
        return 0.0 if have == want else 1.0
    return float(abs(i - j))


def _identifier(name: str) -> str:
    cleaned = "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in name.strip())
    return cleaned[:60]


def _json(value: Any) -> str:
    if isinstance(value, Config):
        value = value.to_dict()
    return json.dumps(value, sort_keys=isinstance(value, Mapping), default=str)


def _line(text: str, limit: int) -> str:
    """``text`` on one line, cut to ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _trim(text: str, limit: int, *, code: bool = False) -> str:
    """``text`` cut to ``limit`` characters, ending with a newline; prose is dedented as a docstring."""
    if not code:
        text = inspect.cleandoc(text) if text else ""
    if len(text) > limit:
        text = text[:limit] + "\n... (cut)"
    return text if text.endswith("\n") else text + "\n"
