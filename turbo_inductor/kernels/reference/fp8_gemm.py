"""The scaled FP8 GEMM in fp32: dequantize both operands, multiply, round once. It defines the semantics."""

from __future__ import annotations

import torch

from ..registry import implementation, never
from . import unavailable_reason

# The recipes' block lengths along a dimension, besides the whole dimension.
BLOCK_SIZES = (1, 32, 128)


def block_size(size: int, n_blocks: int) -> int:
    """The block length that cuts ``size`` into ``n_blocks`` (the last one possibly partial)."""
    for block in BLOCK_SIZES:
        if -(-size // block) == n_blocks:
            return block
    if n_blocks == 1:
        return max(size, 1)
    raise ValueError(
        f"turbo_inductor.fp8_gemm: {n_blocks} scales for a dimension of {size} match no block size "
        f"in {BLOCK_SIZES} nor the whole dimension"
    )


def expand_scale(scale: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Block scales ``[R/br, C/bc]`` expanded to one per element of ``[R, C]``: the dequantization multiplier."""
    rows, cols = shape
    block_rows, block_cols = block_size(rows, scale.shape[0]), block_size(cols, scale.shape[1])
    return scale.repeat_interleave(block_rows, 0).repeat_interleave(block_cols, 1)[:rows, :cols]


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * expand_scale(scale, q.shape)


# Never traced: torch 2.11's Inductor fails on the block-scale expansion ("unexpected group").
# The emulation stays one call in a graph.
@implementation("fp8_gemm", "reference", priority=0, unavailable_reason=unavailable_reason, traceable=never)
def fp8_gemm(a, a_scale, b, b_scale, out_dtype, fast_accum=False):
    """``dequant(a) @ dequant(b)^T`` in ``out_dtype``, for fp8 ``a [M, K]`` and ``b [N, K]`` with block scales.
    Always accumulates in fp32. ``fast_accum`` lets other implementations accumulate faster."""
    return (dequantize(a, a_scale) @ dequantize(b, b_scale).t()).to(out_dtype)
