"""FP8 operands transposed in plain PyTorch: q [B, R, C] to [B, C, R], contiguous, the same bytes. It defines the
semantics. An MoE weight's dgrad operand is its forward copy transposed (``ops/fp8_operands.py``), so W is quantized
once, not once per layout.

``fp8_transpose_grouped`` moves q [S, C]'s bytes, rows grouped by ``offs``, into the padded per-group layout of
``fp8_quantize_grouped``'s q_t [C, S_pad]: the FP8 wgrad's operand transposed from its rowwise copy, not quantized
a second time."""

from __future__ import annotations

import torch

from ..registry import implementation
from . import traced_off_cpu, unavailable_reason
from .fp8_quant import FP8_DTYPES
from .fp8_quant_grouped import group_layout, padded_columns


def check_args(q: torch.Tensor) -> None:
    """The argument checks every implementation makes; raises ValueError."""
    if q.dim() != 3 or q.dtype not in FP8_DTYPES:
        raise ValueError(
            f"turbo_inductor: fp8_transpose expects a 3-D FP8 tensor {FP8_DTYPES}, got {tuple(q.shape)} {q.dtype}"
        )


@implementation(
    "fp8_transpose", "reference", priority=0, unavailable_reason=unavailable_reason, traceable=traced_off_cpu
)
def fp8_transpose(q: torch.Tensor) -> torch.Tensor:
    """``q`` [B, R, C], any strides, as [B, C, R] in row-major strides."""
    check_args(q)
    return q.transpose(1, 2).clone(memory_format=torch.contiguous_format)


def check_grouped_args(q: torch.Tensor, offs: torch.Tensor) -> None:
    """``fp8_transpose_grouped``'s argument checks, every implementation's; raises ValueError."""
    if q.dim() != 2 or q.dtype not in FP8_DTYPES:
        raise ValueError(
            f"turbo_inductor: fp8_transpose_grouped expects a 2-D FP8 q {FP8_DTYPES}, got {tuple(q.shape)} {q.dtype}"
        )
    if offs.dim() != 1 or offs.dtype != torch.int32 or offs.shape[0] < 1:
        raise ValueError(
            f"turbo_inductor: fp8_transpose_grouped expects offs of at least one group, 1-D int32, got "
            f"{tuple(offs.shape)} {offs.dtype}"
        )
    if offs.device != q.device:
        raise ValueError(
            f"turbo_inductor: fp8_transpose_grouped expects offs on q's device {q.device}, got {offs.device}"
        )


@implementation(
    "fp8_transpose_grouped", "reference", priority=0, unavailable_reason=unavailable_reason, traceable=traced_off_cpu
)
def fp8_transpose_grouped(q: torch.Tensor, offs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q_t [C, S_pad] contiguous, padded_offs [E] int32)`` of q [S, C], any strides: the layout of
    ``..fp8_quant_grouped.fp8_quantize_grouped``'s q_t, q's bytes as they are in place of the quantized ones."""
    check_grouped_args(q, offs)
    (rows, cols), groups = q.shape, offs.shape[0]
    starts, ends, padded_starts, padded_ends = group_layout(offs, rows)
    # Each column of q_t: its group and the row of q it holds, where it holds one; else q's appended zero row.
    column = torch.arange(padded_columns(rows, groups), device=q.device)
    group = torch.searchsorted(padded_ends, column, right=True).clamp_max(groups - 1)
    row = starts[group] + column - padded_starts[group]
    source = torch.where(row < ends[group], row, rows)
    bytes_and_zeros = torch.cat([q.view(torch.uint8), q.new_zeros((1, cols), dtype=torch.uint8)])
    q_t = bytes_and_zeros[source].t().contiguous().view(q.dtype)
    return q_t, padded_ends.to(torch.int32)


__all__ = ["fp8_transpose", "fp8_transpose_grouped", "check_args", "check_grouped_args"]
