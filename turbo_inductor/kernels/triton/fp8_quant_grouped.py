"""Grouped transposed FP8 quantization in Triton: t [S, C] to t^T [C, S_pad] with a scale per group and column, each
group padded, and with ``rowwise`` t's rowwise copy. Semantics: ``..reference.fp8_quant_grouped``.

Two launches over the same tiles: BLOCK_ROWS positions of the padded layout (q_t's columns) by BLOCK_COLS columns of
t. The first reads each tile once and folds its maxima into per-group column maxima (and with ``rowwise`` per-row
maxima) by atomic max on their bits; the second reads the tile again and casts it, to q_t and with ``rowwise`` to q.
t is read twice, each time by every SM at once in short tiles: a group's column maxima need all of its rows, which
no tile holds. Each program derives the padded layout from offs itself, so no launch size and no host value depends
on the group sizes.

With ``rows`` the tiles read row ``rows[r]`` of t for the operand's row r: t's tokens gathered into expert order as
they are quantized, without a copy in that order. With ``multiplier`` the rowwise copy is of each row times its
group's multiplier (``fp8_quantize_grouped_rows``), the dgrad's dy beside the wgrad's dy^T from the same reads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..reference.fp8_quant_grouped import PAD_ALIGN, check_args, check_rows_args, padded_columns
from ..registry import implementation
from . import launch, on_device, traceable, unavailable_reason
from .fp8_quant import (
    MAX_TILE_ELEMENTS,
    TILE_ELEMENTS,
    abs_bits,
    format_constexprs,
    fp8_bits_of,
    fp8_bits_times,
    num_warps_for,
    scale_from_amax,
)

# Launch heuristics: module constants, so that tests can shrink them and the GPU session can tune them.
# Positions of the padded layout per tile: 64 contiguous bytes of each row of q_t.
BLOCK_ROWS = 64
# Columns of t per tile: 64 bf16 are 128 contiguous bytes of each row.
BLOCK_COLS = 64
NUM_WARPS = 4

_MAXIMA, _CAST = 0, 1


@triton.jit
def _maximum(a, b):
    return tl.maximum(a, b)


@triton.jit
def _bounded_running_max(values, S):
    """Each group bound within [the previous one, S], as the reference bounds offs."""
    return tl.associative_scan(tl.minimum(tl.maximum(values, 0), S), 0, _maximum)


@triton.jit
def _pick(values, e, g):
    """values[g] of a vector over the groups ``e``."""
    return tl.sum(tl.where(e == g, values, 0), 0)


@triton.jit
def _grouped_tile_kernel(
    X,
    ROWS,
    MULTIPLIER,
    COLUMN_MAXIMA,
    ROW_MAXIMA,
    QT,
    SCALE_T,
    PADDED_OFFS,
    Q,
    SCALE,
    OFFS,
    S,
    C,
    S_PAD,
    E,
    stride_xs,
    stride_xc,
    PASS: tl.constexpr,
    FORMAT: tl.constexpr,
    FMAX: tl.constexpr,
    POW2: tl.constexpr,
    FIX_NAN: tl.constexpr,
    NAN_BITS: tl.constexpr,
    HAS_ROWS: tl.constexpr,
    ROWWISE: tl.constexpr,
    HAS_MULTIPLIER: tl.constexpr,
    ALIGN: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Tile (positions p0 + [0, BLOCK_R), columns of block program_id(1)). _MAXIMA: atomic max of the tile's |t| bits
    into COLUMN_MAXIMA [E, C] (zeros before) per group, with ROWWISE of |t times its multiplier| into ROW_MAXIMA [S].
    _CAST: QT [C, S_PAD] (contiguous) at these positions; the tile where a group's padded start lies writes its
    SCALE_T [E, C] row and, in the first column block, PADDED_OFFS[g]; with ROWWISE, Q [S, C] and SCALE [S] of the
    rows held. Positions past the last group's padded end hold the rows past its end, in order (ROWWISE only)."""
    # The padded layout, as the reference computes it: ends bounded within [previous end, S], then sizes rounded
    # up to a non-zero multiple of ALIGN and summed.
    e = tl.arange(0, BLOCK_E)
    in_e = e < E
    ends = _bounded_running_max(tl.load(OFFS + e, mask=in_e, other=0), S)
    starts = _bounded_running_max(tl.load(OFFS + e - 1, mask=in_e & (e > 0), other=0), S)
    padded = tl.where(in_e, tl.maximum(tl.cdiv(ends - starts, ALIGN), 1) * ALIGN, 0)
    padded_ends = tl.cumsum(padded, 0)
    padded_starts = padded_ends - padded
    grouped_end, padded_total = tl.max(ends, 0), tl.max(padded_ends, 0)

    p0 = tl.program_id(0) * BLOCK_R
    p = p0 + tl.arange(0, BLOCK_R)
    cb = tl.program_id(1)
    cols = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    col_in = cols < C
    cols64 = cols.to(tl.int64)
    # The groups whose padded columns meet the tile's: a padded group holds at least ALIGN positions.
    g_first = tl.minimum(tl.sum(tl.where(in_e & (padded_ends <= p0), 1, 0), 0), E - 1)
    g_last = tl.minimum(tl.sum(tl.where(in_e & (padded_ends <= p0 + BLOCK_R - 1), 1, 0), 0), E - 1)
    row = tl.where(p >= padded_total, grouped_end + p - padded_total, 0)  # t's row at each position
    group = tl.full([BLOCK_R], E - 1, tl.int32)  # its group
    held = p < 0  # whether the position holds a row of its group
    for g in range(g_first, g_last + 1):
        padded_start = _pick(padded_starts, e, g)
        here = (p >= padded_start) & (p < _pick(padded_ends, e, g))
        row = tl.where(here, _pick(starts, e, g) + p - padded_start, row)
        group = tl.where(here, g, group)
        held = held | (here & (row < _pick(ends, e, g)))
    read = held
    if ROWWISE:
        read = held | ((p >= padded_total) & (row < S))
    if HAS_ROWS:
        source = tl.load(ROWS + row, mask=read, other=0)
    else:
        source = row.to(tl.int64)
    x = tl.load(
        X + source[:, None] * stride_xs + cols64[None, :] * stride_xc, mask=read[:, None] & col_in[None, :], other=0.0
    ).to(tl.float32)
    rows64 = row.to(tl.int64)
    multiplied = x
    if HAS_MULTIPLIER:
        # Rows past the last group (not held) times 1.
        factor = _of_row_groups(MULTIPLIER, group, held, g_first, g_last, cols64, col_in, C, BLOCK_R, BLOCK_C)
        multiplied = x * tl.where(held[:, None], factor.to(tl.float32), 1.0)

    if PASS == 0:
        for g in range(g_first, g_last + 1):
            mine = held & (group == g)
            group_bits = tl.max(tl.where(mine[:, None], abs_bits(x), 0), 0)
            has_rows = tl.sum(mine.to(tl.int32), 0) > 0
            tl.atomic_max(COLUMN_MAXIMA + g * C + cols64, group_bits, mask=col_in & has_rows, sem="relaxed")
        if ROWWISE:
            tl.atomic_max(ROW_MAXIMA + rows64, tl.max(abs_bits(multiplied), 1), mask=read, sem="relaxed")
    else:
        for g in range(g_first, g_last + 1):
            padded_start = _pick(padded_starts, e, g)
            if padded_start >= p0:  # the group's padded columns start in this tile
                amax = tl.load(COLUMN_MAXIMA + g * C + cols64, mask=col_in, other=0).to(tl.float32, bitcast=True)
                tl.store(SCALE_T + g * C + cols64, scale_from_amax(amax, FMAX, POW2), mask=col_in)
                tl.store(PADDED_OFFS + g, _pick(padded_ends, e, g), mask=cb == 0)
        maxima = _of_row_groups(COLUMN_MAXIMA, group, held, g_first, g_last, cols64, col_in, C, BLOCK_R, BLOCK_C)
        inverse = tl.math.div_rn(1.0, scale_from_amax(maxima.to(tl.float32, bitcast=True), FMAX, POW2))
        # The padding is +0 (0x00 in every FP8 format), also where a NaN scale would make 0 / scale NaN.
        bits = tl.where(held[:, None], fp8_bits_times(x, inverse, FORMAT, FMAX, FIX_NAN, NAN_BITS), 0)
        tl.store(QT + cols64[None, :] * S_PAD + p[:, None], bits, mask=(p < S_PAD)[:, None] & col_in[None, :])
        if ROWWISE:
            row_bits = tl.load(ROW_MAXIMA + rows64, mask=read, other=0)
            scale = scale_from_amax(row_bits.to(tl.float32, bitcast=True), FMAX, POW2)
            tl.store(SCALE + rows64, scale, mask=read & (cb == 0))
            bits = fp8_bits_of(multiplied, scale[:, None], FORMAT, FMAX, FIX_NAN, NAN_BITS)
            tl.store(Q + rows64[:, None] * C + cols64[None, :], bits, mask=read[:, None] & col_in[None, :])


@triton.jit
def _of_row_groups(
    VALUES, group, held, g_first, g_last, cols64, col_in, C, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr
):
    """[BLOCK_R, BLOCK_C]: row ``group[r]`` of VALUES [E, C] at the tile's columns, for held rows (0 elsewhere). A
    tile within one group, the common case, loads that row once; one across groups gathers per element."""
    if g_first == g_last:
        values = tl.load(VALUES + g_first * C + cols64, mask=col_in, other=0)
        values = tl.broadcast_to(values[None, :], [BLOCK_R, BLOCK_C])
    else:
        values = tl.load(
            VALUES + group.to(tl.int64)[:, None] * C + cols64[None, :], mask=held[:, None] & col_in[None, :], other=0
        )
    return values


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
    multiplier: torch.Tensor | None = None,
):
    """``(q_t, scale_t, padded_offs)``, with ``rowwise`` after ``(q, scale)``; see
    ``..reference.fp8_quant_grouped.fp8_quantize_grouped``."""
    check_args(t, offs, fp8_dtype, rows, rowwise, multiplier)
    (n_rows, cols), groups = (t.shape[0] if rows is None else rows.shape[0], t.shape[1]), offs.shape[0]
    s_pad = padded_columns(n_rows, groups)
    q_t = torch.empty((cols, s_pad), dtype=fp8_dtype, device=t.device)
    scale_t = torch.empty((groups, cols), dtype=torch.float32, device=t.device)
    padded_offs = torch.empty(groups, dtype=torch.int32, device=t.device)
    q = torch.empty((n_rows, cols) if rowwise else (0, cols), dtype=fp8_dtype, device=t.device)
    scale = torch.empty((n_rows if rowwise else 0, 1), dtype=torch.float32, device=t.device)
    maxima = torch.zeros(groups * cols + q.shape[0], dtype=torch.int32, device=t.device)
    # Past the padded layout, the rows past the last group: fewer than ALIGN more than the layout's spare positions.
    positions = s_pad + (PAD_ALIGN if rowwise else 0)
    # At least one column block, whose tiles write the padded offsets where C is 0.
    grid = (triton.cdiv(positions, BLOCK_ROWS), max(triton.cdiv(cols, BLOCK_COLS), 1))
    with on_device(t.device):
        for kernel_pass in (_MAXIMA, _CAST):
            launch(_grouped_tile_kernel)[grid](
                t,
                t if rows is None else rows.contiguous(),  # not read without HAS_ROWS
                t if multiplier is None else multiplier.contiguous(),  # not read without HAS_MULTIPLIER
                maxima[: groups * cols],
                maxima[groups * cols :],
                q_t.view(torch.uint8),  # FP8 travels as raw bytes (see .fp8_formats)
                scale_t,
                padded_offs,
                q.view(torch.uint8),
                scale,
                offs,
                n_rows,
                cols,
                s_pad,
                groups,
                t.stride(0),
                t.stride(1),
                PASS=kernel_pass,
                **format_constexprs(fp8_dtype, t.device, power_of_two),
                HAS_ROWS=rows is not None,
                ROWWISE=rowwise,
                HAS_MULTIPLIER=multiplier is not None,
                ALIGN=PAD_ALIGN,
                BLOCK_E=max(16, triton.next_power_of_2(groups)),
                BLOCK_R=BLOCK_ROWS,
                BLOCK_C=BLOCK_COLS,
                num_warps=NUM_WARPS,
            )
    transposed = (q_t, scale_t, padded_offs)
    return (q, scale, *transposed) if rowwise else transposed


# The grouped row kernel: a row of up to MAX_TILE_ELEMENTS columns is held in registers (one read of t); a longer one
# is walked twice in chunks of ROW_CHUNK columns, the second walk from L2.
ROW_CHUNK = 4096


@triton.jit
def _multiplied_rows(X, MULTIPLIER, rows64, group64, cols, mask, grouped, C, stride_xs, stride_xc):
    """x's ``rows64`` x ``cols`` in fp32 (0 outside ``mask``), times their groups' multipliers (1 past the groups)."""
    x = tl.load(X + rows64 * stride_xs + cols * stride_xc, mask=mask, other=0.0).to(tl.float32)
    return x * tl.load(MULTIPLIER + group64 * C + cols, mask=grouped & (cols < C), other=1.0).to(tl.float32)


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
