"""x quantized once for the FP8 linears that read it: q/k/v or gate/up where they stay separate linears.

Ops in ``torch.ops.turbo_inductor``:
  fp8_shared_input(x, weights, recipe, impl) -> (q, scale, q_t, scale_t)              public (composite)
  fp8_shared_input_quantize(x, recipe, impl, transposed) -> (q, scale, q_t, scale_t)  custom op, no gradient

q [rows, K] and scale are x quantized as ``recipe`` quantizes a linear's input for the forward GEMM. q_t and scale_t
are x^T quantized for the wgrad where one of ``weights`` (the readers') wants a gradient; else empty.
``fp8_linear`` takes them as ``x_q``, ``x_scale``, ``x_t``, ``x_t_scale``. x's gradient flows through the linears.
Why: ``docs/ops.md``, "FP8 linears sharing x".
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..recipes import RECIPES
from .fp8_operands import (
    QUANTIZE_KERNEL,
    check_recipe,
    fp8_formats,
    kernel_block,
    quantize_operand,
    quantize_operand_both,
    saves_x_t,
    scale_shape,
    unsaved_operand,
)
from .library import check, check_float, composite_op, kernel_op
from .node import OpNode


def _check(x: Tensor, recipe: str) -> None:
    op = "fp8_shared_input"
    check_float(op, "x", x)
    check(x.dim() >= 1, op, lambda: "x must have at least one dimension")
    check_recipe(op, recipe)


def _outputs(x: Tensor, recipe: str, transposed: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Uninitialized outputs of the right shapes (the fake; an x with no rows)."""
    rows, k = math.prod(x.shape[:-1]), x.shape[-1]
    block, e4m3 = RECIPES[recipe].activation_block, fp8_formats(x.device)[0]
    q = x.new_empty((rows, k), dtype=e4m3)
    scale = x.new_empty(scale_shape(rows, k, *kernel_block(block, rows, k)), dtype=torch.float32)
    if not transposed:
        return q, scale, *unsaved_operand(x, e4m3)
    q_t = x.new_empty((k, rows), dtype=e4m3)
    return q, scale, q_t, x.new_empty(scale_shape(k, rows, *kernel_block(block, k, rows)), dtype=torch.float32)


@kernel_op("fp8_shared_input_quantize", (QUANTIZE_KERNEL,), symbolic_sizes=False)
def fp8_shared_input_quantize(
    x: Tensor, recipe: str, impl: str = "auto", transposed: bool = False
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    _check(x, recipe)
    x2 = x.reshape(-1, x.shape[-1])
    if x2.shape[0] == 0:
        return _outputs(x, recipe, transposed)
    r, e4m3 = RECIPES[recipe], fp8_formats(x.device)[0]
    if transposed:
        (q, scale), (q_t, scale_t) = quantize_operand_both(x2, r.activation_block, e4m3, r, impl)
    else:
        (q, scale), (q_t, scale_t) = quantize_operand(x2, r.activation_block, e4m3, r, impl), unsaved_operand(x, e4m3)
    return q, scale, q_t, scale_t


@fp8_shared_input_quantize.register_fake
def _(x, recipe, impl="auto", transposed=False):
    _check(x, recipe)
    return _outputs(x, recipe, transposed)


def _setup(ctx, inputs, output):
    ctx.mark_non_differentiable(*output)


def _backward(ctx, *_grads):
    return None, None, None, None


fp8_shared_input_quantize.register_autograd(_backward, setup_context=_setup)


@composite_op("fp8_shared_input")
def fp8_shared_input(
    x: Tensor, weights: list[Tensor], recipe: str, impl: str = "auto"
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    _check(x, recipe)
    for weight in weights:
        check(
            isinstance(weight, Tensor) and weight.dim() == 2 and weight.shape[1] == x.shape[-1],
            "fp8_shared_input",
            lambda w=weight: (
                f"weights must be the readers' [N, K] with K = x.shape[-1] = {x.shape[-1]}, got "
                f"{list(w.shape) if isinstance(w, Tensor) else type(w).__name__}"
            ),
        )
    # Decided at decomposition, as fp8_linear decides: x^T where a reader's wgrad will read it.
    wgrad = torch.is_grad_enabled() and any(w.requires_grad for w in weights)
    return fp8_shared_input_quantize(x, recipe, impl, saves_x_t(recipe, wgrad))


class FP8SharedInputNode(OpNode):
    op = fp8_shared_input
    outputs = ("q", "scale", "q_t", "scale_t")
    kernels = (QUANTIZE_KERNEL,)
