"""FP8 linear: ``y = x W^T (+ bias)`` with x and W quantized by a recipe, forward and backward.

Ops in ``torch.ops.turbo_inductor``:
  fp8_linear(x, weight, bias, recipe, impl) -> y                   custom op; backward: fp8_linear_bwd (+ dbias)
  fp8_linear_bwd(dy, x, weight, recipe, impl) -> (dx, dweight)

Every GEMM operand [R, C] (C the contracted dimension) is quantized with dynamic scaling in blocks set by the
recipe and its role (activation/gradient or weight):

| recipe     | activations, gradients | weights        | gradient format | scales          |
|------------|------------------------|----------------|-----------------|-----------------|
| tensorwise | whole tensor           | whole tensor   | e5m2            | fp32            |
| rowwise    | per row (1 x C)        | per row        | e4m3            | fp32            |
| blockwise  | 1 x 128                | 128 x 128      | e4m3            | fp32            |
| mxfp8      | 1 x 32                 | 1 x 32         | e4m3            | powers of two   |

Forward: x [M, K] and W [N, K]. Backward: dx = dy W (operands dy [M, N] and W^T [K, N]) and dW = dy^T x (operands
dy^T [N, M] and x^T [K, M]); the transposed operands are quantized straight into their transposed layout.
Saved for backward: x and W in their own precision (what a high-precision linear saves).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch
from torch import Tensor

from ..kernels import registry
from .fp8 import GEMM_KERNEL, QUANTIZE_KERNEL, fp8_formats
from .library import SUPPORTED_FLOAT_DTYPES, check, check_linear, kernel_op, register_linear_autograd


@dataclasses.dataclass(frozen=True)
class Recipe:
    activation_block: tuple[int, int]  # (rows, cols) of an operand block; 0 = the whole dimension
    weight_block: tuple[int, int]
    gradient_format: str  # "e4m3" or "e5m2"
    power_of_two: bool = False
    high_precision_wgrad: bool = False  # wgrad = dy^T x in the input dtype (the GEMM most sensitive to FP8 error)


RECIPES = {
    "tensorwise": Recipe((0, 0), (0, 0), "e5m2"),
    "rowwise": Recipe((1, 0), (1, 0), "e4m3"),
    "rowwise_with_gw_hp": Recipe((1, 0), (1, 0), "e4m3", high_precision_wgrad=True),  # torchao's name for it
    "blockwise": Recipe((1, 128), (128, 128), "e4m3"),
    "mxfp8": Recipe((1, 32), (1, 32), "e4m3", power_of_two=True),
}
# Dimensions the FP8 GEMMs take (cuBLASLt wants multiples of 16 for N and K).
ALIGNMENT = 16


def _operand(t: Tensor, block: tuple[int, int], dtype: torch.dtype, transposed: bool, recipe: Recipe,
             impl: str) -> tuple[Tensor, Tensor]:
    """Quantize the GEMM operand ``t`` (or ``t^T`` when ``transposed``), [R, C], in ``block``-shaped blocks."""
    quantize = registry.select(QUANTIZE_KERNEL, t.device, impl)
    rows, cols = (t.shape[1], t.shape[0]) if transposed else t.shape
    block_rows, block_cols = block[0] or rows, block[1] or cols
    if not transposed:
        return quantize(t, dtype, block_rows, block_cols, False, power_of_two=recipe.power_of_two)
    q, scale = quantize(t, dtype, block_cols, block_rows, True, power_of_two=recipe.power_of_two)
    return q, scale.t().contiguous()


def _gemm(a: tuple[Tensor, Tensor], b: tuple[Tensor, Tensor], out_dtype: torch.dtype, impl: str) -> Tensor:
    return registry.select(GEMM_KERNEL, a[0].device, impl)(a[0], a[1], b[0], b[1], out_dtype)


def _check(op: str, x: Tensor, weight: Tensor, bias: Optional[Tensor], recipe: str) -> None:
    check_linear(op, x, weight, bias)
    check(recipe in RECIPES, op, lambda: f"recipe must be one of {sorted(RECIPES)}, got {recipe!r}")
    check(weight.shape[0] % ALIGNMENT == 0 and weight.shape[1] % ALIGNMENT == 0, op,
          lambda: f"weight dimensions must be multiples of {ALIGNMENT} for the FP8 GEMM, got {list(weight.shape)}")


@kernel_op("fp8_linear", (QUANTIZE_KERNEL, GEMM_KERNEL), symbolic_sizes=False)
def fp8_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor], recipe: str, impl: str = "auto") -> Tensor:
    _check("fp8_linear", x, weight, bias, recipe)
    r, (e4m3, _) = RECIPES[recipe], fp8_formats(x.device)
    x2 = x.reshape(-1, x.shape[-1])
    if x2.shape[0] == 0:
        return x.new_zeros(x.shape[:-1] + (weight.shape[0],)) + (0 if bias is None else bias)
    y = _gemm(_operand(x2, r.activation_block, e4m3, False, r, impl),
              _operand(weight, r.weight_block, e4m3, False, r, impl), x.dtype, impl)
    if bias is not None:
        y = y + bias
    return y.view(x.shape[:-1] + (weight.shape[0],))


@fp8_linear.register_fake
def _(x, weight, bias, recipe, impl="auto"):
    _check("fp8_linear", x, weight, bias, recipe)
    return x.new_empty(x.shape[:-1] + (weight.shape[0],))


@kernel_op("fp8_linear_bwd", (QUANTIZE_KERNEL, GEMM_KERNEL), symbolic_sizes=False)
def fp8_linear_bwd(dy: Tensor, x: Tensor, weight: Tensor, recipe: str,
                   impl: str = "auto") -> tuple[Tensor, Tensor]:
    _check("fp8_linear_bwd", x, weight, None, recipe)
    r, (e4m3, e5m2) = RECIPES[recipe], fp8_formats(x.device)
    grad_dtype = e5m2 if r.gradient_format == "e5m2" else e4m3
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, weight.shape[0])
    if x2.shape[0] == 0:
        return torch.zeros_like(x), torch.zeros_like(weight)
    dx = _gemm(_operand(dy2, r.activation_block, grad_dtype, False, r, impl),
               _operand(weight, r.weight_block, e4m3, True, r, impl), x.dtype, impl)
    if r.high_precision_wgrad:
        dweight = (dy2.t() @ x2).to(weight.dtype)
    else:
        dweight = _gemm(_operand(dy2, r.activation_block, grad_dtype, True, r, impl),
                        _operand(x2, r.activation_block, e4m3, True, r, impl), weight.dtype, impl)
    return dx.view(x.shape), dweight


@fp8_linear_bwd.register_fake
def _(dy, x, weight, recipe, impl="auto"):
    _check("fp8_linear_bwd", x, weight, None, recipe)
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


register_linear_autograd(fp8_linear, fp8_linear_bwd)


def can_rewrite(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> bool:
    """Whether ``F.linear(x, weight, bias)`` on these (fake) tensors can run as an FP8 linear, forward and backward."""
    return (x.dtype in SUPPORTED_FLOAT_DTYPES and weight.dim() == 2 and weight.dtype == x.dtype
            and x.dim() >= 1 and x.shape[-1] == weight.shape[1]
            and isinstance(weight.shape[0], int) and isinstance(weight.shape[1], int)
            and weight.shape[0] % ALIGNMENT == 0 and weight.shape[1] % ALIGNMENT == 0
            and (bias is None or (bias.shape == (weight.shape[0],) and bias.dtype == x.dtype))
            and weight.device == x.device
            and all(registry.available_on(k, x.device) for k in (QUANTIZE_KERNEL, GEMM_KERNEL)))
