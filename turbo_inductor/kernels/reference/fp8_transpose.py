"""FP8 operands transposed in plain PyTorch: q [B, R, C] to [B, C, R], contiguous, the same bytes. It defines the
semantics. An MoE weight's dgrad operand is its forward copy transposed (``ops/fp8_operands.py``), so W is quantized
once, not once per layout."""

from __future__ import annotations

import torch

from ..registry import implementation
from . import traced_off_cpu, unavailable_reason
from .fp8_quant import FP8_DTYPES


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


__all__ = ["fp8_transpose", "check_args"]
