"""Scaled FP8 GEMM through ``torch._scaled_mm``: tensorwise and rowwise scales everywhere.
On Hopper with CUDA >= 12.9 also DeepSeek's 1x128 blocks. The Triton FP8 GEMM takes what this declines.
See docs/kernels.md, FP8 GEMM.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ..reference.fp8_gemm import block_size
from ..registry import WRITES_FLOAT32, implementation
from . import unavailable_reason

# cuBLASLt needs fp8 dimensions that are multiples of 16. Other row counts are zero-padded.
ALIGN = 16
# DeepSeek's blocks are 128 long along K: 1x128 rows and 128x128 tiles.
DEEPSEEK_BLOCK = 128
# cuBLASLt reads 128x128 scales in rows padded to a multiple of this many K blocks.
DEEPSEEK_K_BLOCKS_MULTIPLE = 4


@functools.cache
def deepseek_unsupported(device: torch.device) -> str | None:
    """None where cuBLASLt runs DeepSeek's block scaling on this GPU, else why not."""
    if torch.version.cuda is None:
        return "block-scaled torch._scaled_mm is cuBLASLt's (CUDA), not hipBLASLt's"
    if tuple(int(v) for v in torch.version.cuda.split(".")[:2]) < (12, 9):
        return f"block-scaled torch._scaled_mm needs CUDA >= 12.9, this torch has {torch.version.cuda}"
    if torch.cuda.get_device_capability(device) != (9, 0):
        return "cuBLASLt's 1x128 / 128x128 block scaling runs on sm_90 (Hopper) only"
    return None


def _granularity(a, a_scale, b, b_scale) -> tuple[str | None, str | None]:
    """``(granularity, None)`` for scales ``torch._scaled_mm`` takes, else ``(None, why not)``.
    Granularities: "tensorwise", "rowwise", "block_128x128" (b in 128x128 blocks) and "block_1x128"."""
    (m, k), n = a.shape, b.shape[0]
    if a_scale.numel() == 1 and b_scale.numel() == 1:
        return "tensorwise", None
    if a_scale.shape == (m, 1) and b_scale.shape == (n, 1):
        return "rowwise", None
    blocks = (
        block_size(m, a_scale.shape[0]),
        block_size(k, a_scale.shape[1]),
        block_size(n, b_scale.shape[0]),
        block_size(k, b_scale.shape[1]),
    )
    if blocks not in ((1, DEEPSEEK_BLOCK, DEEPSEEK_BLOCK, DEEPSEEK_BLOCK), (1, DEEPSEEK_BLOCK, 1, DEEPSEEK_BLOCK)):
        return None, "torch._scaled_mm takes tensorwise, rowwise and 1x128 x (128x128 | 1x128) scales only"
    reason = deepseek_unsupported(a.device)
    if reason is None and k % DEEPSEEK_BLOCK:
        reason = f"block-scaled torch._scaled_mm needs K a multiple of {DEEPSEEK_BLOCK}, got {k}"
    if (
        reason is None
        and blocks[2] == DEEPSEEK_BLOCK
        and (n % DEEPSEEK_BLOCK or (k // DEEPSEEK_BLOCK) % DEEPSEEK_K_BLOCKS_MULTIPLE)
    ):
        reason = (
            f"128x128-scaled torch._scaled_mm needs N a multiple of {DEEPSEEK_BLOCK} and K of "
            f"{DEEPSEEK_BLOCK * DEEPSEEK_K_BLOCKS_MULTIPLE}, got N={n}, K={k}"
        )
    return (None, reason) if reason else ("block_128x128" if blocks[2] == DEEPSEEK_BLOCK else "block_1x128", None)


def supports(a, a_scale, b, b_scale, out_dtype, fast_accum=False) -> str | None:
    granularity, reason = _granularity(a, a_scale, b, b_scale)
    if granularity is None:
        return reason
    if a.shape[1] % ALIGN or b.shape[0] % ALIGN:
        return f"torch._scaled_mm needs K and N multiples of {ALIGN}"
    if granularity.startswith("block") and out_dtype != torch.bfloat16:
        return f"block-scaled torch._scaled_mm writes bfloat16, not {out_dtype}"
    if out_dtype == torch.float32 and not _writes_float32(granularity, a.device):
        return "rowwise torch._scaled_mm writes float32 through cuBLASLt only: on sm_90 with CUDA >= 12.9"
    return None


def _writes_float32(granularity: str, device: torch.device) -> bool:
    """Whether torch._scaled_mm writes float32 at these scales: tensorwise everywhere; rowwise through cuBLASLt, on
    sm_90 from CUDA 12.9 (elsewhere CUTLASS's and hipBLASLt's rowwise kernels write bf16 only); blocks never."""
    if granularity == "tensorwise":
        return True
    return granularity == "rowwise" and deepseek_unsupported(device) is None


def writes_float32(a, a_scale, b, b_scale) -> bool:
    granularity, _ = _granularity(a, a_scale, b, b_scale)
    return granularity is not None and _writes_float32(granularity, a.device)


def _scales(granularity: str, a_scale, b_scale, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The scales in the shapes and layouts ``torch._scaled_mm(a, b^T)`` reads.
    cuBLASLt reads 1x128 scales K-block-major, and 128x128 scales as [N/128, K/128] rows."""
    if granularity == "tensorwise":
        return a_scale.reshape(()), b_scale.reshape(())
    if granularity == "rowwise":
        return a_scale, b_scale.reshape(1, n)
    a_scale = a_scale.t().contiguous().t()  # [M, K/128], strides (1, M)
    return a_scale, (b_scale.t() if granularity == "block_128x128" else b_scale.t().contiguous())


@implementation(
    "fp8_gemm",
    "vendor",
    priority=30,
    unavailable_reason=unavailable_reason,
    supports=supports,
    capabilities={WRITES_FLOAT32: writes_float32},
)
def fp8_gemm(a, a_scale, b, b_scale, out_dtype, fast_accum=False):
    granularity, _ = _granularity(a, a_scale, b, b_scale)
    m, n = a.shape[0], b.shape[0]
    pad = -m % ALIGN
    if pad:
        a = F.pad(a.view(torch.uint8), (0, 0, 0, pad)).view(a.dtype)
        if granularity != "tensorwise":  # a row of scales per row of a: padded alike
            a_scale = F.pad(a_scale, (0, 0, 0, pad), value=1.0)
    scale_a, scale_b = _scales(granularity, a_scale, b_scale, n)
    # Block scaling promotes sums to fp32 every 128 along K by itself: no fast mode is asked.
    fast_accum = fast_accum and not granularity.startswith("block")
    out = torch._scaled_mm(a, b.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype, use_fast_accum=fast_accum)
    return out[:m] if pad else out
