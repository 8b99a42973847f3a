"""RMSNorm that also writes its output in FP8, for the FP8 linears reading it.

Ops in ``torch.ops.turbo_inductor``:
  rmsnorm_fp8(x, residual, weight, eps, recipe, impl, out_dtype) -> (y, sum, q, scale)   public (composite)
  rmsnorm_fp8_fwd(x, residual, weight, eps, recipe, impl, out_dtype) -> (y, sum, rstd, q, scale)
                                                                 custom op; backward: rmsnorm_bwd

y, sum and rstd are those of ``rmsnorm_residual``, or of ``rmsnorm`` with an empty sum (residual None).
With ``out_dtype``, y is the norm's output cast to it (autocast).
q [rows, H] and scale are y quantized as ``recipe`` quantizes a linear's input for the forward GEMM.
``fp8_linear`` takes them as ``x_q``, ``x_scale``.
Only recipes with blocks within a row qualify (``Recipe.quantizes_x_in_rows``).
Why: ``docs/ops.md``, "FP8 producers" and "Autocast".
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from ..kernels import registry
from ..recipes import ROW_RECIPES, Recipe
from .fp8_operands import check_row_recipe, producer_quantization, scale_shape
from .library import composite_op, contiguous_or_none, kernel_op, rows_view
from .node import OpNode
from .rmsnorm import BWD_KERNEL, check_out_dtype, check_rmsnorm, empty_output, input_grads

KERNEL = "rmsnorm_fwd_fp8"


def _check(
    x: Tensor,
    residual: Optional[Tensor],
    weight: Optional[Tensor],
    eps: float,
    recipe: str,
    out_dtype: Optional[torch.dtype],
) -> None:
    check_rmsnorm("rmsnorm_fp8", x, weight, eps, residual)
    check_row_recipe("rmsnorm_fp8", recipe)
    check_out_dtype("rmsnorm_fp8", out_dtype)


def _outputs(
    x: Tensor, residual: Optional[Tensor], recipe: str, out_dtype: Optional[torch.dtype]
) -> tuple[Tensor, ...]:
    """Uninitialized outputs of the right shapes (the fake; an input with no elements)."""
    rows, h = math.prod(x.shape[:-1]), x.shape[-1]
    dtype, block_cols = producer_quantization(recipe, x)
    total = empty_output(x, residual)
    return (
        empty_output(x, residual, out_dtype),
        torch.empty_like(total) if residual is not None else x.new_empty(0),
        x.new_empty(x.shape[:-1], dtype=torch.float32),
        x.new_empty((rows, h), dtype=dtype),
        x.new_empty(scale_shape(rows, h, 1, block_cols), dtype=torch.float32),
    )


@kernel_op("rmsnorm_fp8_fwd", (KERNEL,))
def rmsnorm_fp8_fwd(
    x: Tensor,
    residual: Optional[Tensor],
    weight: Optional[Tensor],
    eps: float,
    recipe: str,
    impl: str = "auto",
    out_dtype: Optional[torch.dtype] = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    _check(x, residual, weight, eps, recipe, out_dtype)
    if x.numel() == 0:
        y, total, rstd, q, scale = _outputs(x, residual, recipe, out_dtype)
        return y, total, rstd.fill_(float("nan")), q, scale.fill_(1.0)
    dtype, block_cols = producer_quantization(recipe, x)
    y, total, rstd, q, scale = registry.select(KERNEL, x.device, impl)(
        rows_view(x),
        contiguous_or_none(weight),
        None if residual is None else rows_view(residual),
        eps,
        dtype,
        block_cols,
        power_of_two=Recipe.from_name(recipe).power_of_two,
        out_dtype=out_dtype,
    )
    total = total.view(x.shape) if residual is not None else x.new_empty(0)
    return y.view(x.shape), total, rstd.view(x.shape[:-1]), q, scale


@rmsnorm_fp8_fwd.register_fake
def _(x, residual, weight, eps, recipe, impl="auto", out_dtype=None):
    _check(x, residual, weight, eps, recipe, out_dtype)
    return _outputs(x, residual, recipe, out_dtype)


def _setup(ctx, inputs, output):
    x, residual, weight, _eps, _recipe, impl, _out_dtype = inputs
    y, total, rstd, q, scale = output
    ctx.save_for_backward(x if residual is None else total, weight, rstd)
    ctx.mark_non_differentiable(rstd, q, scale)
    ctx.addend_dtypes, ctx.impl = None if residual is None else (x.dtype, residual.dtype), impl
    # As in rmsnorm_residual: an unused output's gradient is None, not zeros.
    ctx.set_materialize_grads(False)


def _backward(ctx, dy, dtotal, _drstd, _dq, _dscale):
    normalized, weight, rstd = ctx.saved_tensors
    dtotal = dtotal if ctx.addend_dtypes else None  # without a residual, the sum is empty
    return *input_grads(dy, dtotal, normalized, weight, rstd, ctx.addend_dtypes, ctx.impl), None, None, None, None


rmsnorm_fp8_fwd.register_autograd(_backward, setup_context=_setup)


@composite_op("rmsnorm_fp8")
def rmsnorm_fp8(
    x: Tensor,
    residual: Optional[Tensor],
    weight: Optional[Tensor],
    eps: float,
    recipe: str,
    impl: str = "auto",
    out_dtype: Optional[torch.dtype] = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    y, total, _rstd, q, scale = rmsnorm_fp8_fwd(x, residual, weight, eps, recipe, impl, out_dtype)
    return y, total, q, scale


def can_rewrite(x: Tensor, recipe: str, impl: str) -> bool:
    """Whether an RMSNorm of fake ``x`` can write its FP8 copy in the same pass.

    The copy is the input of FP8 linears of ``recipe``."""
    if recipe not in ROW_RECIPES or not registry.available_on(KERNEL, x.device):
        return False
    block = producer_quantization(recipe, x)[1]
    return registry.has_capability(
        KERNEL, x.device, impl, registry.FP8_IN_ITS_PASS, x.shape[-1], x.element_size(), block
    )


class RMSNormFP8Node(OpNode):
    op = rmsnorm_fp8
    kernels = (KERNEL, BWD_KERNEL)
    outputs = ("y", "sum", "q", "scale")
