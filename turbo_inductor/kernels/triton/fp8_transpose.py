"""FP8 operands transposed in Triton: q [B, R, C] to [B, C, R], contiguous. Semantics: ``..reference.fp8_transpose``.

One program per tile of TILE_ROWS x TILE_COLS bytes: loads run along q's rows, stores along the output's, and the
compiler transposes through shared memory between them, so both stay coalesced. Two bytes move per element, where
quantizing W a second time for the other layout reads two and writes one.

``fp8_transpose_grouped`` tiles q_t [C, S_pad] the same way, TILE_Q_ROWS of its rows by TILE_PADDED padded columns
a program. Each program derives the padded layout from offs itself (as ``.fp8_quant_grouped``'s kernels do), so S_pad
is the launch's static bound and no host value depends on the group sizes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..reference.fp8_quant_grouped import PAD_ALIGN, padded_columns
from ..reference.fp8_transpose import check_args, check_grouped_args
from ..registry import implementation
from . import launch, on_device, traceable, unavailable_reason
from .access_analysis import writes

# Launch heuristics: module constants, so that tests can shrink them and the GPU session can tune them.
# 64 bytes of each row of q and of the output per tile: two whole 32-byte sectors each way.
TILE_ROWS = 64
TILE_COLS = 64
NUM_WARPS = 4
# fp8_transpose_grouped's tiles: TILE_Q_ROWS rows of q_t (bytes of each row of q) by TILE_PADDED padded columns. At
# the Mixtral and Qwen3-MoE operands on an H100 (bench_fp8_quant --moe), 128 bytes of q's rows ran at 90-95% of a
# copy's rate, 64 at 74-85%; 128 padded columns gained nothing over 64.
TILE_Q_ROWS = 128
TILE_PADDED = 64


@writes("OUT")
@triton.jit
def _fp8_transpose_kernel(
    Q,
    OUT,
    R,
    C,
    stride_qb,
    stride_qr,
    stride_qc,
    n_tile_cols,
    TILE_R: tl.constexpr,
    TILE_C: tl.constexpr,
):
    """Tile (program 0 // n_tile_cols, program 0 % n_tile_cols) of batch program 1: OUT[b, c, r] = Q[b, r, c]."""
    pid = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    rows = (pid // n_tile_cols) * TILE_R + tl.arange(0, TILE_R)
    cols = (pid % n_tile_cols) * TILE_C + tl.arange(0, TILE_C)
    rows64, cols64 = rows.to(tl.int64), cols.to(tl.int64)
    mask = (rows < R)[:, None] & (cols < C)[None, :]
    tile = tl.load(Q + b * stride_qb + rows64[:, None] * stride_qr + cols64[None, :] * stride_qc, mask=mask)
    tl.store(OUT + b * R * C + cols64[None, :] * R + rows64[:, None], tile, mask=mask)


@implementation("fp8_transpose", "triton", priority=20, unavailable_reason=unavailable_reason, traceable=traceable)
def fp8_transpose(q: torch.Tensor) -> torch.Tensor:
    """See ``..reference.fp8_transpose.fp8_transpose``."""
    check_args(q)
    batch, rows, cols = q.shape
    out = torch.empty((batch, cols, rows), dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    n_tile_cols = triton.cdiv(cols, TILE_COLS)
    grid = (triton.cdiv(rows, TILE_ROWS) * n_tile_cols, batch)
    with on_device(q.device):
        # FP8 travels as raw bytes (see .fp8_formats).
        launch(_fp8_transpose_kernel)[grid](
            q.view(torch.uint8),
            out.view(torch.uint8),
            rows,
            cols,
            *q.stride(),
            n_tile_cols,
            TILE_R=TILE_ROWS,
            TILE_C=TILE_COLS,
            num_warps=NUM_WARPS,
        )
    return out


@triton.jit
def _maximum(a, b):
    return tl.maximum(a, b)


# Shared with .fp8_quant_grouped's kernels, which import them from here (.fp8_quant imports this module).
@triton.jit
def _bounded_running_max(values, S):
    """Each group bound within [the previous one, S], as the reference bounds offs."""
    return tl.associative_scan(tl.minimum(tl.maximum(values, 0), S), 0, _maximum)


@triton.jit
def _padded_layout(OFFS, E, S, BLOCK_E: tl.constexpr, ALIGN: tl.constexpr):
    """(starts, ends, padded sizes, padded ends) of the groups in BLOCK_E lanes, as the reference computes them: ends
    bounded within [previous end, S], sizes rounded up to a non-zero multiple of ALIGN and summed; 0 past E."""
    e = tl.arange(0, BLOCK_E)
    in_e = e < E
    ends = _bounded_running_max(tl.load(OFFS + e, mask=in_e, other=0), S)
    starts = _bounded_running_max(tl.load(OFFS + e - 1, mask=in_e & (e > 0), other=0), S)
    padded = tl.where(in_e, tl.maximum(tl.cdiv(ends - starts, ALIGN), 1) * ALIGN, 0)
    return starts, ends, padded, tl.cumsum(padded, 0)


@triton.jit
def _repeated(values, times: tl.constexpr):
    """Each of ``values`` [N] ``times`` times in a row: [N * times]."""
    return tl.reshape(tl.broadcast_to(values[:, None], (values.shape[0], times)), (values.shape[0] * times,))


@writes("QT", "PADDED_OFFS")
@triton.jit
def _grouped_fp8_transpose_kernel(
    Q,
    QT,
    PADDED_OFFS,
    OFFS,
    S,
    C,
    S_PAD,
    E,
    stride_qs,
    stride_qc,
    ALIGN: tl.constexpr,
    BLOCK_E: tl.constexpr,
    TILE_P: tl.constexpr,
    TILE_C: tl.constexpr,
):
    """Tile (program 0, program 1) of QT [C, S_PAD] (contiguous), TILE_P columns by TILE_C rows: each column the row
    of Q its group puts there, else zeros; PADDED_OFFS from program (0, 0)."""
    e = tl.arange(0, BLOCK_E)
    in_e = e < E
    starts, ends, padded, padded_ends = _padded_layout(OFFS, E, S, BLOCK_E, ALIGN)
    padded_starts = padded_ends - padded
    tl.store(PADDED_OFFS + e, padded_ends, mask=in_e & (tl.program_id(0) == 0) & (tl.program_id(1) == 0))

    # Groups start at multiples of ALIGN: each run of ALIGN columns lies in one group, looked up once per run (a
    # compare per group) rather than per column. Past the last group, the last group's (where it holds no rows).
    p0 = tl.program_id(0) * TILE_P
    run_starts = p0 + tl.arange(0, TILE_P // ALIGN) * ALIGN
    group = tl.minimum(tl.sum((in_e[None, :] & (padded_ends[None, :] <= run_starts[:, None])).to(tl.int32), 1), E - 1)
    mine = e[None, :] == group[:, None]
    # Column p of the run holds q's row p + shift while p < held_end.
    shift = _repeated(tl.sum(tl.where(mine, (starts - padded_starts)[None, :], 0), 1), ALIGN)
    held_end = _repeated(tl.sum(tl.where(mine, (padded_starts + ends - starts)[None, :], 0), 1), ALIGN)

    p = p0 + tl.arange(0, TILE_P)
    cols = tl.program_id(1) * TILE_C + tl.arange(0, TILE_C)
    cols64 = cols.to(tl.int64)
    col_in = (cols < C)[None, :]
    rows64 = (p + shift).to(tl.int64)
    tile = tl.load(
        Q + rows64[:, None] * stride_qs + cols64[None, :] * stride_qc, mask=(p < held_end)[:, None] & col_in, other=0
    )
    tl.store(QT + cols64[None, :] * S_PAD + p[:, None], tile, mask=(p < S_PAD)[:, None] & col_in)


@implementation(
    "fp8_transpose_grouped", "triton", priority=20, unavailable_reason=unavailable_reason, traceable=traceable
)
def fp8_transpose_grouped(q: torch.Tensor, offs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """See ``..reference.fp8_transpose.fp8_transpose_grouped``."""
    check_grouped_args(q, offs)
    (rows, cols), groups = q.shape, offs.shape[0]
    s_pad = padded_columns(rows, groups)
    q_t = torch.empty((cols, s_pad), dtype=q.dtype, device=q.device)
    padded_offs = torch.empty(groups, dtype=torch.int32, device=q.device)
    # At least one tile of q_t's rows, whose program (0, 0) writes the padded offsets where C is 0.
    grid = (triton.cdiv(s_pad, TILE_PADDED), max(triton.cdiv(cols, TILE_Q_ROWS), 1))
    with on_device(q.device):
        launch(_grouped_fp8_transpose_kernel)[grid](
            q.view(torch.uint8),  # FP8 travels as raw bytes (see .fp8_formats)
            q_t.view(torch.uint8),
            padded_offs,
            offs,
            rows,
            cols,
            s_pad,
            groups,
            *q.stride(),
            ALIGN=PAD_ALIGN,
            BLOCK_E=max(16, triton.next_power_of_2(groups)),
            TILE_P=TILE_PADDED,
            TILE_C=TILE_Q_ROWS,
            num_warps=NUM_WARPS,
        )
    return q_t, padded_offs


__all__ = ["fp8_transpose", "fp8_transpose_grouped"]
