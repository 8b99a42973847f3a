"""RMSNorm: ``y = x / sqrt(mean(x^2, -1) + eps) * weight``, computed in fp32, returned in x's dtype.

Ops in ``torch.ops.turbo_inductor``:
  rmsnorm(x, weight, eps, impl, out_dtype) -> y                             public (composite over rmsnorm_fwd)
  rmsnorm_residual(x, residual, weight, eps, impl, out_dtype) -> (y, x + residual)
                                                                            public (over rmsnorm_residual_fwd)
  rmsnorm_fwd(x, weight, eps, impl, out_dtype) -> (y, rstd)                 custom op; backward: rmsnorm_bwd
  rmsnorm_residual_fwd(x, residual, weight, eps, impl, out_dtype) -> (y, sum, rstd)
                                                                            custom op; backward: rmsnorm_bwd
  rmsnorm_bwd(dy, x, weight, rstd, dresidual, impl) -> (dx, dweight)        custom op (not differentiable)

The residual form equals ``(rmsnorm(x + residual), x + residual)``, in the add's dtype.
With ``out_dtype``, y is written in it: the norm's output cast once (autocast), and dy comes in it.
Each addend's gradient is in its own dtype. Why, and autocast: ``docs/ops.md``, "RMSNorm with a residual".
rstd (fp32, x.shape[:-1]) is saved for the backward. dweight is reduced in fp32.
weight may be None; ``rmsnorm_bwd`` then returns an empty dweight.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from ..kernels import registry
from ..kernels.reference.rmsnorm import sum_dtype
from .library import (
    SUPPORTED_FLOAT_DTYPES,
    check,
    check_float,
    check_same_device,
    composite_op,
    contiguous_or_none,
    kernel_op,
    rows_view,
)
from .node import OpNode

FWD_KERNEL, BWD_KERNEL = "rmsnorm_fwd", "rmsnorm_bwd"


def check_rmsnorm(op: str, x: Tensor, weight: Optional[Tensor], eps: float, residual: Optional[Tensor] = None) -> None:
    check_float(op, "x", x)
    check(x.dim() >= 1, op, lambda: "x must have at least one dimension (the normalized last one)")
    if weight is not None:
        check_float(op, "weight", weight)
        check(
            weight.dim() == 1 and weight.shape[0] == x.shape[-1],
            op,
            lambda: f"weight has shape {list(weight.shape)} but x's last dimension is {x.shape[-1]}",
        )
    if residual is not None:
        check_float(op, "residual", residual)
        check(
            residual.shape == x.shape,
            op,
            lambda: f"residual has shape {list(residual.shape)} but x has {list(x.shape)}: they must match",
        )
    # A symbolic eps (dynamic=True) is checked when a call has its value. A check here would specialize the graph.
    check(
        isinstance(eps, torch.SymFloat) or (math.isfinite(eps) and eps >= 0),
        op,
        lambda: f"eps must be a finite number >= 0, got {eps}",
    )
    check_same_device(op, x=x, weight=weight, residual=residual)


def empty_output(x: Tensor, residual: Optional[Tensor] = None, out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """An uninitialized, contiguous y (or sum) of x's shape, in ``out_dtype`` or the dtype of ``x + residual``."""
    return x.new_empty(x.shape, dtype=out_dtype or sum_dtype(x, residual))


def _empty_outputs(
    x: Tensor, residual: Optional[Tensor] = None, out_dtype: Optional[torch.dtype] = None
) -> tuple[Tensor, Tensor]:
    """Outputs for an input with no elements. rstd is NaN, as the plain math gives."""
    rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device).fill_(float("nan"))
    return empty_output(x, residual, out_dtype), rstd


def check_out_dtype(op: str, out_dtype: Optional[torch.dtype]) -> None:
    check(
        out_dtype is None or out_dtype in SUPPORTED_FLOAT_DTYPES,
        op,
        lambda: f"out_dtype must be one of float32, bfloat16, float16 or None, got {out_dtype}",
    )


# ---- forward -------------------------------------------------------------------------------------------------


@kernel_op("rmsnorm_fwd", (FWD_KERNEL,))
def rmsnorm_fwd(
    x: Tensor, weight: Optional[Tensor], eps: float, impl: str = "auto", out_dtype: Optional[torch.dtype] = None
) -> tuple[Tensor, Tensor]:
    check_rmsnorm("rmsnorm", x, weight, eps)
    check_out_dtype("rmsnorm", out_dtype)
    if x.numel() == 0:
        return _empty_outputs(x, out_dtype=out_dtype)
    kernel = registry.select(FWD_KERNEL, x.device, impl)
    y, _, rstd = kernel(rows_view(x), contiguous_or_none(weight), None, eps, out_dtype=out_dtype)
    return y.view(x.shape), rstd.view(x.shape[:-1])


@rmsnorm_fwd.register_fake
def _(x, weight, eps, impl="auto", out_dtype=None):
    check_rmsnorm("rmsnorm", x, weight, eps)
    check_out_dtype("rmsnorm", out_dtype)
    return empty_output(x, out_dtype=out_dtype), x.new_empty(x.shape[:-1], dtype=torch.float32)


@kernel_op("rmsnorm_residual_fwd", (FWD_KERNEL,))
def rmsnorm_residual_fwd(
    x: Tensor,
    residual: Tensor,
    weight: Optional[Tensor],
    eps: float,
    impl: str = "auto",
    out_dtype: Optional[torch.dtype] = None,
) -> tuple[Tensor, Tensor, Tensor]:
    check_rmsnorm("rmsnorm_residual", x, weight, eps, residual)
    check_out_dtype("rmsnorm_residual", out_dtype)
    if x.numel() == 0:
        y, rstd = _empty_outputs(x, residual, out_dtype)
        return y, empty_output(x, residual), rstd
    y, total, rstd = registry.select(FWD_KERNEL, x.device, impl)(
        rows_view(x), contiguous_or_none(weight), rows_view(residual), eps, out_dtype=out_dtype
    )
    return y.view(x.shape), total.view(x.shape), rstd.view(x.shape[:-1])


@rmsnorm_residual_fwd.register_fake
def _(x, residual, weight, eps, impl="auto", out_dtype=None):
    check_rmsnorm("rmsnorm_residual", x, weight, eps, residual)
    check_out_dtype("rmsnorm_residual", out_dtype)
    total = empty_output(x, residual)
    return empty_output(x, residual, out_dtype), total, x.new_empty(x.shape[:-1], dtype=torch.float32)


# ---- backward ------------------------------------------------------------------------------------------------


@kernel_op("rmsnorm_bwd", (BWD_KERNEL,))
def rmsnorm_bwd(
    dy: Tensor, x: Tensor, weight: Optional[Tensor], rstd: Tensor, dresidual: Optional[Tensor], impl: str = "auto"
) -> tuple[Tensor, Tensor]:
    _check_backward_inputs(dy, x, weight, rstd, dresidual)
    if x.numel() == 0:
        dx = torch.empty_like(x, memory_format=torch.contiguous_format)
        return dx, _no_weight_grad(x) if weight is None else torch.zeros_like(
            weight, memory_format=torch.contiguous_format
        )
    dx, dweight = registry.select(BWD_KERNEL, x.device, impl)(
        rows_view(dy),
        rows_view(x),
        contiguous_or_none(weight),
        rstd.reshape(-1).contiguous(),
        None if dresidual is None else rows_view(dresidual),
    )
    return dx.view(x.shape), _no_weight_grad(x) if weight is None else dweight


@rmsnorm_bwd.register_fake
def _(dy, x, weight, rstd, dresidual, impl="auto"):
    _check_backward_inputs(dy, x, weight, rstd, dresidual)
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    return dx, _no_weight_grad(x) if weight is None else weight.new_empty(weight.shape)


def _no_weight_grad(x: Tensor) -> Tensor:
    return x.new_empty(0)


def _check_backward_inputs(dy, x, weight, rstd, dresidual) -> None:
    check_rmsnorm("rmsnorm_bwd", x, weight, 0.0, dresidual)
    # dy in y's dtype, which may differ from x's (rmsnorm_fp8's out_dtype)
    check(
        dy.shape == x.shape and dy.dtype in SUPPORTED_FLOAT_DTYPES,
        "rmsnorm_bwd",
        lambda: f"dy ({list(dy.shape)}, {dy.dtype}) must be a float tensor of x's shape {list(x.shape)}",
    )
    check(
        rstd.shape == x.shape[:-1] and rstd.dtype == torch.float32,
        "rmsnorm_bwd",
        lambda: f"rstd must be float32 of shape {list(x.shape[:-1])}, got {rstd.dtype} {list(rstd.shape)}",
    )


# ---- autograd ------------------------------------------------------------------------------------------------


def _setup_fwd(ctx, inputs, output):
    x, weight, _eps, impl, _out_dtype = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.impl = impl


def input_grads(
    dy: Optional[Tensor],
    dtotal: Optional[Tensor],
    normalized: Tensor,
    weight: Optional[Tensor],
    rstd: Tensor,
    addend_dtypes: Optional[tuple[torch.dtype, torch.dtype]],
    impl: str,
) -> tuple:
    """(dx, dresidual, dweight) of an RMSNorm of ``normalized``: x, or the sum x + residual.

    ``dy`` and ``dtotal`` are the output's and the sum's gradients, None where unused.
    ``addend_dtypes``: x's and the residual's dtypes, or None without a residual.
    Each addend gets the sum's gradient in its own dtype."""
    dweight = None
    if dy is None:  # only the sum was used: its gradient passes to both addends
        dnormalized = dtotal
    else:
        dnormalized, dweight = rmsnorm_bwd(dy, normalized, weight, rstd, dtotal, impl)
    if addend_dtypes is None:
        return dnormalized, None, None if weight is None else dweight
    x_dtype, residual_dtype = addend_dtypes
    return dnormalized.to(x_dtype), dnormalized.to(residual_dtype), None if weight is None else dweight


def _backward_fwd(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    dx, _, dweight = input_grads(dy, None, x, weight, rstd, None, ctx.impl)
    return dx, dweight, None, None, None


def _setup_residual_fwd(ctx, inputs, output):
    x, residual, weight, _eps, impl, _out_dtype = inputs
    ctx.save_for_backward(output[1], weight, output[2])
    ctx.impl, ctx.addend_dtypes = impl, (x.dtype, residual.dtype)
    # An unused output's gradient is None, not a full-size zero tensor (docs/ops.md, "RMSNorm with a residual").
    ctx.set_materialize_grads(False)


def _backward_residual_fwd(ctx, dy, dtotal, _drstd):
    total, weight, rstd = ctx.saved_tensors
    return *input_grads(dy, dtotal, total, weight, rstd, ctx.addend_dtypes, ctx.impl), None, None, None


rmsnorm_fwd.register_autograd(_backward_fwd, setup_context=_setup_fwd)
rmsnorm_residual_fwd.register_autograd(_backward_residual_fwd, setup_context=_setup_residual_fwd)


# ---- public ops ----------------------------------------------------------------------------------------------


@composite_op("rmsnorm")
def rmsnorm(
    x: Tensor, weight: Optional[Tensor], eps: float, impl: str = "auto", out_dtype: Optional[torch.dtype] = None
) -> Tensor:
    return rmsnorm_fwd(x, weight, eps, impl, out_dtype)[0]


@composite_op("rmsnorm_residual")
def rmsnorm_residual(
    x: Tensor,
    residual: Tensor,
    weight: Optional[Tensor],
    eps: float,
    impl: str = "auto",
    out_dtype: Optional[torch.dtype] = None,
) -> tuple[Tensor, Tensor]:
    return rmsnorm_residual_fwd(x, residual, weight, eps, impl, out_dtype)[:2]


def can_rewrite(x: Tensor, weight: Optional[Tensor]) -> bool:
    """Whether our ops can run this RMSNorm (fake tensors), forward and backward."""
    if x.dtype not in SUPPORTED_FLOAT_DTYPES or x.dim() < 1:
        return False
    if weight is not None and (
        weight.dtype not in SUPPORTED_FLOAT_DTYPES or weight.dim() != 1 or weight.device != x.device
    ):
        return False
    return all(registry.available_on(kernel, x.device) for kernel in (FWD_KERNEL, BWD_KERNEL))


class RMSNormNode(OpNode):
    op = rmsnorm
    kernels = (FWD_KERNEL, BWD_KERNEL)


class RMSNormResidualNode(OpNode):
    op = rmsnorm_residual
    kernels = (FWD_KERNEL, BWD_KERNEL)
    outputs = ("y", "sum")
