"""RMSNorm forward, plain and with the residual add, through aiter's CK kernels (``rmsnorm2d_fwd``,
``rmsnorm2d_fwd_with_add``); semantics: ``..reference.rmsnorm``. The backward stays with Triton and native.

aiter's kernels return no rstd, which the backward needs: it is computed here from the normalized input in one
more read (an fp32 norm per row). With the residual, aiter writes the rounded sum but normalizes the unrounded fp32
one (ck_tile's rmsnorm2d pipelines): y can differ from the reference, which normalizes the rounded sum, in its last
bit.

Priority: below Triton's (20), for that extra read; above native's (10). Chosen without measurements on AMD GPUs:
``impl="autotune"`` times the three.
"""

from __future__ import annotations

import torch

from ..registry import implementation, never
from . import module, unavailable_reason

PRIORITY = 15
# aiter's CK RMSNorm reads x, the residual and the weight in one precision (csrc/py_itfs_ck/rmsnorm_ck_kernels.cu).
DTYPES = (torch.bfloat16, torch.float16)


def supports_fwd(x: torch.Tensor, weight: torch.Tensor | None, residual: torch.Tensor | None, eps: float):
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
    """rstd = 1 / sqrt(mean(s^2) + eps) per row of s [rows, H], in fp32 (the norm upcasts as it reads)."""
    norm = torch.linalg.vector_norm(s, dim=-1, dtype=torch.float32)
    return torch.rsqrt(norm.square() / s.shape[-1] + eps)


# Arguments as in aiter's op_tests/test_rmsnorm2d.py (run_ck), passed by name: later aiter releases insert gemma_norm
# before use_model_sensitive_rmsnorm, both left at their defaults here (the plain RMSNorm).
@implementation(
    "rmsnorm_fwd",
    "aiter",
    priority=PRIORITY,
    unavailable_reason=unavailable_reason,
    traceable=never,
    supports=supports_fwd,
)
def rmsnorm_fwd(x: torch.Tensor, weight: torch.Tensor | None, residual: torch.Tensor | None, eps: float):
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
