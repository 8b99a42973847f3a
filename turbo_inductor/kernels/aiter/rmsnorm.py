"""RMSNorm forward, plain and with residual, through aiter's CK kernels. Semantics: ``..reference.rmsnorm``.
aiter returns no rstd, so it is recomputed in one more read. See docs/kernels.md, RMSNorm.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch import dtype as DType

from ..registry import implementation, never
from . import module, unavailable_reason

PRIORITY = 15  # below Triton (20) for the extra read; above native (10)
# aiter's CK RMSNorm reads x, residual and weight in one precision.
DTYPES = (torch.bfloat16, torch.float16)


def supports_fwd(x: Tensor, weight: Tensor | None, residual: Tensor | None, eps: float, out_dtype: DType | None = None):
    if out_dtype not in (None, x.dtype):
        return f"y in x's dtype, got {out_dtype} for {x.dtype}"
    if x.dtype not in DTYPES:
        return f"bfloat16 or float16 x only (aiter's CK kernels), got {x.dtype}"
    if x.numel() == 0:
        return "a non-empty x"
    if weight is None:
        return "a weight (aiter's kernels always multiply by one)"
    if weight.dtype != x.dtype:
        return f"a weight of x's dtype (aiter reads it in x's precision), got {weight.dtype} for {x.dtype}"
    if residual is not None and residual.dtype != x.dtype:
        return f"a residual of x's dtype, got {residual.dtype} for {x.dtype}"
    return None


def inverse_rms(s: torch.Tensor, eps: float) -> torch.Tensor:
    """``rstd = 1 / sqrt(mean(s^2) + eps)`` per row of s, in fp32. The norm upcasts as it reads."""
    norm = torch.linalg.vector_norm(s, dim=-1, dtype=torch.float32)
    return torch.rsqrt(norm.square() / s.shape[-1] + eps)


# Keywords, because later aiter releases insert gemma_norm before use_model_sensitive_rmsnorm.
# Both keep their defaults: the plain RMSNorm.
@implementation(
    "rmsnorm_fwd",
    "aiter",
    priority=PRIORITY,
    unavailable_reason=unavailable_reason,
    traceable=never,
    supports=supports_fwd,
)
def rmsnorm_fwd(x: Tensor, weight: Tensor | None, residual: Tensor | None, eps: float, out_dtype: DType | None = None):
    """``(y, s_out, rstd)`` as ``..reference.rmsnorm.rmsnorm_fwd`` returns them."""
    aiter = module()
    x, weight, eps = x.contiguous(), weight.contiguous(), float(eps)
    if residual is None:
        y = aiter.rmsnorm2d_fwd(input=x, weight=weight, epsilon=eps)
        return y, None, inverse_rms(x, eps)
    y, s_out = torch.empty_like(x), torch.empty_like(x)
    aiter.rmsnorm2d_fwd_with_add(
        out=y, input=x, residual_in=residual.contiguous(), residual_out=s_out, weight=weight, epsilon=eps
    )
    return y, s_out, inverse_rms(s_out, eps)
