"""FP8 quantization with dynamic scaling in Triton. Semantics: ``..reference.fp8_quant``.
Blocks that fit a register tile take one pass. Others take three kernels: amax, scale and cast.
See docs/kernels.md, FP8 quantization, for the tiling, numerics and interpreter defects.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from ..reference.fp8_quant import (
    AMAX_FLOOR,
    both_layouts_by_two_calls,
    check_args,
    layouts_share_blocks,
    scale_shape,
    transposed_scale,
)
from ..registry import implementation
from . import interpreting, launch, on_device, traceable, unavailable_reason
from .access_analysis import writes
from .fp8_formats import format_id, to_fp8_bits
from .fp8_transpose import fp8_transpose

# --------------------------------------------------------------------------------------------------------------
# Launch heuristics: module constants, so that tests can shrink them.
# --------------------------------------------------------------------------------------------------------------
# Elements per program of the streaming tiles: 16 per thread at 8 warps.
TILE_ELEMENTS = 4096
ELEMENTS_PER_THREAD = 16
MAX_NUM_WARPS = 16
# One pass when a block's padded area, with a transposing tile's rows, fits this.
# 32768 fp32 values are 64 per thread at 16 warps.
MAX_TILE_ELEMENTS = 32768
# One-pass sub-tiles are at least this wide, unless they span the row.
# 16 bf16 values fill a 32-byte sector.
MIN_SUBTILE_COLS = 16
# Transposing tiles hold at least this many rows. Each row of q^T then gets 32 contiguous bytes.
TRANSPOSE_MIN_ROWS = 32
# Two-pass tiles: at most this many columns when q is row-major.
MAX_TILE_COLS = 1024
# Elements per step of the scale kernel, which reduces a block's sub-tile maxima.
REDUCE_TILE_ELEMENTS = 1024
# Column blocks, one partial wide, reduced side by side per scale-kernel program.
SCALE_BLOCKS_PER_PROGRAM = 128
# Where one block spans all rows, the amax pass stops at about this many programs.
# Each then loops over tiles, so the scale kernel reduces few maxima.
# With one partial per tile, a tensorwise 8192 x 28672 operand took ~50 us to reduce (H200).
AMAX_PROGRAMS = 2048
# Tiles in flight per program that loops over several: the next one loads (cp.async) while one is reduced and cast.
LOOP_STAGES = 2
# Both layouts where x^T's blocks are columns of x (rowwise, an MoE weight's per-expert operand): the one-pass row
# kernel also writes column maxima, one per program and column, so x is read twice, not three times. It runs about
# this many programs (a wave of 8-warp programs on an H200); 0 quantizes the layouts by two calls.
COLUMN_MAXIMA_PROGRAMS = 1024
# ... where x^T's blocks hold at least this many of x's rows. On an H100 the row pass with maxima took Mixtral's
# experts' W (blocks of 28672 and 4096 rows) in half the time of two calls, Qwen3-MoE's (1536 and 2048) in 2.3-2.9x
# more (bench_fp8_quant --moe, benchmarks/results).
COLUMN_MAXIMA_MIN_ROWS = 4096

MODE_FUSED, MODE_AMAX, MODE_CAST = 0, 1, 2

_AMAX_FLOOR = tl.constexpr(AMAX_FLOOR)

# A NaN encoding per format. 0x7F sets every exponent and mantissa bit; fnuz uses the negative-zero pattern.
_NAN_BITS = {
    torch.float8_e4m3fn: 0x7F,
    torch.float8_e5m2: 0x7F,
    torch.float8_e4m3fnuz: 0x80,
    torch.float8_e5m2fnuz: 0x80,
}


# --------------------------------------------------------------------------------------------------------------
# Tiling
# --------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Fp8Tiling:
    fused: bool  # one pass (sub-tile = block) or two (sub-tile inside a block)
    sub_rows: int  # SR
    sub_cols: int  # SC
    group_rows: int  # GR: sub-tiles per tile, down
    group_cols: int  # GC: sub-tiles per tile, across
    num_warps: int

    @property
    def tile_rows(self) -> int:
        return self.group_rows * self.sub_rows

    @property
    def tile_cols(self) -> int:
        return self.group_cols * self.sub_cols


def _pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def num_warps_for(tile_elements: int) -> int:
    """ELEMENTS_PER_THREAD elements per thread, 1..MAX_NUM_WARPS warps."""
    return min(MAX_NUM_WARPS, max(1, tile_elements // (32 * ELEMENTS_PER_THREAD)))


def fp8_tiling(M: int, K: int, block_rows: int, block_cols: int, transpose: bool) -> Fp8Tiling:
    """The tiling of an [M, K] quantization in blocks of block_rows x block_cols (M, K >= 1)."""
    br, bc = min(block_rows, M), min(block_cols, K)
    single_br, single_bc = br == M, bc == K  # one block spans the dim (padded to a power of two)
    p2m, p2k = _pow2(M), _pow2(K)
    min_rows = min(TRANSPOSE_MIN_ROWS, p2m) if transpose else 1

    sr = p2m if single_br else (br if _is_pow2(br) else 0)
    sc = p2k if single_bc else (bc if _is_pow2(bc) else 0)
    # One pass also needs sub-tiles that read whole 32-byte sectors of x's rows.
    # A column block as one tall tile used 2 bytes per sector: 0.45 TB/s on an H200.
    coalesced = sc >= MIN_SUBTILE_COLS or sc == p2k
    if sr and sc and coalesced and max(sr, min_rows) * sc <= MAX_TILE_ELEMENTS:
        # One pass: group whole blocks, across x's contiguous dim first, then down.
        gr, gc = max(1, min_rows // sr), 1
        while gc * 2 * sc <= p2k and gr * sr * gc * sc * 2 <= TILE_ELEMENTS:
            gc *= 2
        while gr * 2 * sr <= p2m and gr * sr * gc * sc * 2 <= TILE_ELEMENTS:
            gr *= 2
        return Fp8Tiling(True, sr, sc, gr, gc, num_warps_for(gr * sr * gc * sc))

    # Two passes: a streaming tile, wide for row-major q and tall for q^T.
    # It is cut into the largest power-of-two sub-tiles inside one block.
    tc = min(p2k, TILE_ELEMENTS // TRANSPOSE_MIN_ROWS if transpose else MAX_TILE_COLS)
    tr = min(p2m, max(1, TILE_ELEMENTS // tc))
    sc = min(tc, p2k if single_bc else bc & -bc)  # bc & -bc: the largest power of two dividing bc
    sr = min(tr, p2m if single_br else br & -br)
    return Fp8Tiling(False, sr, sc, tr // sr, tc // sc, num_warps_for(tr * tc))


def amax_row_tiles(
    tiling: Fp8Tiling, M: int, K: int, block_rows: int, n_block_rows: int, programs: int | None = None
) -> int:
    """Tiles, one below the other, that one program of the two-pass amax reduces: doubled while more than
    ``programs`` (AMAX_PROGRAMS) programs remain and a program's tiles stay within one block (a block spanning all
    rows, or an MoE weight's per-expert column blocks). Each program writes one partial per sub-tile column: fewer to
    write and reduce (a Mixtral expert weight's transposed operand wrote 117 MB of them, one per 32 rows)."""
    n_tile_rows, n_tile_cols = triton.cdiv(M, tiling.tile_rows), triton.cdiv(K, tiling.tile_cols)
    programs = AMAX_PROGRAMS if programs is None else programs
    row_tiles = 1
    while (
        (n_block_rows == 1 or block_rows % (tiling.tile_rows * row_tiles * 2) == 0)
        and row_tiles * 2 <= n_tile_rows
        and n_tile_rows * n_tile_cols // row_tiles > programs
    ):
        row_tiles *= 2
    return row_tiles


# --------------------------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------------------------
@triton.jit
def abs_bits(x):
    """|x| as int32 bit patterns. Non-negative floats order as their bits, and NaN sorts above inf.
    An integer max is then an exact max |x| that keeps NaN. tl.max over floats drops NaN."""
    return tl.abs(x).to(tl.int32, bitcast=True)


@triton.jit
def scale_from_amax(amax, FMAX: tl.constexpr, POW2: tl.constexpr):
    """scale = max(amax, floor) / fmax (fp32, IEEE division); with POW2 the smallest power of two >= that."""
    amax = tl.maximum(amax, _AMAX_FLOOR, propagate_nan=tl.PropagateNan.ALL)
    scale = tl.math.div_rn(amax, FMAX)
    if POW2:
        bits = scale.to(tl.int32, bitcast=True)  # positive: the sign bit is clear
        exponent = bits >> 23
        rounded_up = tl.where((bits & 0x7FFFFF) != 0, exponent + 1, exponent) << 23
        # Exponent 255 is inf / NaN: kept as they are.
        scale = tl.where(exponent == 255, scale, rounded_up.to(tl.float32, bitcast=True))
    return scale


@writes(
    PARTIAL=lambda a: a["COLUMN_MAXIMA"] or a["MODE"] == 1,
    SCALE=lambda a: a["MODE"] == 0,
    Q=lambda a: a["MODE"] != 1 and a["WRITE_Q"],
    QT=lambda a: a["MODE"] != 1 and a["WRITE_QT"],
)
@triton.jit
def _fp8_tile_kernel(
    X,
    Q,
    QT,
    SCALE,
    PARTIAL,
    M,
    K,
    stride_xm,
    stride_xk,
    block_rows,
    block_cols,
    n_scale_cols,
    n_partial_cols,
    n_tile_cols,
    MODE: tl.constexpr,
    FORMAT: tl.constexpr,
    FMAX: tl.constexpr,
    POW2: tl.constexpr,
    WRITE_Q: tl.constexpr,
    WRITE_QT: tl.constexpr,
    COLUMN_MAXIMA: tl.constexpr,
    FIX_NAN: tl.constexpr,
    NAN_BITS: tl.constexpr,
    GR: tl.constexpr,
    SR: tl.constexpr,
    GC: tl.constexpr,
    SC: tl.constexpr,
    ROW_TILES: tl.constexpr,
    STAGES: tl.constexpr,
):
    """ROW_TILES tiles per program, one below the other, each seen as [GR, SR, GC, SC].
    MODE_FUSED writes each sub-tile's scale and q. MODE_AMAX writes sub-tile maxima to PARTIAL.
    MODE_CAST reads SCALE and writes q. WRITE_Q writes x's layout to Q, WRITE_QT x^T's to QT.
    COLUMN_MAXIMA (MODE_FUSED): also the max |x| of each column over the program's rows, to PARTIAL row pid_r."""
    # One loop body for every mode, with no helper returning several values.
    # torch 2.11's mutation analysis gives up on such a helper. Inductor would then copy x back.
    pid = tl.program_id(0)
    pid_r = pid // n_tile_cols
    pid_c = pid % n_tile_cols
    amax_bits = tl.zeros([GR, GC], dtype=tl.int32)
    column_bits = tl.zeros([GC, SC], dtype=tl.int32)
    for i in tl.range(ROW_TILES, num_stages=STAGES):
        first_row = ((pid_r * ROW_TILES + i) * GR + tl.arange(0, GR)) * SR  # each sub-tile's first row / column
        first_col = (pid_c * GC + tl.arange(0, GC)) * SC
        rows = first_row[:, None] + tl.arange(0, SR)[None, :]  # [GR, SR]
        cols = first_col[:, None] + tl.arange(0, SC)[None, :]  # [GC, SC]
        rows4 = rows[:, :, None, None]
        cols4 = cols[None, None, :, :]
        in_bounds = (rows4 < M) & (cols4 < K)
        # int64 offsets: row * stride overflows int32 beyond 2^31 elements.
        rows64 = rows4.to(tl.int64)
        cols64 = cols4.to(tl.int64)
        # Elements outside x load as 0: |0| never raises a block's amax.
        x = tl.load(X + rows64 * stride_xm + cols64 * stride_xk, mask=in_bounds, other=0.0).to(tl.float32)
        if MODE == 1:
            amax_bits = tl.maximum(amax_bits, tl.max(tl.max(abs_bits(x), 3), 1))
        else:
            sub_in = (first_row < M)[:, None] & (first_col < K)[None, :]  # sub-tiles holding at least one element
            # The scaling block of each sub-tile (a block larger than x has index 0).
            scale_offsets = (first_row // block_rows).to(tl.int64)[:, None] * n_scale_cols + (first_col // block_cols)[
                None, :
            ]
            if MODE == 0:
                amax = tl.max(tl.max(abs_bits(x), 3), 1).to(tl.float32, bitcast=True)  # [GR, GC]
                scale = scale_from_amax(amax, FMAX, POW2)
                tl.store(SCALE + scale_offsets, scale, mask=sub_in)
                if COLUMN_MAXIMA:
                    column_bits = tl.maximum(column_bits, tl.max(tl.max(abs_bits(x), 1), 0))
            else:
                scale = tl.load(SCALE + scale_offsets, mask=sub_in, other=1.0)
            # Saturated before the cast; the clamp keeps NaN.
            bits = fp8_bits_of(x, scale[:, None, :, None], FORMAT, FMAX, FIX_NAN, NAN_BITS)
            if WRITE_Q:
                tl.store(Q + rows64 * K + cols64, bits, mask=in_bounds)
            if WRITE_QT:
                tl.store(QT + cols64 * M + rows64, bits, mask=in_bounds)
    if COLUMN_MAXIMA:
        cols = (pid_c * GC + tl.arange(0, GC))[:, None] * SC + tl.arange(0, SC)[None, :]
        tl.store(PARTIAL + pid_r.to(tl.int64) * K + cols, column_bits.to(tl.float32, bitcast=True), mask=cols < K)
    if MODE == 1:
        # Sub-tile positions past x's edge hold 0, which never raises a block's amax.
        sub_r = pid_r * GR + tl.arange(0, GR)
        sub_c = pid_c * GC + tl.arange(0, GC)
        tl.store(
            PARTIAL + sub_r.to(tl.int64)[:, None] * n_partial_cols + sub_c[None, :],
            amax_bits.to(tl.float32, bitcast=True),
            mask=(sub_c < n_partial_cols)[None, :],
        )


@writes("SCALE")
@triton.jit
def _fp8_scale_kernel(
    PARTIAL,
    SCALE,
    n_partial_rows,
    n_partial_cols,
    rows_per_block,
    cols_per_block,
    n_scale_cols,
    n_program_cols,
    FMAX: tl.constexpr,
    POW2: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    SIDE_BY_SIDE: tl.constexpr,
):
    """Each block's scale from its window of PARTIAL maxima, reduced in a fixed order. One block per program.
    With SIDE_BY_SIDE, BLOCK_C neighbouring blocks one partial wide, read together."""
    pid = tl.program_id(0)
    block_row = pid // n_program_cols
    pid_c = pid % n_program_cols
    r_lo = block_row * rows_per_block
    r_hi = tl.minimum(r_lo + rows_per_block, n_partial_rows)
    c_lo = pid_c * (BLOCK_C if SIDE_BY_SIDE else cols_per_block)
    c_hi = tl.minimum(c_lo + (BLOCK_C if SIDE_BY_SIDE else cols_per_block), n_partial_cols)
    acc = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.int32)  # maxima as bit patterns (see abs_bits)
    for r0 in range(r_lo, r_hi, BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        for c0 in range(c_lo, c_hi, BLOCK_C):
            cols = c0 + tl.arange(0, BLOCK_C)
            mask = (rows < r_hi)[:, None] & (cols < c_hi)[None, :]
            p = tl.load(PARTIAL + rows.to(tl.int64)[:, None] * n_partial_cols + cols[None, :], mask=mask, other=0.0)
            acc = tl.maximum(acc, abs_bits(p))
    column_amax = tl.max(acc, 0)
    if SIDE_BY_SIDE:
        cols = c_lo + tl.arange(0, BLOCK_C)
        scale = scale_from_amax(column_amax.to(tl.float32, bitcast=True), FMAX, POW2)
        tl.store(SCALE + block_row.to(tl.int64) * n_scale_cols + cols, scale, mask=cols < c_hi)
    else:
        amax = tl.max(column_amax, 0).to(tl.float32, bitcast=True)
        tl.store(SCALE + pid, scale_from_amax(amax, FMAX, POW2))


@triton.jit
def fp8_bits_of(y, scale, FORMAT: tl.constexpr, FMAX: tl.constexpr, FIX_NAN: tl.constexpr, NAN_BITS: tl.constexpr):
    """y (fp32) times 1 / ``scale``, saturated and cast to FP8 raw bytes."""
    scaled = tl.clamp(y * tl.math.div_rn(1.0, scale), -FMAX, FMAX, propagate_nan=tl.PropagateNan.ALL)
    bits = to_fp8_bits(scaled, FORMAT)
    if FIX_NAN:
        # The interpreter casts NaN to a finite e4m3 value. GPU casts keep NaN.
        bits = tl.where(scaled != scaled, tl.full(bits.shape, NAN_BITS, tl.uint8), bits)
    return bits


@triton.jit
def store_fp8_row_blocks(
    y,
    Q,
    SCALE,
    rows,
    cols,
    row_mask,
    col_mask,
    H,
    n_scale_cols,
    first_block,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    QB: tl.constexpr,
    FORMAT: tl.constexpr,
    FMAX: tl.constexpr,
    POW2: tl.constexpr,
    FIX_NAN: tl.constexpr,
    NAN_BITS: tl.constexpr,
):
    """A producer's epilogue: quantizes its fp32 tile ``y`` in blocks of 1 x QB, a power of two.
    ``first_block`` is the index of the tile's first block in its rows.
    Writes q to Q and the scales to SCALE, with the tile kernel's numerics."""
    NB: tl.constexpr = BLOCK_H // QB
    blocks = tl.reshape(y, (BLOCK_ROWS, NB, QB))
    scale = scale_from_amax(tl.max(abs_bits(blocks), 2).to(tl.float32, bitcast=True), FMAX, POW2)
    block_ids = first_block + tl.arange(0, NB)
    tl.store(
        SCALE + rows.to(tl.int64)[:, None] * n_scale_cols + block_ids[None, :],
        scale,
        mask=row_mask[:, None] & (block_ids < n_scale_cols)[None, :],
    )
    bits = fp8_bits_of(blocks, scale[:, :, None], FORMAT, FMAX, FIX_NAN, NAN_BITS)
    tl.store(
        Q + rows.to(tl.int64)[:, None] * H + cols[None, :],
        tl.reshape(bits, (BLOCK_ROWS, BLOCK_H)),
        mask=row_mask[:, None] & col_mask[None, :],
    )


# Epilogue constexprs for a producer launched without FP8 output. QUANT_BLOCK 0 compiles it away.
NO_FP8_OUTPUT = dict(QUANT_BLOCK=0, FORMAT=0, FMAX=1.0, POW2=False, FIX_NAN=False, NAN_BITS=0)


def format_constexprs(fp8_dtype: torch.dtype, device: torch.device, power_of_two: bool) -> dict:
    """The FP8 format's constexprs of the kernels here and of :func:`store_fp8_row_blocks`."""
    return dict(
        FORMAT=format_id(fp8_dtype, device),
        FMAX=float(torch.finfo(fp8_dtype).max),
        POW2=bool(power_of_two),
        FIX_NAN=interpreting(),
        NAN_BITS=_NAN_BITS[fp8_dtype],
    )


# --------------------------------------------------------------------------------------------------------------
# Launcher
# --------------------------------------------------------------------------------------------------------------
@implementation("fp8_quantize", "triton", priority=20, unavailable_reason=unavailable_reason, traceable=traceable)
def fp8_quantize(
    x: torch.Tensor,
    fp8_dtype: torch.dtype,
    block_rows: int,
    block_cols: int,
    transpose: bool,
    power_of_two: bool = False,
    both_layouts: bool = False,
    block_cols_t: int = 0,
    scale: torch.Tensor | None = None,
):
    """``(q, scale)``, or ``(q, scale, q_t, scale_t)`` with ``both_layouts``, or ``q`` for a given ``scale``; see
    ``..reference.fp8_quant.fp8_quantize``."""
    check_args(x, fp8_dtype, block_rows, block_cols, transpose, both_layouts, block_cols_t, scale)
    formats = format_constexprs(fp8_dtype, x.device, power_of_two)
    M, K = x.shape
    if scale is not None:
        return _cast_by_given_scale(x, fp8_dtype, block_rows, block_cols, transpose, scale, formats)
    if both_layouts and not layouts_share_blocks(M, K, block_rows, block_cols, block_cols_t):
        column_rows = block_cols_t or block_cols
        row_tiles = column_maxima_row_tiles(M, K, block_rows, block_cols, column_rows)
        if row_tiles:
            return _rows_and_column_blocks(x, fp8_dtype, block_rows, block_cols, column_rows, row_tiles, formats)
        return both_layouts_by_two_calls(fp8_quantize, x, fp8_dtype, block_rows, block_cols, power_of_two, block_cols_t)
    n_br, n_bc = scale_shape(M, K, block_rows, block_cols)
    # Both layouts: q, then q transposed (fp8_transpose: a byte read and one written per element, where a second cast
    # pass reads x's two). Triton 3.6 miscompiled, for the H200, a kernel storing both: its x^T was wrong for fp32 and
    # some bf16 inputs.
    write_q, write_qt = not transpose or both_layouts, transpose and not both_layouts
    q = torch.empty((M, K), dtype=fp8_dtype, device=x.device) if write_q else None
    qt = torch.empty((K, M), dtype=fp8_dtype, device=x.device) if write_qt else None
    scale = torch.empty((n_br, n_bc), dtype=torch.float32, device=x.device)

    def outputs():  # once q and the scales are written
        if both_layouts:
            return q, scale, fp8_transpose(q.unsqueeze(0)).squeeze(0), transposed_scale(scale, copy=True)
        return qt if transpose else q, scale

    if M == 0 or K == 0:
        scale.fill_(1.0)
        return outputs()
    br, bc = min(block_rows, M), min(block_cols, K)
    tiling = fp8_tiling(M, K, block_rows, block_cols, write_qt)
    write = (write_q, write_qt)
    with on_device(x.device):
        if tiling.fused:
            _launch_tiles(x, q, qt, scale, scale, tiling, br, bc, MODE_FUSED, write, formats)
            return outputs()
        row_tiles = amax_row_tiles(tiling, M, K, br, n_br)
        # One maximum per sub-tile down each program's tiles and per sub-tile column.
        partial_shape = (_program_rows(M, tiling, row_tiles) * tiling.group_rows, triton.cdiv(K, tiling.sub_cols))
        partial = torch.empty(partial_shape, dtype=torch.float32, device=x.device)
        _launch_tiles(x, q, qt, scale, partial, tiling, br, bc, MODE_AMAX, write, formats, row_tiles=row_tiles)
        # Sub-tiles per block (all of them along a dim that one block spans).
        rows_per_block = partial.shape[0] if n_br == 1 else br // (tiling.sub_rows * row_tiles)
        cols_per_block = partial.shape[1] if n_bc == 1 else bc // tiling.sub_cols
        _launch_scales(partial, scale, rows_per_block, cols_per_block, formats)
        _launch_tiles(x, q, qt, scale, partial, tiling, br, bc, MODE_CAST, write, formats)
    return outputs()


def _cast_by_given_scale(
    x: torch.Tensor,
    fp8_dtype: torch.dtype,
    block_rows: int,
    block_cols: int,
    transpose: bool,
    scale: torch.Tensor,
    formats: dict,
) -> torch.Tensor:
    """q (or q^T) cast by x's blocks' given scales: one read of x, no maxima."""
    M, K = x.shape
    q = torch.empty((K, M) if transpose else (M, K), dtype=fp8_dtype, device=x.device)
    if M == 0 or K == 0:
        return q
    tiling = fp8_tiling(M, K, block_rows, block_cols, transpose)
    br, bc = min(block_rows, M), min(block_cols, K)
    write = (not transpose, transpose)
    with on_device(x.device):
        _launch_tiles(  # MODE_CAST reads no partial maxima: scale stands in for them
            x,
            q if not transpose else None,
            q if transpose else None,
            scale,
            scale,
            tiling,
            br,
            bc,
            MODE_CAST,
            write,
            formats,
        )
    return q


def _program_rows(M: int, tiling: Fp8Tiling, row_tiles: int) -> int:
    """Programs down x's M rows, each over ``row_tiles`` tiles of ``tiling`` one below the other."""
    return triton.cdiv(triton.cdiv(M, tiling.tile_rows), row_tiles)


def column_maxima_row_tiles(M: int, K: int, block_rows: int, block_cols: int, column_rows: int) -> int:
    """Tiles per program of a one-pass row kernel that also writes column maxima for x^T's blocks, ``column_rows``
    of x's rows in one column; 0 where that does not apply: x^T's blocks span more than a column or hold fewer than
    COLUMN_MAXIMA_MIN_ROWS rows, x's blocks take two passes, x^T's one (it is read twice already), the maxima would
    not fit registers beside the tile, or a block of ``column_rows`` does not hold whole tiles."""
    if not COLUMN_MAXIMA_PROGRAMS or M == 0 or K == 0 or min(block_rows, K) != 1:
        return 0
    if min(column_rows, M) < COLUMN_MAXIMA_MIN_ROWS:
        return 0
    tiling = fp8_tiling(M, K, block_rows, block_cols, False)
    n_column_blocks = triton.cdiv(M, column_rows)
    if not tiling.fused or fp8_tiling(M, K, column_rows, block_rows, True).fused:
        return 0
    if (tiling.tile_rows + 1) * tiling.tile_cols > MAX_TILE_ELEMENTS:
        return 0
    if n_column_blocks > 1 and column_rows % tiling.tile_rows:
        return 0
    return amax_row_tiles(tiling, M, K, column_rows, n_column_blocks, COLUMN_MAXIMA_PROGRAMS)


def _rows_and_column_blocks(
    x: torch.Tensor,
    fp8_dtype: torch.dtype,
    block_rows: int,
    block_cols: int,
    column_rows: int,
    row_tiles: int,
    formats: dict,
):
    """Both layouts, x^T's blocks a column of ``column_rows`` rows of x, reading x twice: the row kernel writes q
    and each program's column maxima, which give x^T's scales; then x^T's cast."""
    M, K = x.shape
    tiling = fp8_tiling(M, K, block_rows, block_cols, False)
    column_tiling = fp8_tiling(M, K, column_rows, block_rows, True)
    n_br, n_bc = scale_shape(M, K, block_rows, block_cols)
    q, scale = torch.empty((M, K), dtype=fp8_dtype, device=x.device), x.new_empty((n_br, n_bc), dtype=torch.float32)
    q_t = torch.empty((K, M), dtype=fp8_dtype, device=x.device)
    n_column_blocks = triton.cdiv(M, column_rows)
    column_scale = x.new_empty((n_column_blocks, K), dtype=torch.float32)
    n_programs = _program_rows(M, tiling, row_tiles)
    partial = x.new_empty((n_programs, K), dtype=torch.float32)
    br, bc, column_rows = min(block_rows, M), min(block_cols, K), min(column_rows, M)
    with on_device(x.device):
        _launch_tiles(
            x,
            q,
            None,
            scale,
            partial,
            tiling,
            br,
            bc,
            MODE_FUSED,
            (True, False),
            formats,
            row_tiles,
            column_maxima=True,
        )
        rows_per_block = n_programs if n_column_blocks == 1 else column_rows // (tiling.tile_rows * row_tiles)
        _launch_scales(partial, column_scale, rows_per_block, 1, formats)
        _launch_tiles(
            x, None, q_t, column_scale, partial, column_tiling, column_rows, 1, MODE_CAST, (False, True), formats
        )
    return q, scale, q_t, transposed_scale(column_scale)


def _launch_tiles(
    x: torch.Tensor,
    q: torch.Tensor | None,
    q_t: torch.Tensor | None,
    scale: torch.Tensor,
    partial: torch.Tensor,
    tiling: Fp8Tiling,
    br: int,
    bc: int,
    mode: int,
    write: tuple[bool, bool],
    formats: dict,
    row_tiles: int = 1,
    column_maxima: bool = False,
) -> None:
    """One launch of the tile kernel over x in ``tiling``, ``row_tiles`` tiles per program; ``write``: (q, q^T)."""
    M, K = x.shape
    n_tile_cols = triton.cdiv(K, tiling.tile_cols)
    grid = (_program_rows(M, tiling, row_tiles) * n_tile_cols,)
    write_q, write_qt = write
    launch(_fp8_tile_kernel)[grid](
        x,
        # Stored as raw bytes, alike on every backend. An output not written gets x, which is only read.
        # Passing the other output would alias a written argument in the traced graph.
        q.view(torch.uint8) if write_q else x,
        q_t.view(torch.uint8) if write_qt else x,
        scale,
        partial,
        M,
        K,
        x.stride(0),
        x.stride(1),
        br,
        bc,
        scale.shape[1],
        partial.shape[1],
        n_tile_cols,
        MODE=mode,
        ROW_TILES=row_tiles,
        STAGES=LOOP_STAGES,
        WRITE_Q=write_q,
        WRITE_QT=write_qt,
        COLUMN_MAXIMA=column_maxima,
        **formats,
        GR=tiling.group_rows,
        SR=tiling.sub_rows,
        GC=tiling.group_cols,
        SC=tiling.sub_cols,
        num_warps=tiling.num_warps,
    )


def _launch_scales(partial: torch.Tensor, scale: torch.Tensor, rows_per_block: int, cols_per_block: int, formats):
    """Each block's scale from its ``rows_per_block`` x ``cols_per_block`` window of ``partial`` maxima."""
    (n_partial_rows, n_partial_cols), (n_br, n_bc) = partial.shape, scale.shape
    # Column blocks one partial wide: SCALE_BLOCKS_PER_PROGRAM per program, reading coalesced rows.
    # One program per block would read a strided column each.
    side_by_side = cols_per_block == 1 and n_bc > 1
    if side_by_side:
        reduce_c = min(_pow2(n_bc), SCALE_BLOCKS_PER_PROGRAM, REDUCE_TILE_ELEMENTS)
        n_program_cols = triton.cdiv(n_bc, reduce_c)
    else:
        reduce_c, n_program_cols = min(_pow2(cols_per_block), REDUCE_TILE_ELEMENTS), n_bc
    reduce_r = min(_pow2(rows_per_block), max(1, REDUCE_TILE_ELEMENTS // reduce_c))
    launch(_fp8_scale_kernel)[(n_br * n_program_cols,)](
        partial,
        scale,
        n_partial_rows,
        n_partial_cols,
        rows_per_block,
        cols_per_block,
        n_bc,
        n_program_cols,
        FMAX=formats["FMAX"],
        POW2=formats["POW2"],
        BLOCK_R=reduce_r,
        BLOCK_C=reduce_c,
        SIDE_BY_SIDE=side_by_side,
        num_warps=num_warps_for(reduce_r * reduce_c),
    )


__all__ = [
    "fp8_quantize",
    "fp8_tiling",
    "amax_row_tiles",
    "column_maxima_row_tiles",
    "Fp8Tiling",
    "num_warps_for",
    "store_fp8_row_blocks",
    "format_constexprs",
    "fp8_bits_of",
    "NO_FP8_OUTPUT",
]
