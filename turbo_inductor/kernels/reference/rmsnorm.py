"""RMSNorm (optionally fused with a residual add) in plain PyTorch.

This file sets the semantics every other implementation must match:

* with a residual, ``s = x + residual`` is computed in fp32 and rounded to the add's dtype (x's, or the promotion
  of x's and the residual's where they differ); the norm is applied to that rounded ``s``, so the fused op equals
  the unfused "add, then norm" program bit for bit in ``s``;
* ``rstd = 1 / sqrt(mean(s^2) + eps)`` in fp32, one value per row;
* ``y = s * rstd * weight`` computed in fp32 and rounded to ``s``'s dtype once.
"""

from __future__ import annotations

import torch

from ..registry import implementation
from . import unavailable_reason
from .fp8_quant import fp8_quantize


def sum_dtype(x: torch.Tensor, residual: torch.Tensor | None) -> torch.dtype:
    """The dtype of the sum ``x + residual`` and of y: x's, or the promotion of x's and the residual's."""
    return x.dtype if residual is None else torch.promote_types(x.dtype, residual.dtype)


@implementation("rmsnorm_fwd", "reference", priority=0, unavailable_reason=unavailable_reason)
def rmsnorm_fwd(x: torch.Tensor, weight: torch.Tensor | None, residual: torch.Tensor | None, eps: float):
    """Returns ``(y, s_out, rstd)``: ``y`` [rows, H] in s's dtype, ``s_out`` the rounded ``x + residual``
    (None without a residual), ``rstd`` [rows] fp32."""
    return _rmsnorm(x, weight, residual, eps, None)


def _rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    residual: torch.Tensor | None,
    eps: float,
    out_dtype: torch.dtype | None,
):
    """:func:`rmsnorm_fwd`, y in ``out_dtype`` if given (rounded to it from fp32 once, as casting the output to it
    would round it)."""
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
    # ``.to`` may return its input unchanged (fp32): that is a fresh temporary here, never an alias of x.
    return y.to(out_dtype or s.dtype).contiguous(), s_out, rstd


@implementation("rmsnorm_fwd_fp8", "reference", priority=0, unavailable_reason=unavailable_reason)
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
    """Returns ``(y, s_out, rstd, q, scale)``: :func:`rmsnorm_fwd`'s outputs (y in ``out_dtype`` if given) and y
    (as rounded to its dtype)
    quantized in blocks of 1 x ``block_cols``, as ``fp8_quantize(y, fp8_dtype, 1, block_cols)`` does it."""
    y, s_out, rstd = _rmsnorm(x, weight, residual, eps, out_dtype)
    return y, s_out, rstd, *fp8_quantize(y, fp8_dtype, 1, block_cols, False, power_of_two=power_of_two)


@implementation("rmsnorm_bwd", "reference", priority=0, unavailable_reason=unavailable_reason)
def rmsnorm_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, rstd: torch.Tensor, dresidual: torch.Tensor | None
):
    """Returns ``(dx, dw)``. ``x`` is the normalized input (the rounded sum when the forward had a residual);
    ``dresidual``, when given, is added to ``dx`` (the residual stream's gradient)."""
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
