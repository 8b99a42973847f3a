"""RMSNorm through the native kernels of ``csrc/rmsnorm.cu``. Semantics: ``..reference.rmsnorm``."""

from __future__ import annotations

import torch
from torch import Tensor
from torch import dtype as DType

from ..registry import implementation
from . import ops, unavailable_reason

# A row stays in registers between the kernels' passes: at most 32 KiB.
# That is 16384 bf16 or 8192 fp32 elements.
MAX_ROW_BYTES = 32768
# Below Triton (20): on the H200 the forward ties and the backward is slower.
PRIORITY = 10


def _contiguous(t: torch.Tensor | None) -> torch.Tensor | None:
    return t.contiguous() if t is not None else None


def _supports(x: torch.Tensor, weight: torch.Tensor | None) -> str | None:
    if x.shape[-1] * x.element_size() > MAX_ROW_BYTES:
        return f"rows of at most {MAX_ROW_BYTES} bytes, got {x.shape[-1]} x {x.element_size()}"
    if weight is not None and weight.dtype not in (x.dtype, torch.float32):
        return f"a weight of x's dtype or float32, got {weight.dtype} for {x.dtype}"
    return None


def supports_fwd(x, weight, residual, eps, out_dtype=None) -> str | None:
    if residual is not None and residual.dtype != x.dtype:
        return f"a residual of x's dtype, got {residual.dtype} for {x.dtype}"
    if out_dtype not in (None, x.dtype):
        return f"y in x's dtype, got {out_dtype} for {x.dtype}"
    return _supports(x, weight)


def supports_bwd(dy, x, weight, rstd, dresidual) -> str | None:
    if dy.dtype != x.dtype:
        return f"dy of x's dtype, got {dy.dtype} for {x.dtype}"
    return _supports(x, weight)


@implementation(
    "rmsnorm_fwd", "native", priority=PRIORITY, unavailable_reason=unavailable_reason, supports=supports_fwd
)
def rmsnorm_fwd(x: Tensor, weight: Tensor | None, residual: Tensor | None, eps: float, out_dtype: DType | None = None):
    y, s_out, rstd = ops().rmsnorm_fwd(x.contiguous(), _contiguous(weight), _contiguous(residual), eps)
    return y, (s_out if residual is not None else None), rstd


@implementation(
    "rmsnorm_bwd", "native", priority=PRIORITY, unavailable_reason=unavailable_reason, supports=supports_bwd
)
def rmsnorm_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, rstd: torch.Tensor, dresidual: torch.Tensor | None
):
    dx, dw = ops().rmsnorm_bwd(
        dy.contiguous(), x.contiguous(), _contiguous(weight), rstd.contiguous(), _contiguous(dresidual)
    )
    return dx, (dw if weight is not None else None)
