"""Rotary position embedding in Triton. Semantics: ``..reference.rotary``.
One program rotates BLOCK_ROWS rows of x (a row: one position of one head; the three leading dimensions in any order),
both halves, in fp32. cos and sin are read per row through their strides (0 where they broadcast), so the model's
one [S, D] table serves every head and batch.
Inductor inlines that table's cos/sin into each head's rotation and computes them per element: 330 us for q and k
of Llama-3-8B's two layers at 2 x 2048 on an H200, 54 us here (docs/kernels.md, Rotary embedding).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..registry import implementation
from . import launch, on_device, traceable, unavailable_reason
from .access_analysis import writes

# Elements of one half per program: BLOCK_ROWS * BLOCK_HALF.
ELEMENTS = 2048


@writes("OUT")
@triton.jit
def _rotary_kernel(
    X,
    COS,
    SIN,
    OUT,
    R,
    H,
    S,
    HALF,
    sx_b,
    sx_h,
    sx_s,
    sx_d,
    sc_b,
    sc_h,
    sc_s,
    sc_d,
    ss_b,
    ss_h,
    ss_s,
    ss_d,
    so_b,
    so_h,
    so_s,
    so_d,
    TRANSPOSED: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_HALF)
    mask = (rows < R)[:, None] & (cols < HALF)[None, :]
    s = rows % S
    h = (rows // S) % H
    b = rows // (S * H)
    x = X + (b * sx_b + h * sx_h + s * sx_s)[:, None] + cols[None, :] * sx_d
    c = COS + (b * sc_b + h * sc_h + s * sc_s)[:, None] + cols[None, :] * sc_d
    n = SIN + (b * ss_b + h * ss_h + s * ss_s)[:, None] + cols[None, :] * ss_d
    x1 = tl.load(x, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x + HALF * sx_d, mask=mask, other=0.0).to(tl.float32)
    c1 = tl.load(c, mask=mask, other=0.0).to(tl.float32)
    c2 = tl.load(c + HALF * sc_d, mask=mask, other=0.0).to(tl.float32)
    s1 = tl.load(n, mask=mask, other=0.0).to(tl.float32)
    s2 = tl.load(n + HALF * ss_d, mask=mask, other=0.0).to(tl.float32)
    if TRANSPOSED:
        o1 = x1 * c1 + x2 * s2
        o2 = x2 * c2 - x1 * s1
    else:
        o1 = x1 * c1 - x2 * s1
        o2 = x2 * c2 + x1 * s2
    out = OUT + (b * so_b + h * so_h + s * so_s)[:, None] + cols[None, :] * so_d
    tl.store(out, o1.to(OUT.dtype.element_ty), mask=mask)
    tl.store(out + HALF * so_d, o2.to(OUT.dtype.element_ty), mask=mask)


@implementation("rotary", "triton", priority=20, unavailable_reason=unavailable_reason, traceable=traceable)
def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, transposed: bool) -> torch.Tensor:
    """See ``..reference.rotary.rotary``: 4-D x, cos and sin broadcast to it; out has x's layout."""
    B, H, S, D = x.shape
    out = torch.empty_like(x)
    rows, half = B * H * S, D // 2
    if rows == 0 or half == 0:
        return out
    cos, sin = cos.expand(x.shape), sin.expand(x.shape)
    block_half = triton.next_power_of_2(half)
    block_rows = max(1, ELEMENTS // block_half)
    with on_device(x.device):
        launch(_rotary_kernel)[(triton.cdiv(rows, block_rows),)](
            x,
            cos,
            sin,
            out,
            rows,
            H,
            S,
            half,
            *x.stride(),
            *cos.stride(),
            *sin.stride(),
            *out.stride(),
            TRANSPOSED=transposed,
            BLOCK_ROWS=block_rows,
            BLOCK_HALF=block_half,
            num_warps=4,
        )
    return out
