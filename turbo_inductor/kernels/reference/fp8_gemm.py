"""The scaled FP8 GEMM emulated in fp32: dequantize both operands, multiply, round once. Sets the semantics."""

from __future__ import annotations

import torch

from ..registry import implementation, never
from . import unavailable_reason

# The scaling blocks the FP8 recipes use along one dimension (besides the whole dimension).
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
    """A block scale [R/br, C/bc] broadcast to every element of a [R, C] tensor (the dequantization multiplier)."""
    rows, cols = shape
    block_rows, block_cols = block_size(rows, scale.shape[0]), block_size(cols, scale.shape[1])
    return scale.repeat_interleave(block_rows, 0).repeat_interleave(block_cols, 1)[:rows, :cols]


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * expand_scale(scale, q.shape)


# Never traced: in a graph, the block-scale expansion fails Inductor's codegen in torch 2.11, on CPU and GPU
# ("unexpected group"); the emulation stays one call.
@implementation("fp8_gemm", "reference", priority=0, unavailable_reason=unavailable_reason, traceable=never)
def fp8_gemm(a, a_scale, b, b_scale, out_dtype, fast_accum=False):
    """a [M, K], b [N, K] fp8 with block scales; returns dequant(a) @ dequant(b)^T in ``out_dtype``.
    ``fast_accum`` lets an implementation accumulate in lower precision (the vendor GEMM on Hopper); this one
    accumulates in fp32 regardless."""
    return (dequantize(a, a_scale) @ dequantize(b, b_scale).t()).to(out_dtype)
