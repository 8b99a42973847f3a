"""FP8 operands transposed in Triton: q [B, R, C] to [B, C, R], contiguous. Semantics: ``..reference.fp8_transpose``.

One program per tile of TILE_ROWS x TILE_COLS bytes: loads run along q's rows, stores along the output's, and the
compiler transposes through shared memory between them, so both stay coalesced. Two bytes move per element, where
quantizing W a second time for the other layout reads two and writes one.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..reference.fp8_transpose import check_args
from ..registry import implementation
from . import launch, on_device, traceable, unavailable_reason
from .access_analysis import writes

# Launch heuristics: module constants, so that tests can shrink them and the GPU session can tune them.
# 64 bytes of each row of q and of the output per tile: two whole 32-byte sectors each way.
TILE_ROWS = 64
TILE_COLS = 64
NUM_WARPS = 4


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


__all__ = ["fp8_transpose"]
