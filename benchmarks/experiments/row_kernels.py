"""Experiment: what moves a one-row-per-program RMSNorm/softmax kernel toward copy bandwidth?

Compares, with triton.testing.do_bench (median, L2 flushed), the plain kernel against the same
kernel with cache-eviction hints and with the row width as a compile-time constant, at the
PERFORMANCE.md shapes. Prints a table; the findings feed the op modules' spaces.
"""

from __future__ import annotations

import itertools

import torch
import triton
import triton.language as tl
import triton.testing


@triton.jit
def _rms(x_ptr, w_ptr, y_ptr, stride, N, eps, BLOCK: tl.constexpr, EVICT: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    if EVICT:
        x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    else:
        x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    tl.store(y_ptr + row * stride + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax(x_ptr, y_ptr, stride, N, BLOCK: tl.constexpr, EVICT: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    if EVICT:
        x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf"), eviction_policy="evict_first")
    else:
        x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf"))
    x = x.to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * stride + cols, (e / tl.sum(e, axis=0)).to(y_ptr.dtype.element_ty), mask=mask)


def main() -> None:
    copy_src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    copy_dst = torch.empty_like(copy_src)
    copy_ms = triton.testing.do_bench(lambda: copy_dst.copy_(copy_src), return_mode="median")
    copy_gbps = 2 * (1 << 30) / (copy_ms * 1e-3) / 1e9
    print(f"copy {copy_gbps:.0f} GB/s (do_bench median, 1 GiB)")
    for (rows, n), op in itertools.product([(8192, 4096), (4096, 8192), (32768, 1024)], ["rmsnorm", "softmax"]):
        x = torch.randn(rows, n, dtype=torch.bfloat16, device="cuda")
        w = torch.randn(n, dtype=torch.bfloat16, device="cuda")
        y = torch.empty_like(x)
        nbytes = 2 * x.numel() * 2 + (n * 2 if op == "rmsnorm" else 0)
        best = []
        for warps, evict in itertools.product((2, 4, 8, 16), (False, True)):
            if op == "rmsnorm":
                fn = lambda: _rms[(rows,)](x, w, y, n, n, 1e-6, BLOCK=n, EVICT=evict, num_warps=warps)  # noqa: B023
            else:
                fn = lambda: _softmax[(rows,)](x, y, n, n, BLOCK=n, EVICT=evict, num_warps=warps)  # noqa: B023
            us = triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median") * 1000
            best.append((us, warps, evict))
        best.sort()
        cells = " ".join(f"w{w}{'E' if e else ''}={us:.1f}" for us, w, e in sorted(best, key=lambda b: (b[2], b[1])))
        us, w, e = best[0]
        print(f"{op:8} {rows}x{n:<6} best {us:6.1f} us {100 * nbytes / (us * 1e-6) / 1e9 / copy_gbps:5.1f}% "
              f"(warps {w}, evict {e}) | {cells}")


if __name__ == "__main__":
    main()
