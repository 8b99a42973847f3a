"""FP8 quantization through aiter's HIP kernels: tensorwise, rowwise and 1x128 blocks, in x's layout.
Semantics: ``..reference.fp8_quant``, except that aiter's scales can differ in the last bit.
See docs/kernels.md, FP8 quantization.
"""

from __future__ import annotations

import functools

import torch

from ..reference.fp8_quant import AMAX_FLOOR, FP8_DTYPES, check_args
from ..registry import implementation, never
from . import fp8_formats, module, unavailable_reason

PRIORITY = 10  # below Triton (20) and native (30), which equal the reference bit for bit
GROUP = 128  # the 1x128 blocks; aiter also takes 32 and 64, which no recipe uses
# aiter's quantization kernels read bf16 or fp16 in 16-byte vectors.
DTYPES = (torch.bfloat16, torch.float16)
ROW_MULTIPLE = 16


def _granularity(M: int, K: int, block_rows: int, block_cols: int) -> str | None:
    br, bc = min(block_rows, M), min(block_cols, K)
    if br == M and bc == K:
        return "tensor"
    if br == 1 and bc == K:
        return "rows"
    return "groups" if br == 1 and bc == GROUP and K % GROUP == 0 else None


def supports(
    x: torch.Tensor,
    fp8_dtype: torch.dtype,
    block_rows: int,
    block_cols: int,
    transpose: bool,
    power_of_two: bool = False,
    both_layouts: bool = False,
    block_cols_t: int = 0,
    scale: torch.Tensor | None = None,
) -> str | None:
    if x.dim() != 2 or block_rows < 1 or block_cols < 1 or fp8_dtype not in FP8_DTYPES:
        return None  # invalid for every implementation: the call raises the error
    if scale is not None:
        return "no given scale: the kernels take their blocks' maxima themselves"
    M, K = x.shape
    if transpose or both_layouts:
        return "x's own layout only (aiter writes no transposed copy)"
    if power_of_two:
        return "scales of amax / fmax only, not powers of two"
    if _granularity(M, K, block_rows, block_cols) is None:
        return f"blocks of the whole tensor, of rows or 1 x {GROUP} only, got {block_rows} x {block_cols} on {M} x {K}"
    if x.dtype not in DTYPES:
        return f"bfloat16 or float16 x only (aiter's kernels), got {x.dtype}"
    if M == 0 or K % ROW_MULTIPLE:
        return f"non-empty rows of a multiple of {ROW_MULTIPLE} elements (aiter loads 16-byte vectors), got {M} x {K}"
    if not x.is_contiguous():
        return "contiguous input only"
    if fp8_dtype != fp8_formats.aiter_e4m3(x.device):
        return f"aiter quantizes into {fp8_formats.aiter_e4m3(x.device)} on this GPU, not {fp8_dtype}"
    return None


@functools.cache
def _floor_scale(fp8_dtype: torch.dtype) -> float:
    """The reference's scale of an all-zero block: 1e-12 / fmax, an fp32 division."""
    return (torch.tensor(AMAX_FLOOR) / torch.tensor(torch.finfo(fp8_dtype).max)).item()


def _repair_zero_blocks(q: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Repairs all-zero blocks, which aiter leaves with scale 0 and NaN codes.
    They get zero codes and the reference's floored scale."""
    zero = scale == 0
    q.view(torch.uint8).view(*scale.shape, -1).masked_fill_(zero.unsqueeze(-1), 0)
    return q, scale.masked_fill(zero, _floor_scale(q.dtype))


# Calls as aiter's own quantization tests make them: per tensor, per token, per 1x128.
@implementation(
    "fp8_quantize",
    "aiter",
    priority=PRIORITY,
    unavailable_reason=unavailable_reason,
    traceable=never,
    supports=supports,
)
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
    """``(q, scale)``; see ``..reference.fp8_quant.fp8_quantize`` and docs/kernels.md for the differences."""
    check_args(x, fp8_dtype, block_rows, block_cols, transpose, both_layouts, block_cols_t, scale)
    if scale is not None:
        raise ValueError("turbo_inductor: the aiter fp8_quantize takes no given scale (the Triton one does)")
    aiter = module()
    M, K = x.shape
    granularity = _granularity(M, K, block_rows, block_cols)
    if granularity == "tensor":
        amax = torch.linalg.vector_norm(x, float("inf"), dtype=torch.float32)  # max |x|; NaN propagates
        scale = amax.clamp_min(AMAX_FLOOR) / torch.full_like(amax, torch.finfo(fp8_dtype).max)
        q, _ = aiter.per_tensor_quant_hip(x, scale=scale.reshape(1), quant_dtype=fp8_dtype)
        return q, scale.reshape(1, 1)
    if granularity == "rows":
        q, scale = aiter.per_token_quant_hip(x, quant_dtype=fp8_dtype)
    else:
        q, scale = aiter.per_group_quant_hip(x, quant_dtype=fp8_dtype, group_size=GROUP)
    return _repair_zero_blocks(q, scale.view(M, -1))
