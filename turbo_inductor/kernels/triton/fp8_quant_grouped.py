"""Grouped transposed FP8 quantization in Triton: t [S, C] to t^T [C, S_pad] with a scale per group and column, each
group padded. Semantics: ``..reference.fp8_quant_grouped``.

One persistent launch over work items (group, block of BLOCK_COLS columns). A program walks its item's group rows
twice: the column maxima up from the group's end, then the cast down from its start, whose first reads come from L2
(the rows read last); it stores its columns of q_t from the group's padded start to the next group's, zeros past the
group's rows. Each program derives the padded layout from offs itself, so no launch size and no host value depends on
the group sizes.

The rowwise copy (``rowwise``) comes from ``fp8_quantize``'s one-pass row kernel. Its scale needs a whole row and the
transposed one a whole column of a group, so no program sees both before it casts: whichever kernel writes the rowwise
copy reads t once more, and the row kernel reads whole rows.

With ``rows`` the walk reads row ``rows[r]`` of t for the operand's row r: t's tokens gathered into expert order as
they are quantized, without a copy in that order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..reference.fp8_quant_grouped import PAD_ALIGN, check_args, check_rows_args, padded_columns
from ..registry import implementation
from . import launch, on_device, traceable, unavailable_reason
from .access_analysis import writes
from .fp8_quant import (
    MAX_TILE_ELEMENTS,
    TILE_ELEMENTS,
    abs_bits,
    format_constexprs,
    fp8_bits_of,
    num_warps_for,
    scale_from_amax,
)
from .fp8_quant import fp8_quantize as fp8_quantize_rows
from .fp8_transpose import _bounded_running_max, _padded_layout
from .grouped_mm import persistent_programs

# Launch heuristics: module constants, so that tests can shrink them and the GPU session can tune them.
# Rows per step of a program's walk down its group.
BLOCK_ROWS = 64
# Columns of t per work item: 64 bf16 are 128 contiguous bytes of each row (whole 32-byte sectors).
BLOCK_COLS = 64
NUM_WARPS = 4
# Programs per SM. The cast pass finds its rows in L2 only while the programs in flight read less than L2 holds, and
# at MoE sizes they read more: more programs hide more latency. On an H100 (bench_fp8_quant --moe), with the amax
# walk up, 8 ran within 2% of 4 at most Mixtral and Qwen3-MoE operands and 4-9% faster at the down projections' x;
# 2 ran slower at each.
PROGRAMS_PER_SM = 8
# Tiles in flight per program in each walk: the next ones load (cp.async) while one is reduced or cast. With few
# programs per SM, one 8 KB tile each left the walk waiting on memory.
STAGES = 3


@triton.jit
def _operand_tile(
    X,
    ROWS,
    ROW_MULTIPLIER,
    rows,
    end,
    cols64,
    col_in,
    stride_xs,
    stride_xc,
    HAS_ROWS: tl.constexpr,
    HAS_MULTIPLIER: tl.constexpr,
):
    """The operand's ``rows`` x ``cols64`` in fp32, 0 at rows from ``end`` on and outside ``col_in``: X's rows
    ROWS[rows] with HAS_ROWS (else the rows themselves), times ROW_MULTIPLIER[rows] with HAS_MULTIPLIER."""
    holds = rows < end
    source = tl.load(ROWS + rows, mask=holds, other=0) if HAS_ROWS else rows.to(tl.int64)
    x = tl.load(
        X + source[:, None] * stride_xs + cols64[None, :] * stride_xc, mask=holds[:, None] & col_in[None, :], other=0.0
    ).to(tl.float32)
    if HAS_MULTIPLIER:
        x = x * tl.load(ROW_MULTIPLIER + rows, mask=holds, other=0.0)[:, None]
    return x


@writes("PADDED_OFFS", "SCALE", "QT")
@triton.jit
def _grouped_transposed_kernel(
    X,
    ROWS,
    ROW_MULTIPLIER,
    QT,
    SCALE,
    PADDED_OFFS,
    OFFS,
    S,
    C,
    S_PAD,
    E,
    stride_xs,
    stride_xc,
    n_col_blocks,
    n_items,
    FORMAT: tl.constexpr,
    FMAX: tl.constexpr,
    POW2: tl.constexpr,
    FIX_NAN: tl.constexpr,
    NAN_BITS: tl.constexpr,
    HAS_ROWS: tl.constexpr,
    HAS_MULTIPLIER: tl.constexpr,
    ALIGN: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    STAGES: tl.constexpr,
):
    """Work item (g, column block), for items pid, pid + programs, ...: SCALE [E, C] row g, and QT [C, S_PAD]
    (contiguous) in those columns from the group's padded start to the next group's (for the last group, S_PAD);
    PADDED_OFFS[g] from the first column block. With HAS_ROWS, the operand's row r is X's row ROWS[r]; with
    HAS_MULTIPLIER, times ROW_MULTIPLIER[r]."""
    e = tl.arange(0, BLOCK_E)
    starts, ends, padded, padded_ends = _padded_layout(OFFS, E, S, BLOCK_E, ALIGN)
    for item in range(tl.program_id(0), n_items, tl.num_programs(0)):
        g = item // n_col_blocks
        cb = item % n_col_blocks
        mine = e == g
        start = tl.sum(tl.where(mine, starts, 0), 0)
        end = tl.sum(tl.where(mine, ends, 0), 0)
        padded_end = tl.sum(tl.where(mine, padded_ends, 0), 0)
        padded_start = padded_end - tl.sum(tl.where(mine, padded, 0), 0)
        # Multiples of ALIGN, said so (// ALIGN * ALIGN) for the compiler, which then stores q_t in 16-byte vectors.
        padded_start = padded_start // ALIGN * ALIGN
        stop = tl.where(g == E - 1, S_PAD, padded_end) // ALIGN * ALIGN
        tl.store(PADDED_OFFS + g, padded_end, mask=cb == 0)

        cols = cb * BLOCK_C + tl.arange(0, BLOCK_C)
        col_in = cols < C
        cols64 = cols.to(tl.int64)
        amax_bits = tl.zeros([BLOCK_C], dtype=tl.int32)  # maxima of |t| as bits (see .fp8_quant.abs_bits)
        steps = tl.cdiv(end - start, BLOCK_R)
        for step in tl.range(0, steps, num_stages=STAGES):
            # Up from the group's end: the cast walks down from its start, so its first rows are the last read.
            rows = start + (steps - 1 - step) * BLOCK_R + tl.arange(0, BLOCK_R)
            x = _operand_tile(
                X, ROWS, ROW_MULTIPLIER, rows, end, cols64, col_in, stride_xs, stride_xc, HAS_ROWS, HAS_MULTIPLIER
            )
            amax_bits = tl.maximum(amax_bits, tl.max(abs_bits(x), 0))
        scale = scale_from_amax(amax_bits.to(tl.float32, bitcast=True), FMAX, POW2)
        tl.store(SCALE + g.to(tl.int64) * C + cols64, scale, mask=col_in)
        for p0 in tl.range(padded_start, stop, BLOCK_R, num_stages=STAGES):
            p = p0 + tl.arange(0, BLOCK_R)
            rows = start + (p - padded_start)
            holds = (rows < end)[:, None]
            x = _operand_tile(
                X, ROWS, ROW_MULTIPLIER, rows, end, cols64, col_in, stride_xs, stride_xc, HAS_ROWS, HAS_MULTIPLIER
            )
            # The padding is +0 (0x00 in every FP8 format), also where a NaN scale would make 0 / scale NaN.
            bits = tl.where(holds, fp8_bits_of(x, scale[None, :], FORMAT, FMAX, FIX_NAN, NAN_BITS), 0)
            tl.store(QT + cols64[None, :] * S_PAD + p[:, None], bits, mask=(p < stop)[:, None] & col_in[None, :])


@implementation(
    "fp8_quantize_grouped", "triton", priority=20, unavailable_reason=unavailable_reason, traceable=traceable
)
def fp8_quantize_grouped(
    t: torch.Tensor,
    offs: torch.Tensor,
    fp8_dtype: torch.dtype,
    power_of_two: bool = False,
    rowwise: bool = False,
    rows: torch.Tensor | None = None,
    row_multiplier: torch.Tensor | None = None,
):
    """``(q_t, scale_t, padded_offs)``, with ``rowwise`` after ``(q, scale)``; see
    ``..reference.fp8_quant_grouped.fp8_quantize_grouped``."""
    check_args(t, offs, fp8_dtype, rows, rowwise, row_multiplier)
    (n_rows, cols), groups = (t.shape[0] if rows is None else rows.shape[0], t.shape[1]), offs.shape[0]
    s_pad = padded_columns(n_rows, groups)
    q_t = torch.empty((cols, s_pad), dtype=fp8_dtype, device=t.device)
    scale_t = torch.empty((groups, cols), dtype=torch.float32, device=t.device)
    padded_offs = torch.empty(groups, dtype=torch.int32, device=t.device)
    # At least one column block, whose items write the padded offsets where C is 0.
    n_col_blocks = max(triton.cdiv(cols, BLOCK_COLS), 1)
    n_items = groups * n_col_blocks
    with on_device(t.device):
        launch(_grouped_transposed_kernel)[(min(n_items, persistent_programs(t.device, PROGRAMS_PER_SM)),)](
            t,
            t if rows is None else rows.contiguous(),  # not read without HAS_ROWS
            t if row_multiplier is None else row_multiplier.contiguous(),  # nor this without HAS_MULTIPLIER
            q_t.view(torch.uint8),  # FP8 travels as raw bytes (see .fp8_formats)
            scale_t,
            padded_offs,
            offs,
            n_rows,
            cols,
            s_pad,
            groups,
            t.stride(0),
            t.stride(1),
            n_col_blocks,
            n_items,
            **format_constexprs(fp8_dtype, t.device, power_of_two),
            HAS_ROWS=rows is not None,
            HAS_MULTIPLIER=row_multiplier is not None,
            ALIGN=PAD_ALIGN,
            BLOCK_E=max(16, triton.next_power_of_2(groups)),
            BLOCK_R=BLOCK_ROWS,
            BLOCK_C=BLOCK_COLS,
            STAGES=STAGES,
            num_warps=NUM_WARPS,
        )
    transposed = (q_t, scale_t, padded_offs)
    if not rowwise:
        return transposed
    return (*fp8_quantize_rows(t, fp8_dtype, 1, max(cols, 1), False, power_of_two=power_of_two), *transposed)


# The grouped row kernel: a row of up to MAX_TILE_ELEMENTS columns is held in registers (one read of t); a longer one
# is walked twice in chunks of ROW_CHUNK columns, the second walk from L2.
ROW_CHUNK = 4096


@triton.jit
def _multiplied_rows(X, MULTIPLIER, rows64, group64, cols, mask, grouped, C, stride_xs, stride_xc):
    """x's ``rows64`` x ``cols`` in fp32 (0 outside ``mask``), times their groups' multipliers (1 past the groups)."""
    x = tl.load(X + rows64 * stride_xs + cols * stride_xc, mask=mask, other=0.0).to(tl.float32)
    return x * tl.load(MULTIPLIER + group64 * C + cols, mask=grouped & (cols < C), other=1.0).to(tl.float32)


@writes("Q", "SCALE")
@triton.jit
def _grouped_rows_kernel(
    X,
    MULTIPLIER,
    Q,
    SCALE,
    OFFS,
    S,
    C,
    E,
    stride_xs,
    stride_xc,
    FORMAT: tl.constexpr,
    FMAX: tl.constexpr,
    POW2: tl.constexpr,
    FIX_NAN: tl.constexpr,
    NAN_BITS: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    ONE_PASS: tl.constexpr,
):
    """BLOCK_R rows: each row r of group g times MULTIPLIER[g] ([E, C], contiguous), 1 past the last group, then
    SCALE[r] and Q's row r (contiguous). ONE_PASS: the row fits BLOCK_C; else two walks over it in BLOCK_C chunks."""
    e = tl.arange(0, BLOCK_E)
    in_e = e < E
    ends = _bounded_running_max(tl.load(OFFS + e, mask=in_e, other=0), S)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_in = rows < S
    group = tl.sum(tl.where(in_e[None, :] & (ends[None, :] <= rows[:, None]), 1, 0), 1)
    grouped = (group < E)[:, None]
    rows64, group64 = rows.to(tl.int64)[:, None], group.to(tl.int64)[:, None]
    scales = SCALE + rows.to(tl.int64)
    if ONE_PASS:
        cols = tl.arange(0, BLOCK_C)[None, :]
        mask = row_in[:, None] & (cols < C)
        x = _multiplied_rows(X, MULTIPLIER, rows64, group64, cols, mask, grouped, C, stride_xs, stride_xc)
        scale = scale_from_amax(tl.max(abs_bits(x), 1).to(tl.float32, bitcast=True), FMAX, POW2)
        tl.store(scales, scale, mask=row_in)
        tl.store(Q + rows64 * C + cols, fp8_bits_of(x, scale[:, None], FORMAT, FMAX, FIX_NAN, NAN_BITS), mask=mask)
    else:
        amax_bits = tl.zeros([BLOCK_R], dtype=tl.int32)  # maxima of |x| as bits (see .fp8_quant.abs_bits)
        for c0 in range(0, C, BLOCK_C):
            cols = c0 + tl.arange(0, BLOCK_C)[None, :]
            mask = row_in[:, None] & (cols < C)
            x = _multiplied_rows(X, MULTIPLIER, rows64, group64, cols, mask, grouped, C, stride_xs, stride_xc)
            amax_bits = tl.maximum(amax_bits, tl.max(abs_bits(x), 1))
        scale = scale_from_amax(amax_bits.to(tl.float32, bitcast=True), FMAX, POW2)
        tl.store(scales, scale, mask=row_in)
        for c0 in range(0, C, BLOCK_C):
            cols = c0 + tl.arange(0, BLOCK_C)[None, :]
            mask = row_in[:, None] & (cols < C)
            x = _multiplied_rows(X, MULTIPLIER, rows64, group64, cols, mask, grouped, C, stride_xs, stride_xc)
            bits = fp8_bits_of(x, scale[:, None], FORMAT, FMAX, FIX_NAN, NAN_BITS)
            tl.store(Q + rows64 * C + cols, bits, mask=mask)


@implementation(
    "fp8_quantize_grouped_rows", "triton", priority=20, unavailable_reason=unavailable_reason, traceable=traceable
)
def fp8_quantize_grouped_rows(
    t: torch.Tensor, offs: torch.Tensor, multiplier: torch.Tensor, fp8_dtype: torch.dtype, power_of_two: bool = False
):
    """``(q, scale)``; see ``..reference.fp8_quant_grouped.fp8_quantize_grouped_rows``."""
    check_rows_args(t, offs, multiplier, fp8_dtype)
    (rows, cols), groups = t.shape, offs.shape[0]
    q = torch.empty((rows, cols), dtype=fp8_dtype, device=t.device)
    scale = torch.empty((rows, 1), dtype=torch.float32, device=t.device)
    if rows == 0:
        return q, scale
    one_pass = triton.next_power_of_2(max(cols, 1)) <= MAX_TILE_ELEMENTS
    block_c = triton.next_power_of_2(max(cols, 1)) if one_pass else ROW_CHUNK
    # Rows per program as the one-pass row kernel of fp8_quantize groups them: tiles of about TILE_ELEMENTS.
    block_r = min(max(1, TILE_ELEMENTS // block_c), triton.next_power_of_2(rows))
    with on_device(t.device):
        launch(_grouped_rows_kernel)[(triton.cdiv(rows, block_r),)](
            t,
            multiplier.contiguous(),
            q.view(torch.uint8),  # FP8 travels as raw bytes (see .fp8_formats)
            scale,
            offs,
            rows,
            cols,
            groups,
            t.stride(0),
            t.stride(1),
            **format_constexprs(fp8_dtype, t.device, power_of_two),
            BLOCK_E=max(16, triton.next_power_of_2(groups)),
            BLOCK_R=block_r,
            BLOCK_C=block_c,
            ONE_PASS=one_pass,
            num_warps=num_warps_for(block_r * block_c),
        )
    return q, scale


__all__ = ["fp8_quantize_grouped", "fp8_quantize_grouped_rows"]
