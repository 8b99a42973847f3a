"""RMSNorm forward and backward in Triton, optionally fused with a residual add. Semantics: ``..reference.rmsnorm``.
Whole rows stay in registers; wider rows go in chunks. The backward's dw needs no atomics: it is deterministic.
See docs/kernels.md, RMSNorm.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch import dtype as DType

from ..reference.rmsnorm import sum_dtype
from ..registry import FP8_IN_ITS_PASS, implementation
from . import device_limits, interpreting, launch, on_device, traceable, unavailable_reason
from .access_analysis import writes
from .fp8_quant import NO_FP8_OUTPUT, format_constexprs, fp8_quantize, store_fp8_row_blocks

# --------------------------------------------------------------------------------------------------------------
# Launch heuristics: module constants, so that tests can shrink them.
# --------------------------------------------------------------------------------------------------------------
# Rows whose padded size fits these stay in registers. Wider rows would spill, so they go in chunks.
# The backward keeps four values live per element: its limit is half the forward's.
FWD_MAX_FUSED_BYTES = 65536  # bf16: H <= 32768, fp32: H <= 16384
BWD_MAX_FUSED_BYTES = 32768  # bf16: H <= 16384, fp32: H <= 8192
# Chunk width of the wide-row paths, in bytes of the input dtype.
CHUNK_BYTES = 16384
# Small H: pack rows until a program's tile holds about this many elements.
# One 128-element row alone would leave most load slots idle.
ROW_TILE_ELEMENTS = 4096
MAX_BLOCK_ROWS = 64
# Backward elements per thread, which set num_warps. 16 keeps the tile in registers.
BWD_ELEMENTS_PER_THREAD = 16
# Resident warps per SM the persistent backward aims for: two 8-warp programs at H=4096.
# More programs hide latency, but add dw partial rows and compete for registers.
BWD_WARPS_PER_SM = 16
# Software pipelining of the backward's row loop: 1.6x faster at [8192, 4096] bf16 on an H200.
# Only tiles up to BWD_PIPELINE_MAX_TILE_BYTES per input; wider ones ran slower pipelined.
# An SM's staged loads get about BWD_PIPELINE_SMEM_PER_SM bytes. See docs/kernels.md, RMSNorm.
BWD_PIPELINE_STAGES = 3
BWD_PIPELINE_MAX_TILE_BYTES = 16384
BWD_PIPELINE_SMEM_PER_SM = 147456
# The final dw reduction: about this many fp32 partials per program and loop step.
DW_REDUCE_TILE_ELEMENTS = 8192
# "SM count" in the CPU interpreter: small, so that tests see programs share the rows.
INTERPRETER_PROGRAMS = 4


@dataclasses.dataclass(frozen=True)
class RowTiling:
    block_rows: int  # rows per program step
    block_h: int  # columns per tile (next_pow2(H) when fused, the chunk width otherwise)
    num_warps: int
    chunked: bool  # True: the row does not fit one tile; loop over it in chunks of block_h


def fwd_num_warps(tile_elements: int) -> int:
    """Forward warps per program from its tile size: 8-16 elements per thread at Llama sizes."""
    if tile_elements >= 16384:
        return 16
    if tile_elements >= 4096:
        return 8
    return 4


def bwd_num_warps(tile_elements: int) -> int:
    """Backward warps per program: BWD_ELEMENTS_PER_THREAD elements per thread, 4..32 warps."""
    return min(32, max(4, tile_elements // (32 * BWD_ELEMENTS_PER_THREAD)))


def _tiling(H: int, element_size: int, max_fused_bytes: int, num_warps) -> RowTiling:
    block_h = triton.next_power_of_2(max(H, 1))
    if block_h * element_size > max_fused_bytes:
        chunk = max(1, min(CHUNK_BYTES, max_fused_bytes) // element_size)
        return RowTiling(1, chunk, num_warps(chunk), True)
    block_rows = min(MAX_BLOCK_ROWS, max(1, ROW_TILE_ELEMENTS // block_h))
    return RowTiling(block_rows, block_h, num_warps(block_rows * block_h), False)


def fwd_tiling(H: int, element_size: int) -> RowTiling:
    """Forward tile: whole rows (several when H is small), or chunks of a wide row."""
    return _tiling(H, element_size, FWD_MAX_FUSED_BYTES, fwd_num_warps)


def bwd_tiling(H: int, element_size: int) -> RowTiling:
    """Backward tile: as the forward, with the backward's register limit and warp count."""
    return _tiling(H, element_size, BWD_MAX_FUSED_BYTES, bwd_num_warps)


def _sm_count(device: torch.device) -> int:
    return INTERPRETER_PROGRAMS if interpreting() else device_limits(device).sms


def _max_shared_mem(device: torch.device) -> int:
    """Shared memory one program may use, in bytes. Unbounded in the interpreter, which ignores stages."""
    return 1 << 30 if interpreting() else device_limits(device).max_shared


@dataclasses.dataclass(frozen=True)
class BwdSchedule:
    loop_stages: int  # num_stages of the row loop (1: not pipelined)
    programs_per_sm: int


def bwd_schedule(tiling: RowTiling, element_size: int, n_inputs: int, device: torch.device) -> BwdSchedule:
    """Pipeline depth and programs per SM of the fused backward.
    ``n_inputs``: row tiles loaded per step (dy, s, and dresidual), each staged when pipelined."""
    stage_bytes = n_inputs * tiling.block_rows * tiling.block_h * element_size
    programs_per_sm = max(1, BWD_WARPS_PER_SM // tiling.num_warps)
    if stage_bytes > n_inputs * BWD_PIPELINE_MAX_TILE_BYTES:
        return BwdSchedule(1, programs_per_sm)
    stages = BWD_PIPELINE_STAGES
    while stages > 1 and stages * stage_bytes > _max_shared_mem(device):  # e.g. 64 KiB of LDS on MI300
        stages -= 1
    if stages > 1:
        programs_per_sm = max(1, min(programs_per_sm, BWD_PIPELINE_SMEM_PER_SM // (stages * stage_bytes)))
    return BwdSchedule(stages, programs_per_sm)


def bwd_grid_size(n_row_blocks: int, programs_per_sm: int, device: torch.device) -> int:
    """Persistent backward grid: enough programs to fill the GPU, at most one per row block."""
    return max(1, min(n_row_blocks, _sm_count(device) * programs_per_sm))


def dw_reduce_config(max_partials: int, H: int, device: torch.device) -> tuple[int, int, int]:
    """``(BLOCK_P, BLOCK_N, num_warps)`` of the dw reduction: about one program per SM.
    Tall tiles need only one or two dependent loads: this short kernel is latency-bound.
    Sized for the grid's most partials, which do not depend on the row count."""
    block_n = min(256, max(32, triton.next_power_of_2(triton.cdiv(H, _sm_count(device)))))
    block_p = min(triton.next_power_of_2(max_partials), max(1, DW_REDUCE_TILE_ELEMENTS // block_n))
    return block_p, block_n, fwd_num_warps(block_p * block_n)


# --------------------------------------------------------------------------------------------------------------
# Forward kernels
# --------------------------------------------------------------------------------------------------------------
@writes(
    "Y",
    "RSTD",
    S_OUT=lambda a: a["HAS_RESIDUAL"],
    Q=lambda a: a["QUANT_BLOCK"] > 0,
    Q_SCALE=lambda a: a["QUANT_BLOCK"] > 0,
)
@triton.jit
def _rmsnorm_fwd_kernel(
    X,
    W,
    R,
    Y,
    S_OUT,
    RSTD,
    Q,
    Q_SCALE,
    n_rows,
    H,
    eps,
    n_scale_cols,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    QUANT_BLOCK: tl.constexpr,
    FORMAT: tl.constexpr,
    FMAX: tl.constexpr,
    POW2: tl.constexpr,
    FIX_NAN: tl.constexpr,
    NAN_BITS: tl.constexpr,
):
    """BLOCK_ROWS whole rows per program (BLOCK_H >= H).
    With QUANT_BLOCK > 0, the rounded y is also written in FP8 (see ``store_fp8_row_blocks``)."""
    pid = tl.program_id(0)
    rows = pid * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_H)
    row_mask = rows < n_rows
    col_mask = cols < H
    mask = row_mask[:, None] & col_mask[None, :]
    # int64 offsets: rows * H overflows int32 beyond 2^31 elements.
    offs = rows.to(tl.int64)[:, None] * H + cols[None, :]
    # Masked lanes load 0 so that they add nothing to the sum of squares.
    s = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(R + offs, mask=mask, other=0.0).to(tl.float32)
        # Normalize the sum rounded to its dtype, as the unfused add-then-norm does.
        s_low = (s + r).to(S_OUT.dtype.element_ty)
        tl.store(S_OUT + offs, s_low, mask=mask)
        s = s_low.to(tl.float32)
    # Inductor may pass eps as fp64: keep the math in fp32.
    mean_sq = tl.sum(s * s, axis=1) / H
    rstd = tl.rsqrt(mean_sq + tl.cast(eps, tl.float32))
    tl.store(RSTD + rows, rstd, mask=row_mask)
    y = s * rstd[:, None]
    if HAS_WEIGHT:
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
        y = y * w[None, :]
    y_low = y.to(Y.dtype.element_ty)
    tl.store(Y + offs, y_low, mask=mask)
    if QUANT_BLOCK > 0:
        # Masked lanes hold 0, which never raises a block's amax.
        store_fp8_row_blocks(
            y_low.to(tl.float32),
            Q,
            Q_SCALE,
            rows,
            cols,
            row_mask,
            col_mask,
            H,
            n_scale_cols,
            0,
            BLOCK_ROWS,
            BLOCK_H,
            QUANT_BLOCK,
            FORMAT,
            FMAX,
            POW2,
            FIX_NAN,
            NAN_BITS,
        )


@writes("Y", "RSTD", S_OUT=lambda a: a["HAS_RESIDUAL"])
@triton.jit
def _rmsnorm_fwd_chunked_kernel(
    X,
    W,
    R,
    Y,
    S_OUT,
    RSTD,
    H,
    eps,
    BLOCK_H: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    """One wide row per program: pass 1 sums squares and writes s, pass 2 normalizes.
    Pass 2 recomputes s rather than read S_OUT: no thread reads another's writes, so no barrier."""
    row = tl.program_id(0).to(tl.int64)
    base = row * H
    cols0 = tl.arange(0, BLOCK_H)
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for start in range(0, H, BLOCK_H):
        cols = start + cols0
        mask = cols < H
        s = tl.load(X + base + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            r = tl.load(R + base + cols, mask=mask, other=0.0).to(tl.float32)
            s_low = (s + r).to(S_OUT.dtype.element_ty)
            tl.store(S_OUT + base + cols, s_low, mask=mask)
            s = s_low.to(tl.float32)
        acc += s * s
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / H + tl.cast(eps, tl.float32))
    tl.store(RSTD + row, rstd)
    for start in range(0, H, BLOCK_H):
        cols = start + cols0
        mask = cols < H
        s = tl.load(X + base + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            r = tl.load(R + base + cols, mask=mask, other=0.0).to(tl.float32)
            s = (s + r).to(Y.dtype.element_ty).to(tl.float32)
        y = s * rstd
        if HAS_WEIGHT:
            w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
            y = y * w
        tl.store(Y + base + cols, y.to(Y.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------------------------------------------
# Backward kernels
# --------------------------------------------------------------------------------------------------------------
@writes("DX", DW_PARTIAL=lambda a: a["HAS_WEIGHT"])
@triton.jit
def _rmsnorm_bwd_kernel(
    DY,
    X,
    W,
    RSTD,
    DRES,
    DX,
    DW_PARTIAL,
    n_rows,
    H,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_DRESIDUAL: tl.constexpr,
    LOOP_STAGES: tl.constexpr,
):
    """Persistent: program pid takes row blocks pid, pid + G, ... (BLOCK_H >= H).
    ``dx = rstd * (dy*w - s * rstd^2 * mean(dy*w*s)) [+ dres]``; its dw partial sums ``dy*s*rstd``."""
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_H)
    col_mask = cols < H
    row_offsets = tl.arange(0, BLOCK_ROWS)
    if HAS_WEIGHT:
        # Loaded once per program, reused for every row it handles.
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    # Per-program dw accumulator, fp32, reduced over rows only once at the end.
    acc = tl.zeros([BLOCK_ROWS, BLOCK_H], dtype=tl.float32)
    for row_start in tl.range(pid * BLOCK_ROWS, n_rows, n_programs * BLOCK_ROWS, num_stages=LOOP_STAGES):
        rows = row_start + row_offsets
        row_mask = rows < n_rows
        mask = row_mask[:, None] & col_mask[None, :]
        offs = rows.to(tl.int64)[:, None] * H + cols[None, :]
        # Masked lanes load 0: they add nothing to the row dot product nor to dw.
        dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
        s = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
        if HAS_WEIGHT:
            dyw = dy * w[None, :]
        else:
            dyw = dy
        c = tl.sum(dyw * s, axis=1) / H
        dx = rstd[:, None] * (dyw - s * (rstd * rstd * c)[:, None])
        if HAS_DRESIDUAL:
            dx += tl.load(DRES + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=mask)
        if HAS_WEIGHT:
            acc += dy * (s * rstd[:, None])
    if HAS_WEIGHT:
        # This program's partial, in its own row of DW_PARTIAL: no atomics, fixed summation order.
        tl.store(DW_PARTIAL + pid.to(tl.int64) * H + cols, tl.sum(acc, axis=0), mask=col_mask)


@writes("C")
@triton.jit
def _rmsnorm_bwd_row_dot_kernel(
    DY,
    X,
    W,
    RSTD,
    C,
    H,
    BLOCK_H: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
):
    """Wide rows, step 1: ``C[row] = rstd^2 * mean(dy * w * s)``, one row per program, in chunks."""
    row = tl.program_id(0).to(tl.int64)
    base = row * H
    cols0 = tl.arange(0, BLOCK_H)
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for start in range(0, H, BLOCK_H):
        cols = start + cols0
        mask = cols < H
        dy = tl.load(DY + base + cols, mask=mask, other=0.0).to(tl.float32)
        s = tl.load(X + base + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_WEIGHT:
            dy = dy * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        acc += dy * s
    rstd = tl.load(RSTD + row)
    tl.store(C + row, rstd * rstd * (tl.sum(acc, axis=0) / H))


@writes("DX", DW_PARTIAL=lambda a: a["HAS_WEIGHT"])
@triton.jit
def _rmsnorm_bwd_chunked_kernel(
    DY,
    X,
    W,
    RSTD,
    C,
    DRES,
    DX,
    DW_PARTIAL,
    n_rows,
    H,
    BLOCK_H: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_DRESIDUAL: tl.constexpr,
):
    """Wide rows, step 2, on a (G, column chunks) grid. Program (pid, chunk) takes rows pid, pid + G, ...
    Its dw partial for the chunk is stored once to DW_PARTIAL[pid]."""
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = cols < H
    if HAS_WEIGHT:
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for row in range(pid, n_rows, n_programs):
        base = tl.cast(row, tl.int64) * H
        dy = tl.load(DY + base + cols, mask=mask, other=0.0).to(tl.float32)
        s = tl.load(X + base + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + row)
        c = tl.load(C + row)
        if HAS_WEIGHT:
            dyw = dy * w
        else:
            dyw = dy
        dx = rstd * (dyw - s * c)
        if HAS_DRESIDUAL:
            dx += tl.load(DRES + base + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + base + cols, dx.to(DX.dtype.element_ty), mask=mask)
        if HAS_WEIGHT:
            acc += dy * (s * rstd)
    if HAS_WEIGHT:
        tl.store(DW_PARTIAL + pid.to(tl.int64) * H + cols, acc, mask=mask)


@writes("DW")
@triton.jit
def _dw_reduce_kernel(
    PARTIAL,
    DW,
    n_partials,
    H,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """DW[cols] = sum over the n_partials rows of PARTIAL (fp32, fixed order), rounded to DW's dtype."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < H
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for p0 in range(0, n_partials, BLOCK_P):
        ps = p0 + tl.arange(0, BLOCK_P)
        mask = (ps < n_partials)[:, None] & col_mask[None, :]
        tile = tl.load(PARTIAL + ps.to(tl.int64)[:, None] * H + cols[None, :], mask=mask, other=0.0)
        acc += tl.sum(tile, axis=0)
    tl.store(DW + cols, acc.to(DW.dtype.element_ty), mask=col_mask)


# --------------------------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------------------------
@implementation("rmsnorm_fwd", "triton", priority=20, unavailable_reason=unavailable_reason, traceable=traceable)
def rmsnorm_fwd(x: Tensor, weight: Tensor | None, residual: Tensor | None, eps: float, out_dtype: DType | None = None):
    """Returns ``(y, s_out, rstd)``; see ``..reference.rmsnorm.rmsnorm_fwd``."""
    return _fwd(x, weight, residual, eps, out_dtype=out_dtype)[:3]


@implementation(
    "rmsnorm_fwd_fp8",
    "triton",
    priority=20,
    unavailable_reason=unavailable_reason,
    traceable=traceable,
    capabilities={
        FP8_IN_ITS_PASS: lambda width, element_size, block_cols: quantizes_in_its_pass(width, element_size, block_cols)
    },
)
def rmsnorm_fwd_fp8(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    residual: torch.Tensor | None,
    eps: float,
    fp8_dtype: torch.dtype,
    block_cols: int,
    power_of_two: bool = False,
    out_dtype: torch.dtype | None = None,
):
    """Returns ``(y, s_out, rstd, q, scale)``; see ``..reference.rmsnorm.rmsnorm_fwd_fp8``.
    y is quantized in the norm's pass where :func:`quantizes_in_its_pass`, else by the quantization kernel."""
    H = int(x.shape[1])
    if not quantizes_in_its_pass(H, x.element_size(), block_cols):
        y, s_out, rstd = _fwd(x, weight, residual, eps, out_dtype=out_dtype)[:3]
        return y, s_out, rstd, *fp8_quantize(y, fp8_dtype, 1, block_cols, False, power_of_two=power_of_two)
    return _fwd(x, weight, residual, eps, (fp8_dtype, min(block_cols, H), power_of_two), out_dtype)


def quantizes_in_its_pass(H: int, element_size: int, block_cols: int) -> bool:
    """Whether the forward quantizes its output in blocks of 1 x ``block_cols`` in its own pass.
    True for rows of one tile, in power-of-two blocks or one block per row."""
    block = min(block_cols, H)
    return not fwd_tiling(H, element_size).chunked and (block == H or block & (block - 1) == 0)


def _fwd(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    residual: torch.Tensor | None,
    eps: float,
    quantize: tuple[torch.dtype, int, bool] | None = None,
    out_dtype: torch.dtype | None = None,
):
    """``(y, s_out, rstd, q, scale)``. q and scale are None unless ``quantize`` = (fp8 dtype, block, power of two).
    y is in ``out_dtype`` if given."""
    x = x.contiguous()
    n_rows, H = x.shape
    # The width sets the launch configuration: graphs specialize on it; the row count stays symbolic.
    H = int(H)
    # The sum takes the add's dtype; y the sum's or ``out_dtype``.
    # The kernels round to the dtypes of the outputs they store.
    s_dtype = sum_dtype(x, residual)
    y = torch.empty_like(x, dtype=out_dtype or s_dtype)
    s_out = torch.empty_like(x, dtype=s_dtype) if residual is not None else None
    rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    q = scale = None
    if quantize is not None:
        fp8_dtype, quant_block, power_of_two = quantize
        q = torch.empty((n_rows, H), dtype=fp8_dtype, device=x.device)
        scale = torch.empty((n_rows, triton.cdiv(H, quant_block)), dtype=torch.float32, device=x.device)
    if n_rows == 0:
        return y, s_out, rstd, q, scale
    if residual is not None:
        residual = residual.contiguous()
    if weight is not None:
        weight = weight.contiguous()
    # Unused pointer arguments get x: the HAS_* constexprs compile their accesses away.
    w_arg = weight if weight is not None else x
    r_arg = residual if residual is not None else x
    s_arg = s_out if s_out is not None else y
    tiling = fwd_tiling(H, x.element_size())
    with on_device(x.device):
        if tiling.chunked:
            launch(_rmsnorm_fwd_chunked_kernel)[(n_rows,)](
                x,
                w_arg,
                r_arg,
                y,
                s_arg,
                rstd,
                H,
                eps,
                BLOCK_H=tiling.block_h,
                HAS_WEIGHT=weight is not None,
                HAS_RESIDUAL=residual is not None,
                num_warps=tiling.num_warps,
            )
        else:
            if quantize is None:
                # Unwritten outputs get x, which the kernel only reads (see fp8_quant.py).
                q_args, quant = (x, x, 1), NO_FP8_OUTPUT
            else:
                q_args = (q.view(torch.uint8), scale, scale.shape[1])
                # Whole blocks per tile: the block, or the padded row when one block spans it.
                quant = dict(
                    QUANT_BLOCK=tiling.block_h if quant_block == H else quant_block,
                    **format_constexprs(fp8_dtype, x.device, power_of_two),
                )
            grid = (triton.cdiv(n_rows, tiling.block_rows),)
            launch(_rmsnorm_fwd_kernel)[grid](
                x,
                w_arg,
                r_arg,
                y,
                s_arg,
                rstd,
                q_args[0],
                q_args[1],
                n_rows,
                H,
                eps,
                q_args[2],
                BLOCK_ROWS=tiling.block_rows,
                BLOCK_H=tiling.block_h,
                HAS_WEIGHT=weight is not None,
                HAS_RESIDUAL=residual is not None,
                **quant,
                num_warps=tiling.num_warps,
            )
    return y, s_out, rstd, q, scale


@implementation("rmsnorm_bwd", "triton", priority=20, unavailable_reason=unavailable_reason, traceable=traceable)
def rmsnorm_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, rstd: torch.Tensor, dresidual: torch.Tensor | None
):
    """Returns ``(dx, dw)``; see ``..reference.rmsnorm.rmsnorm_bwd``."""
    dy = dy.contiguous()
    x = x.contiguous()
    rstd = rstd.contiguous()
    n_rows, H = x.shape
    # The width sets the launch configuration: graphs specialize on it; the row count stays symbolic.
    H = int(H)
    dx = torch.empty_like(x)
    has_weight = weight is not None
    if n_rows == 0:
        dw = torch.zeros(H, dtype=weight.dtype, device=weight.device) if has_weight else None
        return dx, dw
    if has_weight:
        weight = weight.contiguous()
    if dresidual is not None:
        dresidual = dresidual.contiguous()
    w_arg = weight if has_weight else x
    dres_arg = dresidual if dresidual is not None else x
    tiling = bwd_tiling(H, x.element_size())
    with on_device(x.device):
        if tiling.chunked:
            n_chunks = triton.cdiv(H, tiling.block_h)
            # Column chunks already spread the work: fewer row groups fill the GPU.
            programs_per_sm = max(1, BWD_WARPS_PER_SM // tiling.num_warps)
            max_programs = max(1, _sm_count(x.device) * programs_per_sm // n_chunks)
            n_programs = max(1, bwd_grid_size(n_rows, programs_per_sm, x.device) // n_chunks)
            dw_partial = _dw_partial_buffer(n_programs, H, x.device, has_weight)
            c = torch.empty(n_rows, dtype=torch.float32, device=x.device)
            launch(_rmsnorm_bwd_row_dot_kernel)[(n_rows,)](
                dy, x, w_arg, rstd, c, H, BLOCK_H=tiling.block_h, HAS_WEIGHT=has_weight, num_warps=tiling.num_warps
            )
            launch(_rmsnorm_bwd_chunked_kernel)[(n_programs, n_chunks)](
                dy,
                x,
                w_arg,
                rstd,
                c,
                dres_arg,
                dx,
                dw_partial,
                n_rows,
                H,
                BLOCK_H=tiling.block_h,
                HAS_WEIGHT=has_weight,
                HAS_DRESIDUAL=dresidual is not None,
                num_warps=tiling.num_warps,
            )
        else:
            schedule = bwd_schedule(tiling, x.element_size(), 2 if dresidual is None else 3, x.device)
            max_programs = _sm_count(x.device) * schedule.programs_per_sm
            n_programs = bwd_grid_size(triton.cdiv(n_rows, tiling.block_rows), schedule.programs_per_sm, x.device)
            dw_partial = _dw_partial_buffer(n_programs, H, x.device, has_weight)
            launch(_rmsnorm_bwd_kernel)[(n_programs,)](
                dy,
                x,
                w_arg,
                rstd,
                dres_arg,
                dx,
                dw_partial,
                n_rows,
                H,
                BLOCK_ROWS=tiling.block_rows,
                BLOCK_H=tiling.block_h,
                HAS_WEIGHT=has_weight,
                HAS_DRESIDUAL=dresidual is not None,
                LOOP_STAGES=schedule.loop_stages,
                num_warps=tiling.num_warps,
            )
        dw = None
        if has_weight:
            dw = torch.empty(H, dtype=weight.dtype, device=weight.device)
            block_p, block_n, num_warps = dw_reduce_config(max_programs, H, x.device)
            launch(_dw_reduce_kernel)[(triton.cdiv(H, block_n),)](
                dw_partial, dw, n_programs, H, BLOCK_P=block_p, BLOCK_N=block_n, num_warps=num_warps
            )
    return dx, dw


def _dw_partial_buffer(n_programs: int, H: int, device: torch.device, has_weight: bool) -> torch.Tensor:
    # Every entry is written by exactly one program before it is read: no zero-fill needed.
    if not has_weight:
        return torch.empty(1, dtype=torch.float32, device=device)
    return torch.empty((n_programs, H), dtype=torch.float32, device=device)


__all__ = [
    "rmsnorm_fwd",
    "rmsnorm_fwd_fp8",
    "quantizes_in_its_pass",
    "rmsnorm_bwd",
    "fwd_tiling",
    "bwd_tiling",
    "bwd_schedule",
    "bwd_grid_size",
]
