"""Scaled FP8 GEMM through ``torch._scaled_mm`` (cuBLASLt / hipBLASLt): tensorwise and rowwise scales.

Other granularities (blockwise 1x128 / 128x128, MXFP8) have no vendor path in torch 2.11: they run emulated
(``reference.fp8_gemm``); our Triton FP8 GEMM is opt-in (``..triton.fp8_gemm`` says why).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..registry import implementation
from . import unavailable_reason

# cuBLASLt takes fp8 operands whose dimensions are multiples of 16: other row counts are zero-padded.
ALIGN = 16


def _tensorwise(a_scale, b_scale) -> bool:
    return a_scale.numel() == 1 and b_scale.numel() == 1


def supports(a, a_scale, b, b_scale, out_dtype) -> str | None:
    m, n = a.shape[0], b.shape[0]
    if not (_tensorwise(a_scale, b_scale) or (a_scale.shape == (m, 1) and b_scale.shape == (n, 1))):
        return "torch._scaled_mm takes tensorwise and rowwise scales only"
    if a.shape[1] % ALIGN or n % ALIGN:
        return f"torch._scaled_mm needs K and N multiples of {ALIGN}"
    return None


@implementation("fp8_gemm", "vendor", priority=30, unavailable_reason=unavailable_reason, supports=supports)
def fp8_gemm(a, a_scale, b, b_scale, out_dtype):
    m, n = a.shape[0], b.shape[0]
    tensorwise = _tensorwise(a_scale, b_scale)
    rowwise = not tensorwise
    pad = -m % ALIGN
    if pad:
        a = F.pad(a.view(torch.uint8), (0, 0, 0, pad)).view(a.dtype)
        if rowwise:
            a_scale = F.pad(a_scale, (0, 0, 0, pad), value=1.0)
    if tensorwise:
        out = torch._scaled_mm(a, b.t(), scale_a=a_scale.reshape(()), scale_b=b_scale.reshape(()),
                               out_dtype=out_dtype)
    else:
        out = torch._scaled_mm(a, b.t(), scale_a=a_scale, scale_b=b_scale.reshape(1, n), out_dtype=out_dtype)
    return out[:m] if pad else out
