"""RMSNorm in plain PyTorch, optionally fused with a residual add. It defines the semantics.
With a residual, ``s = x + residual`` is rounded to the add's dtype, then normalized.
``rstd`` is fp32, one per row; ``y = s * rstd * weight`` is rounded once. See docs/kernels.md, RMSNorm.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch import dtype as DType

from ..registry import implementation
from . import traced_off_cpu, unavailable_reason
from .fp8_quant import fp8_quantize


def sum_dtype(x: torch.Tensor, residual: torch.Tensor | None) -> torch.dtype:
    """The dtype of the sum and of y: x's, promoted with the residual's."""
    return x.dtype if residual is None else torch.promote_types(x.dtype, residual.dtype)


@implementation("rmsnorm_fwd", "reference", priority=0, unavailable_reason=unavailable_reason, traceable=traced_off_cpu)
def rmsnorm_fwd(x: Tensor, weight: Tensor | None, residual: Tensor | None, eps: float, out_dtype: DType | None = None):
    """Returns ``(y, s_out, rstd)``. ``s_out`` is the rounded sum, None without a residual.
    ``rstd`` is fp32, one per row. y is in ``out_dtype`` where given (autocast's cast of it), else the sum's."""
    return _rmsnorm(x, weight, residual, eps, out_dtype)


def _rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    residual: torch.Tensor | None,
    eps: float,
    out_dtype: torch.dtype | None,
):
    """As :func:`rmsnorm_fwd`, with y rounded once from fp32 to ``out_dtype`` when given."""
    if residual is not None:
        s_out = (x.float() + residual.float()).to(sum_dtype(x, residual))
        s = s_out
    else:
        s_out = None
        s = x
    s32 = s.float()
    rstd = torch.rsqrt(s32.square().mean(dim=-1) + eps)
    y = s32 * rstd.unsqueeze(-1)
    if weight is not None:
        y = y * weight.float()
    # ``.to`` may return its input (fp32). Here that is a fresh temporary, never an alias of x.
    return y.to(out_dtype or s.dtype).contiguous(), s_out, rstd


@implementation(
    "rmsnorm_fwd_fp8", "reference", priority=0, unavailable_reason=unavailable_reason, traceable=traced_off_cpu
)
def rmsnorm_fwd_fp8(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    residual: torch.Tensor | None,
    eps: float,
    fp8_dtype: torch.dtype,
    block_cols: int,
    power_of_two: bool = False,
    out_dtype: torch.dtype | None = None,
):
    """Returns ``(y, s_out, rstd, q, scale)``: :func:`rmsnorm_fwd`'s outputs and the FP8 copy of y.
    The rounded y is quantized in blocks of 1 x ``block_cols``, as ``fp8_quantize`` does it."""
    y, s_out, rstd = _rmsnorm(x, weight, residual, eps, out_dtype)
    return y, s_out, rstd, *fp8_quantize(y, fp8_dtype, 1, block_cols, False, power_of_two=power_of_two)


@implementation("rmsnorm_bwd", "reference", priority=0, unavailable_reason=unavailable_reason, traceable=traced_off_cpu)
def rmsnorm_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, rstd: torch.Tensor, dresidual: torch.Tensor | None
):
    """Returns ``(dx, dw)``. ``x`` is the normalized input: the rounded sum when there was a residual.
    ``dresidual``, the residual stream's gradient, is added to dx."""
    dy32 = dy.float()
    s32 = x.float()
    r = rstd.float().unsqueeze(-1)
    dyw = dy32 * weight.float() if weight is not None else dy32
    c = (dyw * s32).mean(dim=-1, keepdim=True)
    dx = r * (dyw - s32 * (r * r * c))
    if dresidual is not None:
        dx = dx + dresidual.float()
    dw = None
    if weight is not None:
        dw = (dy32 * s32 * r).sum(dim=0).to(weight.dtype)
    return dx.to(x.dtype).contiguous(), dw
