"""Matrix multiplication with fused epilogues: ``y = epilogue(x @ w.T + bias)`` in one kernel.

The op
------
``x`` of shape ``(..., K)`` (every leading dimension flattened into ``M`` rows) times a 2-D weight,
in one of two layouts (the constant ``layout``):

``"linear"`` (default)
    ``w`` is ``(N, K)``, as ``nn.Linear`` stores it: ``y = x @ w.T``, i.e. ``F.linear(x, w)``;
``"matmul"``
    ``w`` is ``(K, N)``: ``y = x @ w``.

The output is ``(..., N)`` in the input dtype. What happens to the product before it is stored is
the constant ``epilogue``, plus the constant ``bias`` (a ``(N,)`` vector added first, as
``F.linear(x, w, b)`` does):

============  ===============================================  =========================
epilogue      y (``h = x @ w.T`` plus the bias, if any)        inputs
============  ===============================================  =========================
``none``      ``h``                                            ``x, w[, bias]``
``gelu``      ``F.gelu(h)`` (exact, erf)                       ``x, w[, bias]``
``gelu_tanh`` ``F.gelu(h, approximate="tanh")``                ``x, w[, bias]``
``silu``      ``F.silu(h) = h * sigmoid(h)``                   ``x, w[, bias]``
``residual``  ``h + r``, ``r`` shaped like the output          ``x, w[, bias], r``
``swiglu``    ``F.silu(x @ w1.T) * (x @ w3.T)`` (Llama's MLP)  ``x, w1, w3`` (no bias)
============  ===============================================  =========================

The command line's ``--epilogue bias`` is ``bias=True`` with ``epilogue="none"``, and the two may
be joined: ``--epilogue bias+gelu`` (GPT-2's and BERT's MLP), ``bias+residual``. ``swiglu`` runs
both products in one kernel, sharing every load of ``x``.

Precision
---------
float16 and bfloat16 tiles are multiplied on the tensor cores with float32 accumulation, as
cuBLAS does. float32 inputs are multiplied in float32 (``tl.dot(..., input_precision="ieee")``)
unless the user's PyTorch lets cuBLAS use TF32 (``torch.backends.cuda.matmul.allow_tf32``, or the
newer ``fp32_precision == "tf32"`` that ``torch.set_float32_matmul_precision("high")`` sets): then
the kernels use TF32 too. The setting is read when a spec is made and recorded as the constant
``allow_tf32`` (always False for 16-bit inputs, where it means nothing), so that it is part of the
workload, and the reference (:meth:`Matmul.reference`) runs under the recorded setting, in
whatever process computes it. The epilogue is computed in float32 on the accumulator and rounded
once, on the store; the PyTorch reference rounds the product first and the epilogue's result again,
so the kernels are a little more accurate than the baseline they are measured against.

The variants
------------
Every variant cuts the ``(M, N)`` output into ``BLOCK_M x BLOCK_N`` tiles and walks ``K`` in
``BLOCK_K`` steps (``tl.dot`` on each pair of tiles); they differ in how tiles meet programs:

``tiled``
    One program per output tile. Programs are numbered in *grouped* order (``GROUP_M``): ``GROUP_M``
    consecutive programs share a column of weight tiles and walk down ``GROUP_M`` row tiles before
    moving right, so the weight tiles they read are still in L2 (with ``GROUP_M = 1``, plain
    row-major order: each row of tiles reads the whole weight again).
``persistent``
    One program per multiprocessor, each walking tiles ``pid, pid + programs, ...`` in the same
    grouped order. ``FLATTEN`` asks the compiler to flatten the tile and K loops into one
    software-pipelined loop (``tl.range(flatten=True)``), so the next tile's loads overlap the
    current tile's epilogue.
``split_k``
    For small ``M`` (decoding, ``M`` = 1..64): there are too few output tiles to fill the GPU, so
    ``K`` is cut into ``SPLIT_K`` ranges, one program per (tile, range). Each writes its float32
    partial product to a ``(SPLIT_K, M, N)`` scratch buffer; a second kernel sums the partials in
    a fixed order (bitwise reproducible: no atomics) and applies the epilogue. Offered when
    ``M <= SPLIT_K_MAX_M``.
``tma``
    ``tiled`` with the ``x`` and weight tiles loaded by the Tensor Memory Accelerator through
    tensor descriptors (``triton.tools.tensor_descriptor.TensorDescriptor``, made on the host at
    each call): one bulk copy a tile, zeros past the tensors' ends (no masks, no modulo). Its space
    is empty unless the installed Triton has tensor descriptors and the GPU is a Hopper or newer
    (or kernels run in the interpreter), and unless rows are 16-byte aligned (``K``, and ``N`` for
    layout ``"matmul"``, a multiple of 16 bytes). A call whose ``x`` or weight storage does not
    start on a 16-byte boundary (a view into a larger tensor) runs the ``tiled`` kernel with the
    same config instead.

Rows past ``M`` and columns past ``N`` are read at ``row % M`` and ``col % N`` (valid addresses,
no mask in the inner loop) and masked on the store; when ``N`` or ``K`` is a multiple of its
block (compile-time flags ``EVEN_N``, ``EVEN_K``, known from the spec) the modulo or the ``K`` mask
disappears. Row offsets are 64-bit.

Spaces, buckets and validation
------------------------------
Parameters are ``BLOCK_M``, ``BLOCK_N``, ``BLOCK_K``, ``GROUP_M``, ``num_warps``, ``num_stages``
(plus ``FLATTEN`` or ``SPLIT_K``). *Validity* constraints depend on the dtype, ``N``, ``K`` and the
epilogue only: the float32 accumulators fit in registers (at most ``MAX_ACCUMULATORS_PER_THREAD``
a thread; SwiGLU has two), the ``num_stages`` pipelined tiles fit in shared memory
(``SHARED_MEMORY_BUDGET``), blocks no wider than the padded ``N`` and ``K``. *Pruning* constraints
also look at ``M`` (tiles taller than the padded ``M`` only compute masked rows; tiles under 64
rows or columns are for a small ``M`` or ``N``; ``GROUP_M > 1`` with one row of tiles changes
nothing; split-K for large ``M``): they shape the search, but
``build`` checks validity only, so a config tuned for ``M`` rows is correct, and accepted, for any
other row count: the validation tails (1, 7, 67 and ``M - 1`` rows, the ones below ``M``) and the
row counts of its bucket (``M`` rounded up to a power of two at fixed ``N`` and ``K``).

Testing without a GPU: the Triton interpreter's ``tl.dot`` multiplies bfloat16 *bit patterns* as
integers (it runs ``numpy.matmul`` on the raw 16-bit storage), so in interpreter mode, and only
there, bfloat16 tiles are widened to float32 before the dot (``UPCAST``): exact, and the same
arithmetic as the tensor cores' bfloat16 products with float32 accumulation.

Front doors: ``kernelsmith tune matmul --shape 8192x11008x4096 --epilogue bias+gelu``;
``@kernelsmith.optimize`` recognizes ``F.linear``, ``nn.Linear``, ``@`` and ``torch.matmul`` with
the epilogues above (:mod:`kernelsmith.frontends.patterns.matmul`). There is no backward family
yet: a call whose inputs require gradients runs as written.

Where the code is: this module holds the family (specs, buckets, the reference, inputs, the
roofline model); the kernels are in :mod:`kernelsmith.ops._matmul_kernels`, the geometry, spaces
and launchers in :mod:`kernelsmith.ops._matmul_launch`.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from kernelsmith.ops._base import OpFamily, Tolerance, UnsupportedWorkload, Variant, generator
from kernelsmith.ops._matmul_kernels import (
    EPI_GELU,
    EPI_GELU_TANH,
    EPI_NONE,
    EPI_RESIDUAL,
    EPI_SILU,
    EPI_SWIGLU,
    EPILOGUES,
)
from kernelsmith.ops._matmul_kernels import INTERPRETED as INTERPRETED  # (re-exported: linear_cross_entropy)
from kernelsmith.ops._matmul_kernels import _dot as _dot  # (re-exported: linear_cross_entropy)
from kernelsmith.ops._matmul_launch import SHARED_MEMORY_BUDGET as SHARED_MEMORY_BUDGET  # (re-exported)
from kernelsmith.ops._matmul_launch import (
    _geometry,
    _persistent_build,
    _persistent_space,
    _split_k_build,
    _split_k_space,
    _tiled_build,
    _tiled_space,
    _tma_build,
    _tma_space,
)
from kernelsmith.space import next_power_of_two
from kernelsmith.spec import OpSpec, TensorSpec, dtype_name

LAYOUTS = ("linear", "matmul")

# =================================================================================================
# Precision setting
# =================================================================================================


def tf32_allowed() -> bool:
    """Whether PyTorch currently lets cuBLAS multiply float32 matrices in TF32.

    Newer PyTorch (2.9+) keeps the setting in ``torch.backends.cuda.matmul.fp32_precision``
    (``"tf32"``, ``"ieee"``, or ``"none"``: the default, IEEE); reading the legacy
    ``allow_tf32`` raises there once a program has mixed the two APIs, so the new one is read
    first.
    """
    matmul = torch.backends.cuda.matmul
    precision = getattr(matmul, "fp32_precision", None)
    if isinstance(precision, str):
        return precision == "tf32"
    return bool(matmul.allow_tf32)  # pragma: no cover - PyTorch before 2.9


@contextlib.contextmanager
def matmul_precision(allow_tf32: bool) -> Iterator[None]:
    """Run the block with cuBLAS's float32 matmul precision set as recorded in a spec; nothing is
    touched when it already is (in the user's own process it normally is)."""
    if tf32_allowed() == allow_tf32:
        yield
        return
    matmul = torch.backends.cuda.matmul
    if isinstance(getattr(matmul, "fp32_precision", None), str):
        previous = matmul.fp32_precision
        matmul.fp32_precision = "tf32" if allow_tf32 else "ieee"
        try:
            yield
        finally:
            matmul.fp32_precision = previous
    else:  # pragma: no cover - PyTorch before 2.9
        old = matmul.allow_tf32
        matmul.allow_tf32 = allow_tf32
        try:
            yield
        finally:
            matmul.allow_tf32 = old


# =================================================================================================
# The op family
# =================================================================================================

# What a variant's source hash covers besides its build's module (_matmul_launch): the kernels,
# the activations they call (kernelsmith.ops.gelu) and this module (the constants and the reference
# the variants are validated against), so that a change in any of them invalidates stored decisions.
_MODULES = ("kernelsmith.ops._matmul_kernels", "kernelsmith.ops.gelu", "kernelsmith.ops._elementwise", __name__)


def epilogue_tokens(epilogue: str) -> list[str]:
    """The parts of an epilogue name joined by ``+``, ``,`` or spaces, lower-cased:
    ``"Bias+GELU"`` is ``["bias", "gelu"]``."""
    return [t for t in re.split(r"[+,\s]+", epilogue.strip().lower()) if t]


def parse_epilogue(epilogue: Any = "none", bias: Any = None) -> tuple[str, bool]:
    """``(epilogue, bias)`` from an epilogue name that may include ``bias``: ``"bias"`` is
    ``("none", True)``, ``"bias+gelu"`` (or ``"bias,gelu"``) ``("gelu", True)``.

    >>> parse_epilogue("bias+gelu")
    ('gelu', True)
    >>> parse_epilogue("residual", bias=True)
    ('residual', True)
    """
    if not isinstance(epilogue, str):
        raise UnsupportedWorkload(f"matmul: epilogue must be a string such as 'bias+gelu', not {epilogue!r}")
    if bias is not None and not isinstance(bias, bool):
        raise UnsupportedWorkload(f"matmul: bias must be true or false, not {bias!r}")
    tokens = epilogue_tokens(epilogue)
    named_bias = "bias" in tokens
    if named_bias and bias is False:
        raise UnsupportedWorkload(f"matmul: epilogue {epilogue!r} names a bias but bias=False")
    rest = [t for t in tokens if t != "bias"]
    if len(rest) > 1:
        raise UnsupportedWorkload(f"matmul: one epilogue at a time besides the bias, not {rest}")
    name = rest[0] if rest else "none"
    if name not in EPILOGUES:
        raise UnsupportedWorkload(f"matmul: epilogue must be bias or one of {EPILOGUES} (or bias+...), not {name!r}")
    has_bias = named_bias or bool(bias)
    if has_bias and name == "swiglu":
        raise UnsupportedWorkload("matmul: the swiglu epilogue takes no bias")
    return name, has_bias


_SUPPORTED_TORCH_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class Matmul(OpFamily):
    name = "matmul"
    summary = ("y = epilogue(x @ w.T + bias) (or x @ w), the epilogue fused: none, gelu, gelu_tanh, silu, "
               "residual add, or swiglu (silu(x @ w1.T) * (x @ w3.T))")  # fmt: skip
    shape_help = (
        "MxNxK: x (M, K) times a weight (N, K) as nn.Linear stores it (layout=linear, the default) or "
        "(K, N) (layout=matmul); more leading sizes are batch dims of x (4x2048x11008x4096 is x "
        "(4, 2048, 4096)); --epilogue bias|gelu|silu|residual|swiglu, or bias+gelu"
    )
    distributions = ("normal", "wide", "outliers")
    tolerance = Tolerance()
    variants = (
        Variant("tiled", "one program per BLOCK_M x BLOCK_N output tile, grouped order (GROUP_M) for L2 reuse",
                _tiled_space, _tiled_build, _MODULES),
        Variant("persistent", "one program per multiprocessor walking the tiles (FLATTEN: one pipelined loop)",
                _persistent_space, _persistent_build, _MODULES),
        Variant("split_k", "small M: K cut into SPLIT_K ranges, float32 partials summed in order by a "
                "second kernel with the epilogue", _split_k_space, _split_k_build, _MODULES),
        Variant("tma", "tiled, the x and weight tiles loaded through tensor descriptors (Hopper+; empty "
                "space elsewhere)", _tma_space, _tma_build, _MODULES),
    )  # fmt: skip

    # ---- specs -----------------------------------------------------------------------------------
    def spec(
        self,
        shape: tuple[int, ...],
        dtype: str,
        layout: str = "linear",
        epilogue: str = "none",
        bias: bool | None = None,
        allow_tf32: bool | None = None,
        **constants: Any,
    ) -> OpSpec:
        """``shape`` is ``(..., M, N, K)``: x ``(..., M, K)``; the weight ``(N, K)`` or ``(K, N)``.

        >>> [str(t) for t in OP.spec((8192, 11008, 4096), "bf16", epilogue="bias+gelu").inputs]
        ['8192x4096:bfloat16', '11008x4096:bfloat16', '11008:bfloat16']
        """
        if constants:
            raise UnsupportedWorkload(f"matmul: unknown constants {sorted(constants)}")
        shape = tuple(int(s) for s in shape)
        if len(shape) < 3 or any(s <= 0 for s in shape):
            raise UnsupportedWorkload(f"matmul: the shape is M x N x K (positive sizes), not {shape}")
        *lead, n, k = shape
        name = dtype_name(dtype)
        epilogue, has_bias = parse_epilogue(epilogue, bias)
        consts = self._constants(layout, epilogue, has_bias, allow_tf32, name)
        x = TensorSpec((*lead, k), name)
        w = TensorSpec((n, k) if layout == "linear" else (k, n), name)
        inputs = [x, w]
        if epilogue == "swiglu":
            inputs.append(w)
        if has_bias:
            inputs.append(TensorSpec((n,), name))
        if epilogue == "residual":
            inputs.append(TensorSpec((*lead, n), name))
        spec = OpSpec(self.name, tuple(inputs), consts)
        self.check_supported(spec)
        return spec

    def spec_for(
        self,
        *inputs: torch.Tensor,
        layout: str = "linear",
        epilogue: str = "none",
        bias: bool | None = None,
        allow_tf32: bool | None = None,
        **constants: Any,
    ) -> OpSpec:
        """The spec of ``(x, w[, w3][, bias][, residual])``; with ``bias`` not given, a tensor more
        than the epilogue needs is the bias (``spec_for(x, w, b)`` is ``F.linear(x, w, b)``)."""
        if constants:
            raise UnsupportedWorkload(f"matmul: unknown constants {sorted(constants)}")
        if not all(isinstance(t, torch.Tensor) for t in inputs):
            raise UnsupportedWorkload("matmul takes tensors only")
        name, has_bias = parse_epilogue(epilogue, bias)
        needed = 2 + (name == "swiglu") + (name == "residual")
        if bias is None and "bias" not in epilogue.lower() and len(inputs) == needed + 1 and name != "swiglu":
            has_bias = True
        if len(inputs) != needed + has_bias:
            raise UnsupportedWorkload(
                f"matmul with epilogue {name!r}{' and a bias' if has_bias else ''} takes {needed + has_bias} "
                f"tensors, not {len(inputs)}"
            )
        for t in inputs:
            if t.dtype not in _SUPPORTED_TORCH_DTYPES:
                raise UnsupportedWorkload(f"matmul: dtype {t.dtype} is not supported")
        if inputs[0].dim() < 1 or inputs[0].numel() == 0:
            raise UnsupportedWorkload("matmul: x must be a non-empty tensor of at least one dimension")
        consts = self._constants(layout, name, has_bias, allow_tf32, dtype_name(inputs[0].dtype))
        spec = OpSpec(self.name, tuple(TensorSpec.of(t) for t in inputs), consts)
        self.check_supported(spec)
        return spec

    @staticmethod
    def _constants(layout: Any, epilogue: str, has_bias: bool, allow_tf32: Any, dtype: str) -> dict[str, Any]:
        if layout not in LAYOUTS:
            raise UnsupportedWorkload(f"matmul: layout must be one of {LAYOUTS}, not {layout!r}")
        if allow_tf32 is not None and not isinstance(allow_tf32, bool):
            raise UnsupportedWorkload(f"matmul: allow_tf32 must be true or false, not {allow_tf32!r}")
        if allow_tf32 and dtype != "float32":
            raise UnsupportedWorkload(f"matmul: allow_tf32 is for float32 inputs, not {dtype}")
        # 16-bit inputs are multiplied exactly: TF32 does not apply to them.
        tf32 = dtype == "float32" and (tf32_allowed() if allow_tf32 is None else allow_tf32)
        return {"layout": layout, "epilogue": epilogue, "bias": has_bias, "allow_tf32": tf32}

    def check_supported(self, spec: OpSpec) -> None:
        super().check_supported(spec)  # dtypes, contiguity
        consts = dict(spec.constants)
        if set(consts) != {"layout", "epilogue", "bias", "allow_tf32"}:
            raise UnsupportedWorkload(f"matmul: constants {sorted(consts)} are not layout, epilogue, bias, allow_tf32")
        epilogue, has_bias = parse_epilogue(consts["epilogue"], consts["bias"])
        if epilogue != consts["epilogue"] or consts["layout"] not in LAYOUTS:
            raise UnsupportedWorkload(f"matmul: bad constants {consts}")
        needed = 2 + (epilogue == "swiglu") + has_bias + (epilogue == "residual")
        if len(spec.inputs) != needed:
            raise UnsupportedWorkload(f"matmul: {spec.describe()} needs {needed} inputs")
        x, w = spec.inputs[0], spec.inputs[1]
        if not x.shape or x.numel == 0:
            raise UnsupportedWorkload(f"matmul: x {x} must be non-empty, of at least one dimension")
        if len(w.shape) != 2:
            raise UnsupportedWorkload(f"matmul: the weight {w} must be 2-D")
        k = x.shape[-1]
        n, w_k = (w.shape[0], w.shape[1]) if consts["layout"] == "linear" else (w.shape[1], w.shape[0])
        if w_k != k:
            want = "(N, K)" if consts["layout"] == "linear" else "(K, N)"
            raise UnsupportedWorkload(f"matmul: x {x} and weight {w} do not fit: layout {consts['layout']} "
                                      f"wants the weight {want} with K = {k}")  # fmt: skip
        weight = TensorSpec(w.shape, x.dtype)
        expected = [x, weight] + ([weight] if epilogue == "swiglu" else [])
        expected += [TensorSpec((n,), x.dtype)] if has_bias else []
        expected += [TensorSpec((*x.shape[:-1], n), x.dtype)] if epilogue == "residual" else []
        for got, wanted in zip(spec.inputs, expected, strict=True):
            if got.shape != wanted.shape or got.dtype != wanted.dtype:
                raise UnsupportedWorkload(f"matmul: input {got} should be {wanted} in {spec.describe()}")
        if consts["allow_tf32"] and x.dtype != "float32":
            raise UnsupportedWorkload("matmul: allow_tf32 is for float32 inputs only")

    def output_specs(self, spec: OpSpec) -> tuple[TensorSpec, ...]:
        x = spec.inputs[0]
        return (TensorSpec((*x.shape[:-1], _geometry(spec).n), x.dtype),)

    def small_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """M capped at 32, N and K at 128: a few tiles, seconds in the interpreter."""
        *lead, n, k = shape
        return (min(math.prod(lead), 32), min(n, 128), min(k, 128))

    def _with_rows(self, spec: OpSpec, m: int) -> OpSpec:
        """The spec with x flattened to (m, K) and the residual, if any, to (m, N)."""
        g = _geometry(spec)
        x = spec.inputs[0]
        inputs = [x.with_shape((m, g.k)), *spec.inputs[1:]]
        if g.epilogue == EPI_RESIDUAL:
            inputs[-1] = inputs[-1].with_shape((m, g.n))
        return OpSpec(spec.op, tuple(inputs), dict(spec.constants))

    def bucket(self, spec: OpSpec) -> OpSpec:
        """M rounded up to a power of two at the same N and K (x flattened to 2-D): a config is
        correct for every M (see the module docstring), only its speed was measured at the top."""
        m = _geometry(spec).m
        return self._with_rows(spec, next_power_of_two(m)) if len(spec.inputs[0].shape) > 1 else spec

    def validation_specs(self, spec: OpSpec) -> list[OpSpec]:
        """The target, then 1, 7, 67 and M - 1 rows (those below M) at the same N and K: partial
        row tiles of every height, and the specializations of M = 1."""
        m = _geometry(spec).m
        tails = sorted({t for t in (1, 7, 67, m - 1) if 1 <= t < m})
        return [spec] + [self._with_rows(spec, t) for t in tails]

    # ---- math ------------------------------------------------------------------------------------
    def _compute(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        """The epilogue applied to the product as a user writes it, in the inputs' dtype."""
        epilogue, has_bias = spec.const("epilogue"), spec.const("bias")
        x, w = inputs[0], inputs[1]
        rest = list(inputs[2:])
        w3 = rest.pop(0) if epilogue == "swiglu" else None
        b = rest.pop(0) if has_bias else None
        residual = rest.pop(0) if epilogue == "residual" else None

        def product(weight: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
            if spec.const("layout") == "linear":
                return F.linear(x, weight, b)
            h = torch.matmul(x, weight)
            return h if b is None else h + b

        if epilogue == "swiglu":
            assert w3 is not None
            return F.silu(product(w, None)) * product(w3, None)
        h = product(w, b)
        if epilogue == "gelu":
            return F.gelu(h)
        if epilogue == "gelu_tanh":
            return F.gelu(h, approximate="tanh")
        if epilogue == "silu":
            return F.silu(h)
        if epilogue == "residual":
            assert residual is not None
            return h + residual
        return h

    def reference(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """The PyTorch expression in the inputs' dtype, under the spec's float32 precision
        (``allow_tf32``): ``F.linear`` (or ``torch.matmul``) and the epilogue as written."""
        if spec.inputs[0].dtype != "float32":  # the setting is for float32 only: spare its ~1 us
            return (self._compute(spec, inputs),)
        with matmul_precision(bool(spec.const("allow_tf32"))):
            return (self._compute(spec, inputs),)

    def reference_fp64(self, spec: OpSpec, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return (self._compute(spec, [t.double() for t in inputs]),)

    def make_inputs(
        self,
        spec: OpSpec,
        seed: int,
        distribution: str = "normal",
        device: str | torch.device = "cuda",
    ) -> tuple[torch.Tensor, ...]:
        """Inputs drawn in float32 on ``device`` and rounded to the dtype, deterministic in ``seed``.

        Weights are ``N(0, 1) / sqrt(K)`` (so that outputs are about N(0, 1) for normal x), the
        bias and the residual ``N(0, 1)``; x depends on ``distribution``:

        - ``normal``: ``N(0, 1)``, where GELU and SiLU bend;
        - ``wide``: ``8 * N(0, 1)``: saturated activations, outputs around +-8;
        - ``outliers``: ``N(0, 1)`` with one column in 16 (the same columns in every row) times
          20, as the outlier features of large language models: a few products dominate each sum.
        """
        if distribution not in self.distributions:
            raise ValueError(f"matmul: unknown distribution {distribution!r} (known: {', '.join(self.distributions)})")
        g = _geometry(spec)
        dtype = spec.inputs[0].torch_dtype

        def draw(shape: tuple[int, ...], stream: int) -> torch.Tensor:
            return torch.randn(shape, generator=generator(seed ^ stream, device), device=device)

        x = draw(spec.inputs[0].shape, 0)
        if distribution == "wide":
            x = x * 8
        elif distribution == "outliers":
            columns = torch.arange(g.k, device=device) % 16 == (seed % 16)
            x = torch.where(columns, x * 20, x)
        weights = {1, 2} if g.epilogue == EPI_SWIGLU else {1}
        tensors = [x]
        for i, t in enumerate(spec.inputs[1:], start=1):
            scale = 1 / math.sqrt(g.k) if i in weights else 1.0
            tensors.append(draw(t.shape, 0x5EED * i) * scale)
        return tuple(t.to(dtype) for t in tensors)

    def flops(self, spec: OpSpec) -> int:
        """2 M N K a product (two for SwiGLU), plus the epilogue's few per output element."""
        g = _geometry(spec)
        per_output = {EPI_NONE: 0, EPI_GELU: 6, EPI_GELU_TANH: 11, EPI_SILU: 6, EPI_RESIDUAL: 1, EPI_SWIGLU: 7}
        return 2 * g.m * g.n * g.k * g.weights + g.m * g.n * (per_output[g.epilogue] + g.has_bias)


OP = Matmul()
