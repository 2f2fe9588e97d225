"""Cross-entropy of logits against class indices (``F.cross_entropy``), in two launches.

Inputs ``in0 = logits`` ``(R, V)`` and ``in1 = target`` ``(R,)`` int64; output ``out0``: float32,
0-d for ``reduction="mean"``/``"sum"``, ``(R,)`` for ``"none"``. Constants ``ignore_index`` and
``label_smoothing`` (``eps``) are launch arguments; ``reduction`` picks a constexpr.

1. One program per row walks the vocabulary in ``BLOCK_V``-wide steps keeping a running max
   ``m`` and lane sums of ``exp(x - m)`` (rescaled when the max grows: the online softmax), and
   writes the row's loss ``log(s) + (1 - eps)(m - x[t]) + eps (m - mean(x))`` to the float32
   scratch ``losses``. An ignored row (``target == ignore_index``) reads no logits and loses 0; a
   target outside ``[0, V)`` gives NaN (never an out-of-bounds read).
2. One program adds the losses in a fixed order in float64 (deterministic bit for bit, rounded
   once) and divides by the number of non-ignored rows for "mean" (NaN when there is none), or
   copies them to the output for "none".
"""

import triton
import triton.language as tl

REDUCE_BLOCK = 1024  # rows per step of the reduction


@triton.jit
def _ce_row_kernel(
    x_ptr,
    t_ptr,
    loss_ptr,
    x_row_stride,
    n_cols,
    ignore_index,
    smoothing,
    BLOCK_V: tl.constexpr,  # columns per loop step
    SMOOTH: tl.constexpr,  # label_smoothing > 0: also sum the logits
    NUM_STAGES: tl.constexpr,  # software-pipelining depth of the loop
):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    target = tl.load(t_ptr + row)
    valid = target != ignore_index
    in_range = (target >= 0) & (target < n_cols)
    x_t = tl.load(x_row + tl.where(in_range, target, 0), mask=valid & in_range, other=float("nan"))
    x_t = x_t.to(tl.float32)

    cols = tl.arange(0, BLOCK_V)
    m = tl.full([], float("-inf"), tl.float32)
    lanes = tl.zeros([BLOCK_V], tl.float32)  # lane sums of exp(x - m)
    sx = tl.zeros([BLOCK_V], tl.float32)
    n_read = tl.where(valid, n_cols, 0)  # an ignored row reads nothing
    for start in tl.range(0, n_read, BLOCK_V, num_stages=NUM_STAGES):
        offs = start + cols
        mask = offs < n_cols
        x = tl.load(x_row + offs, mask=mask, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # no exp(-inf + inf)
        alpha = tl.where(m_new == m, 1.0, tl.exp(m - shift))
        lanes = lanes * alpha + tl.exp(x - shift)
        m = m_new
        if SMOOTH:
            sx += tl.where(mask, x, 0.0)
    s = tl.sum(lanes, axis=0)

    m = tl.where(valid, m, 0.0)
    s = tl.where(valid, s, 1.0)
    x_t = tl.where(valid, x_t, 0.0)
    log_s = tl.where(s == 1.0, 0.0, tl.log(s))  # exactly 0 for a confident, right row
    loss = log_s + (m - x_t)
    if SMOOTH:
        loss = log_s + (1.0 - smoothing) * (m - x_t) + smoothing * (m - tl.sum(sx, axis=0) / n_cols)
    tl.store(loss_ptr + row, tl.where(valid, loss, 0.0))


@triton.jit
def _ce_reduce_kernel(
    loss_ptr,
    t_ptr,
    out_ptr,
    n_rows,
    ignore_index,
    REDUCE: tl.constexpr,  # 0: copy the per-row losses ("none"); 1: their sum; 2: their mean
    BLOCK_R: tl.constexpr,
):
    offs0 = tl.arange(0, BLOCK_R)
    total = tl.zeros([BLOCK_R], tl.float64)
    count = tl.zeros([BLOCK_R], tl.int32)
    for start in tl.range(0, n_rows, BLOCK_R):
        offs = start + offs0
        mask = offs < n_rows
        losses = tl.load(loss_ptr + offs, mask=mask, other=0.0)
        if REDUCE == 0:
            tl.store(out_ptr + offs, losses, mask=mask)
        total += losses.to(tl.float64)
        target = tl.load(t_ptr + offs, mask=mask, other=ignore_index)
        count += (target != ignore_index).to(tl.int32)
    if REDUCE != 0:
        result = tl.sum(total, axis=0)
        if REDUCE == 2:
            n = tl.sum(count, axis=0)
            result = tl.where(n > 0, result / tl.maximum(n, 1).to(tl.float64), float("nan"))
        tl.store(out_ptr, result.to(tl.float32))


SPACE = {
    "BLOCK_V": [256, 512, 1024, 2048, 4096, 8192],
    "num_warps": [1, 2, 4, 8, 16],
    "num_stages": [1, 2, 3],
}

CONSTRAINTS = [
    "BLOCK_V <= max(256, next_power_of_two(N))",  # no block wider than the padded row
    "32 * num_warps <= BLOCK_V",  # every thread has work
    "BLOCK_V <= 32 * 32 * num_warps",  # at most 32 columns a thread
]

LAUNCH = [
    {
        "kernel": "_ce_row_kernel",
        "grid": ["rows"],
        "args": ["in0", "in1", "losses", "row_stride(in0)", "N", "ignore_index", "label_smoothing"],
        "constexprs": {"BLOCK_V": "BLOCK_V", "SMOOTH": "label_smoothing > 0", "NUM_STAGES": "num_stages"},
        "num_warps": "num_warps",
        "num_stages": "num_stages",
        "scratch": {"losses": {"shape": ["rows"], "dtype": "float32", "fill": 0.0}},
    },
    {
        "kernel": "_ce_reduce_kernel",
        "grid": [1],
        "args": ["losses", "in1", "out0", "rows", "ignore_index"],
        "constexprs": {
            "REDUCE": "0 if reduction == 'none' else (1 if reduction == 'sum' else 2)",
            "BLOCK_R": "min(REDUCE_BLOCK, next_power_of_two(rows))",
        },
        "num_warps": 4,
    },
]
