"""Scaled FP8 GEMM through aiter's CK a8w8 kernels. Semantics and signature: ``..reference.fp8_gemm``.
Rowwise (``gemm_a8w8``) and 1x128 x 128x128 blocks (``gemm_a8w8_blockscale``); e4m3 operands only.
See docs/kernels.md, FP8 GEMM.
"""

from __future__ import annotations

import torch

from ..reference.fp8_gemm import block_size
from ..registry import WRITES_FLOAT32, implementation, never
from . import fp8_formats, module, unavailable_reason

PRIORITY = 40  # above vendor (30) and Triton (10): AMD tunes these per shape for MI300 and MI350
BLOCK = 128
# CK loads 16-byte vectors along K and writes rows of N.
ALIGN = 16
OUT_DTYPES = (torch.bfloat16, torch.float16)


def _granularity(a, a_scale, b, b_scale) -> tuple[str | None, str | None]:
    """``(granularity, None)`` for scales aiter takes, else ``(None, why not)``."""
    (m, k), n = a.shape, b.shape[0]
    if a_scale.numel() in (1, m) and a_scale.shape[-1] == 1 and b_scale.numel() in (1, n) and b_scale.shape[-1] == 1:
        return "rowwise", None
    blocks = (
        block_size(m, a_scale.shape[0]),
        block_size(k, a_scale.shape[1]),
        block_size(n, b_scale.shape[0]),
        block_size(k, b_scale.shape[1]),
    )
    if blocks != (1, BLOCK, BLOCK, BLOCK) or k % BLOCK:
        return (
            None,
            f"scales per row (or tensor) of a and b, or 1x{BLOCK} x {BLOCK}x{BLOCK} with K a multiple of {BLOCK}",
        )
    return "block", None


def supports(a, a_scale, b, b_scale, out_dtype, fast_accum=False) -> str | None:
    granularity, reason = _granularity(a, a_scale, b, b_scale)
    if granularity is None:
        return reason
    if a.dtype not in fp8_formats.E4M3 or b.dtype not in fp8_formats.E4M3:
        return f"e4m3 operands only (aiter's a8w8 kernels), got {a.dtype} and {b.dtype}"
    if out_dtype not in OUT_DTYPES:
        return f"a bfloat16 or float16 output only, got {out_dtype}"
    if a.shape[0] == 0 or a.shape[1] % ALIGN or b.shape[0] % ALIGN:
        return f"M > 0 and K, N multiples of {ALIGN}, got a {list(a.shape)} and b {list(b.shape)}"
    return None


# aiter reads rowwise scales as [M, 1] and [N, 1]. Tensorwise scales are repeated per row.
# Block scales are [M, K/128] and [N/128, K/128], row-major.
@implementation(
    "fp8_gemm",
    "aiter",
    priority=PRIORITY,
    unavailable_reason=unavailable_reason,
    traceable=never,
    supports=supports,
    capabilities={WRITES_FLOAT32: lambda a, a_scale, b, b_scale: False},
)
def fp8_gemm(a, a_scale, b, b_scale, out_dtype, fast_accum=False):
    """``dequant(a) @ dequant(b)^T`` in ``out_dtype``, for e4m3 ``a [M, K]`` and ``b [N, K]`` with scales."""
    aiter = module()
    granularity, _ = _granularity(a, a_scale, b, b_scale)
    e4m3 = fp8_formats.aiter_e4m3(a.device)
    a, a_scale = fp8_formats.to_format(a.contiguous(), a_scale.float(), e4m3)
    b, b_scale = fp8_formats.to_format(b.contiguous(), b_scale.float(), e4m3)
    if granularity == "rowwise":
        x_scale = a_scale.reshape(-1, 1).expand(a.shape[0], 1).contiguous()
        w_scale = b_scale.reshape(-1, 1).expand(b.shape[0], 1).contiguous()
        return aiter.gemm_a8w8(XQ=a, WQ=b, x_scale=x_scale, w_scale=w_scale, dtype=out_dtype)
    return aiter.gemm_a8w8_blockscale(
        XQ=a, WQ=b, x_scale=a_scale.contiguous(), w_scale=b_scale.contiguous(), dtype=out_dtype
    )
