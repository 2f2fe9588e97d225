"""Which op family a profiled op or kernel serves, from its name.

Part of the profile stage (:mod:`kernelsmith.whole_model.profile`): ATen op names (CPU profiles),
Inductor's fused kernel names and library kernel names (GPU profiles) map to op families, and
:func:`tunable_families` says which of them kernelsmith has an op for. The profiler events are
turned into samples with these families, and the plan ranks them.
"""

from __future__ import annotations

import re
from collections.abc import Callable

# ---------------------------------------------------------------------------------------------
# Op families of CPU ops and of kernel names
# ---------------------------------------------------------------------------------------------

_OP_FAMILIES: dict[str, tuple[str, ...]] = {
    "matmul": (
        "mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "addmv", "mv", "dot", "einsum",
        "_addmm_activation", "_scaled_mm", "_int_mm", "tensordot",
    ),
    "conv": ("convolution", "_convolution", "conv1d", "conv2d", "conv3d", "cudnn_convolution", "mkldnn_convolution"),
    "attention": (
        "scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_attention_math",
        "_scaled_dot_product_fused_attention_overrideable", "_flash_attention_forward",
        "_efficient_attention_forward", "_cudnn_attention_forward",
    ),
    "layernorm": ("layer_norm", "native_layer_norm"),
    "rmsnorm": ("rms_norm", "_fused_rms_norm"),
    "norm": ("group_norm", "native_group_norm", "batch_norm", "native_batch_norm", "_batch_norm_impl_index"),
    "softmax": ("softmax", "_softmax"),
    "log_softmax": ("log_softmax", "_log_softmax"),
    "cross_entropy": ("cross_entropy_loss", "nll_loss", "nll_loss_nd", "nll_loss_forward", "nll_loss2d_forward"),
    "gelu": ("gelu",),
    "silu": ("silu",),
    "embedding": ("embedding", "embedding_bag", "_embedding_bag"),
    "copy": (
        "copy_", "to", "_to_copy", "contiguous", "clone", "cat", "stack", "repeat", "index_select", "gather",
        "index", "flip", "roll", "constant_pad_nd", "_unsafe_view",
    ),
    "fill": (
        "fill_", "zero_", "zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "new_zeros", "new_ones",
        "arange", "randn", "rand", "randint", "normal_", "uniform_",
    ),
    # No device work: on a CPU their self time is dispatch overhead; on a GPU they launch nothing.
    "view": (
        "view", "reshape", "_reshape_alias", "as_strided", "t", "transpose", "permute", "unsqueeze", "squeeze", "slice",
        "select", "expand", "split", "split_with_sizes", "chunk", "narrow", "unbind", "detach", "alias", "flatten",
        "unflatten", "resolve_conj", "resolve_neg", "lift_fresh", "view_as", "expand_as",
    ),
    "alloc": ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "resize_"),
    "reduction": (
        "sum", "mean", "max", "min", "amax", "amin", "var", "std", "var_mean", "std_mean", "norm", "linalg_vector_norm",
        "prod", "argmax", "argmin", "logsumexp", "all", "any", "cumsum",
    ),
    "elementwise": (
        "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "pow", "rsqrt", "sqrt", "exp", "log", "tanh",
        "sigmoid", "neg", "abs", "where", "masked_fill", "masked_fill_", "clamp", "clamp_", "relu", "relu_", "erf",
        "reciprocal", "square", "sin", "cos", "triu", "tril", "bitwise_not", "logical_not", "eq", "ne", "lt", "gt",
        "ge", "le", "minimum", "maximum", "lerp", "addcmul", "addcdiv", "hardtanh", "leaky_relu", "elu", "softplus",
        "dropout", "native_dropout", "rsub",
    ),
}
_OP_TABLE = {f"aten::{op}": family for family, ops in _OP_FAMILIES.items() for op in ops}


def op_family(op_name: str) -> str | None:
    """The family of a profiled CPU op (``aten::addmm`` -> ``matmul``), None for ops not listed.

    >>> op_family("aten::linear"), op_family("aten::_scaled_dot_product_flash_attention"), op_family("aten::t")
    ('matmul', 'attention', 'view')
    >>> op_family("cudaLaunchKernel") is None
    True
    """
    return _OP_TABLE.get(op_name)


# Inductor kernels: triton_{poi,red,per,tem,for,mix}_fused_<aten ops in alphabetical order>_<n>.
# The listed ops say which op family the fused kernel serves; checked in order.
_INDUCTOR = re.compile(r"^triton_(poi|red|per|tem|for|mix|spl)_(?:fused_)?(.*?)(?:_\d+)*$")
_INDUCTOR_RULES: list[tuple[str, Callable[[set[str], str], bool]]] = [
    ("matmul", lambda ops, text: bool(ops & {"mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "_int_mm"})),
    ("conv", lambda ops, text: "convolution" in text),
    ("attention", lambda ops, text: "attention" in text or "flex" in text or "sdpa" in text),
    ("layernorm", lambda ops, text: "layer_norm" in text or "var_mean" in text),
    ("rmsnorm", lambda ops, text: "rms_norm" in text or ("rsqrt" in ops and bool(ops & {"mean", "pow"}))),
    ("cross_entropy", lambda ops, text: "nll_loss" in text or "log_softmax" in text),
    ("softmax", lambda ops, text: "softmax" in text),
    ("gelu", lambda ops, text: "gelu" in text),
    ("gelu_tanh", lambda ops, text: {"tanh", "pow", "mul"} <= ops),
    ("swiglu", lambda ops, text: "silu" in ops and "mul" in ops),
    ("silu", lambda ops, text: "silu" in ops or {"sigmoid", "mul"} <= ops),
    ("rope", lambda ops, text: {"cat", "neg"} <= ops and "mul" in ops),
    ("embedding", lambda ops, text: "embedding" in text),
]
_INDUCTOR_KIND = {"poi": "elementwise", "red": "reduction", "per": "reduction", "for": "elementwise",
                  "mix": "reduction", "spl": "reduction", "tem": "matmul"}

# Library and ATen kernel names, checked in order (attention before matmul: memory-efficient
# attention kernels are CUTLASS kernels; conv before matmul: cuDNN convolutions are implicit GEMMs).
_KERNEL_RULES: list[tuple[str, re.Pattern[str]]] = [
    (family, re.compile(pattern, re.IGNORECASE))
    for family, pattern in (
        ("copy", r"^memcpy"),
        ("fill", r"^memset"),
        ("attention", r"flash|fmha|sdpa|attention|_attn|\bmha|xformers"),
        ("conv", r"conv(?!ert)|fprop|dgrad|wgrad|winograd|implicit_?gemm"),
        ("matmul", r"nvjet|gemm|cutlass|cublas|xmma|wgmma|splitkreduce|matmul|gemv|\bdot_kernel"),
        ("cross_entropy", r"nll_loss|cross_?entropy"),
        ("log_softmax", r"log_?softmax"),
        ("softmax", r"softmax"),
        ("rmsnorm", r"rms_?norm"),
        ("layernorm", r"layer_?norm|rowwisemoments|cuApplyLayerNorm"),
        ("norm", r"group_?norm|batch_?norm|batchnorm"),
        ("gelu_tanh", r"gelu.*tanh|tanh.*gelu"),
        ("gelu", r"gelu"),
        ("silu", r"silu|swish"),
        ("rope", r"rotary|\brope"),
        ("embedding", r"embedding|indexselect"),
        ("copy", r"copy|catarray|transpose|permute|contiguous"),
        ("fill", r"fill|zero"),
        ("reduction", r"reduce|reduction|welford|argmax|argmin"),
        ("elementwise", r"elementwise|pointwise|functor|unrolled|vectorized"),
    )
]


def kernel_family(name: str) -> str:
    """The op family a device kernel (or, on a CPU, an op) serves, read from its name alone.

    >>> kernel_family("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT")
    'matmul'
    >>> kernel_family("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0")
    'rmsnorm'
    >>> kernel_family("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>(Params)")
    'attention'
    """
    match = _INDUCTOR.match(name)
    if match:
        kind, fused = match.groups()
        ops = set(fused.split("_")) - {""}
        for family, rule in _INDUCTOR_RULES:
            if rule(ops, fused):
                return family
        return _INDUCTOR_KIND[kind]
    known = op_family(name)
    if known is not None:
        return known
    for family, pattern in _KERNEL_RULES:
        if pattern.search(name):
            return family
    return "other"


def tunable_families() -> frozenset[str]:
    """Families kernelsmith has op families (kernels to tune) for."""
    from kernelsmith.ops import op_names

    return frozenset(op_names())


