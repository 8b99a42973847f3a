"""MoE token routing in Triton: the kernels of ``..reference.moe``. No atomics, no host sync.
``moe_route`` is a counting sort in one launch. ``moe_dispatch_fp8`` reads each token once, quantizes it with the FP8
producers' epilogue and stores it at its k rows. See docs/kernels.md, MoE routing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..registry import FP8_IN_ITS_PASS, implementation
from . import launch, on_device, traceable, unavailable_reason
from .access_analysis import writes
from .fp8_quant import format_constexprs, store_fp8_row_blocks

# Choices a routing program takes per step.
ROUTE_BLOCK = 1024
ROUTE_NUM_WARPS = 4
# Elements of one program's tile, k rows of BLOCK_H columns: 16 KiB of fp32 at 4 warps.
TILE_ELEMENTS = 4096
MIN_BLOCK_H = 64
NUM_WARPS = 4
# moe_dispatch_fp8: columns per program where the blocks are narrower than a row; the widest row quantized whole.
FP8_BLOCK_H = 1024
MAX_FP8_ROW = 16384


def priority(device: torch.device) -> int:
    """Above the reference on a GPU. Below it in the CPU interpreter, which is slow per element."""
    return -10 if device.type == "cpu" else 10


def _tile(k: int, hidden: int) -> tuple[int, int]:
    """``(K_PAD, BLOCK_H)`` for k choices of rows of ``hidden`` elements."""
    k_pad = triton.next_power_of_2(k)
    return k_pad, min(triton.next_power_of_2(hidden), max(MIN_BLOCK_H, TILE_ELEMENTS // k_pad))


@writes("POSITIONS", "ORDER", "OFFS")
@triton.jit
def _route_kernel(IDS, OFFS, ORDER, POSITIONS, S, E, BLOCK: tl.constexpr):
    """Program b sorts bucket b: expert b, or the sentinels for b = E.
    Its rows follow every lower bucket's; OFFS[b] is where they end."""
    b = tl.program_id(0)
    start = tl.zeros([], dtype=tl.int32)
    for first in range(0, S, BLOCK):
        i = first + tl.arange(0, BLOCK)
        ids = tl.load(IDS + i, mask=i < S, other=0)
        bucket = tl.where((ids >= 0) & (ids < E), ids, E)
        start += tl.sum(((bucket < b) & (i < S)).to(tl.int32), axis=0)
    row = start
    for first in range(0, S, BLOCK):
        i = first + tl.arange(0, BLOCK)
        ids = tl.load(IDS + i, mask=i < S, other=0)
        hit = (tl.where((ids >= 0) & (ids < E), ids, E) == b) & (i < S)
        count = hit.to(tl.int32)
        rank = row + tl.cumsum(count, axis=0) - 1
        tl.store(POSITIONS + i, rank.to(tl.int64), mask=hit)
        tl.store(ORDER + rank, i.to(tl.int64), mask=hit)
        row += tl.sum(count, axis=0)
    tl.store(OFFS + b, row, mask=b < E)


@writes("OUT", DOTS=lambda a: a["HAS_DOTS"])
@triton.jit
def _dispatch_kernel(
    SRC,
    POS,
    W,
    OTHER,
    OUT,
    DOTS,
    H,
    stride_src,
    stride_other,
    stride_out,
    K: tl.constexpr,
    K_PAD: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HAS_WEIGHTS: tl.constexpr,
    HAS_DOTS: tl.constexpr,
):
    """``OUT[POS[t, j]] = SRC[t] * W[t, j]``; ``DOTS[t, j] = sum_h SRC[t, h] * OTHER[POS[t, j], h]``.
    With DOTS, one program per token walks the whole row in order."""
    t = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, K_PAD)
    j_in = j < K
    pos = tl.load(POS + t * K + j, mask=j_in, other=0).to(tl.int64)
    if HAS_WEIGHTS:
        w = tl.load(W + t * K + j, mask=j_in, other=0.0).to(tl.float32)
    dots = tl.zeros([K_PAD], dtype=tl.float32)
    for start in range(tl.program_id(1) * BLOCK_H, H, tl.num_programs(1) * BLOCK_H):
        cols = start + tl.arange(0, BLOCK_H)
        col_in = cols < H
        x = tl.load(SRC + t * stride_src + cols, mask=col_in, other=0.0).to(tl.float32)
        rows = tl.zeros([K_PAD, BLOCK_H], dtype=tl.float32) + x[None, :]
        if HAS_WEIGHTS:
            rows = rows * w[:, None]
        tile_in = j_in[:, None] & col_in[None, :]
        tl.store(OUT + pos[:, None] * stride_out + cols[None, :], rows.to(OUT.dtype.element_ty), mask=tile_in)
        if HAS_DOTS:
            other = tl.load(OTHER + pos[:, None] * stride_other + cols[None, :], mask=tile_in, other=0.0)
            dots += tl.sum(other.to(tl.float32) * x[None, :], axis=1)
    if HAS_DOTS:
        tl.store(DOTS + t * K + j, dots, mask=j_in)


@writes("OUT")
@triton.jit
def _gather_sum_kernel(
    SRC,
    POS,
    W,
    OUT,
    H,
    stride_src,
    stride_out,
    K: tl.constexpr,
    K_PAD: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HAS_WEIGHTS: tl.constexpr,
):
    """``OUT[t, chunk] = sum_j SRC[POS[t, j], chunk] * W[t, j]``, in fp32."""
    t = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, K_PAD)
    j_in = j < K
    pos = tl.load(POS + t * K + j, mask=j_in, other=0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    col_in = cols < H
    rows = tl.load(SRC + pos[:, None] * stride_src + cols[None, :], mask=j_in[:, None] & col_in[None, :], other=0.0)
    rows = rows.to(tl.float32)
    if HAS_WEIGHTS:
        rows = rows * tl.load(W + t * K + j, mask=j_in, other=0.0).to(tl.float32)[:, None]
    tl.store(OUT + t * stride_out + cols, tl.sum(rows, axis=0).to(OUT.dtype.element_ty), mask=col_in)


@writes("Q", "SCALE")
@triton.jit
def _dispatch_fp8_kernel(
    X,
    POS,
    Q,
    SCALE,
    H,
    stride_x,
    n_scale_cols,
    K: tl.constexpr,
    BLOCK_H: tl.constexpr,
    QB: tl.constexpr,
    FORMAT: tl.constexpr,
    FMAX: tl.constexpr,
    POW2: tl.constexpr,
    FIX_NAN: tl.constexpr,
    NAN_BITS: tl.constexpr,
):
    """Token t's columns of chunk pid(1), read once, quantized in blocks of 1 x QB and stored at each of its K rows
    POS[t, :] with their scales. Each store recomputes the scales from the row in registers."""
    t = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    cols = chunk * BLOCK_H + tl.arange(0, BLOCK_H)
    col_in = cols < H
    x = tl.load(X + t * stride_x + cols, mask=col_in, other=0.0).to(tl.float32)[None, :]
    one = tl.arange(0, 1)
    first_block = chunk * (BLOCK_H // QB)
    for j in tl.static_range(K):
        row = tl.load(POS + t * K + j + one)
        store_fp8_row_blocks(
            x,
            Q,
            SCALE,
            row,
            cols,
            one == 0,
            col_in,
            H,
            n_scale_cols,
            first_block,
            1,
            BLOCK_H,
            QB,
            FORMAT,
            FMAX,
            POW2,
            FIX_NAN,
            NAN_BITS,
        )


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


@implementation("moe_route", "triton", priority=priority, unavailable_reason=unavailable_reason, traceable=traceable)
def moe_route(indices, num_experts):
    """See ``..reference.moe.moe_route``."""
    flat = indices.reshape(-1).contiguous()
    offs = flat.new_empty(num_experts, dtype=torch.int32)
    order = flat.new_empty(flat.shape[0], dtype=torch.int64)
    positions = flat.new_empty(flat.shape[0], dtype=torch.int64)
    if flat.shape[0]:
        with on_device(flat.device):
            launch(_route_kernel)[(num_experts + 1,)](
                flat, offs, order, positions, flat.shape[0], num_experts, BLOCK=ROUTE_BLOCK, num_warps=ROUTE_NUM_WARPS
            )
    else:
        offs.zero_()
    return offs, order, positions.view(indices.shape)


@implementation("moe_dispatch", "triton", priority=priority, unavailable_reason=unavailable_reason, traceable=traceable)
def moe_dispatch(src, positions, weights=None, other=None):
    """See ``..reference.moe.moe_dispatch``."""
    tokens, k = positions.shape
    hidden = src.shape[1]
    src, positions = _rows(src), positions.contiguous()
    weights = None if weights is None else weights.contiguous()
    other = None if other is None else _rows(other)
    out = src.new_empty((tokens * k, hidden))
    dots = src.new_empty((tokens, k), dtype=torch.float32) if other is not None else None
    k_pad, block_h = _tile(k, hidden)
    chunks = 1 if other is not None else triton.cdiv(hidden, block_h)
    if tokens and hidden:
        with on_device(src.device):
            launch(_dispatch_kernel)[(tokens, chunks)](
                src,
                positions,
                weights if weights is not None else src,  # not read without HAS_WEIGHTS
                other if other is not None else src,
                out,
                dots if dots is not None else out,
                hidden,
                src.stride(0),
                (other if other is not None else src).stride(0),
                out.stride(0),
                K=k,
                K_PAD=k_pad,
                BLOCK_H=block_h,
                HAS_WEIGHTS=weights is not None,
                HAS_DOTS=other is not None,
                num_warps=NUM_WARPS,
            )
    elif dots is not None:
        dots.zero_()
    return out, dots


@implementation(
    "moe_gather_sum", "triton", priority=priority, unavailable_reason=unavailable_reason, traceable=traceable
)
def moe_gather_sum(src, positions, weights, out_dtype):
    """See ``..reference.moe.moe_gather_sum``."""
    tokens, k = positions.shape
    hidden = src.shape[1]
    src, positions = _rows(src), positions.contiguous()
    weights = None if weights is None else weights.contiguous()
    out = src.new_empty((tokens, hidden), dtype=out_dtype)
    k_pad, block_h = _tile(k, hidden)
    if tokens and hidden:
        with on_device(src.device):
            launch(_gather_sum_kernel)[(tokens, triton.cdiv(hidden, block_h))](
                src,
                positions,
                weights if weights is not None else src,
                out,
                hidden,
                src.stride(0),
                out.stride(0),
                K=k,
                K_PAD=k_pad,
                BLOCK_H=block_h,
                HAS_WEIGHTS=weights is not None,
                num_warps=NUM_WARPS,
            )
    return out


def quantizes_rows(hidden: int, block_cols: int) -> bool:
    """Whether :func:`moe_dispatch_fp8` takes rows of ``hidden`` in blocks of 1 x ``block_cols``: power-of-two
    blocks, or one block per row that a program holds whole."""
    block = min(block_cols, hidden)
    return block & (block - 1) == 0 if block < hidden else triton.next_power_of_2(hidden) <= MAX_FP8_ROW


@implementation(
    "moe_dispatch_fp8",
    "triton",
    priority=priority,
    unavailable_reason=unavailable_reason,
    traceable=traceable,
    capabilities={FP8_IN_ITS_PASS: lambda width, element_size, block_cols: quantizes_rows(width, block_cols)},
)
def moe_dispatch_fp8(x, positions, fp8_dtype, block_cols, power_of_two=False):
    """See ``..reference.moe.moe_dispatch_fp8``."""
    tokens, k = positions.shape
    hidden = x.shape[1]
    if not quantizes_rows(hidden, block_cols):
        raise ValueError(
            f"turbo_inductor: moe_dispatch_fp8 (triton) takes no blocks of 1 x {block_cols} in rows of {hidden}"
        )
    x, positions = _rows(x), positions.contiguous()
    row_wide = block_cols >= hidden
    block_h = (
        triton.next_power_of_2(hidden)
        if row_wide
        else max(block_cols, min(FP8_BLOCK_H, triton.next_power_of_2(hidden)))
    )
    n_scale_cols = triton.cdiv(hidden, block_cols)
    q = x.new_empty((tokens * k, hidden), dtype=fp8_dtype)
    scale = x.new_empty((tokens * k, n_scale_cols), dtype=torch.float32)
    if tokens and hidden:
        with on_device(x.device):
            launch(_dispatch_fp8_kernel)[(tokens, triton.cdiv(hidden, block_h))](
                x,
                positions,
                q.view(torch.uint8),  # FP8 travels as raw bytes
                scale,
                hidden,
                x.stride(0),
                n_scale_cols,
                K=k,
                BLOCK_H=block_h,
                QB=block_h if row_wide else block_cols,
                **format_constexprs(fp8_dtype, x.device, power_of_two),
                num_warps=min(16, max(NUM_WARPS, block_h // 1024)),
            )
    return q, scale


__all__ = ["moe_route", "moe_dispatch", "moe_gather_sum", "moe_dispatch_fp8", "quantizes_rows"]
