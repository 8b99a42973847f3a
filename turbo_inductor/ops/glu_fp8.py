"""A GLU that also writes its output in FP8, for the FP8 linear reading it (the MLP's down projection).

Ops in ``torch.ops.turbo_inductor``:
  glu_fp8(x, up, probs, mask, activation, recipe, impl) -> (out, q, scale)    custom op; backward: glu_bwd or
                                                                               glu_fused_bwd

With ``up``, x is the gate (``glu``'s form). Without, x holds gate and up as halves (``glu_fused``'s form).
out is that op's output. q [rows, F] and scale are out quantized as ``recipe`` quantizes a linear's input.
``fp8_linear`` takes them as ``x_q``, ``x_scale``.
Only recipes with blocks within a row qualify (``Recipe.quantizes_x_in_rows``).
Why: ``docs/ops.md``, "FP8 producers".
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from ..kernels import registry
from ..recipes import ROW_RECIPES, Recipe
from .fp8_operands import check_row_recipe, producer_quantization, scale_shape
from .glu import BWD_KERNEL, FWD_KERNEL, check_glu, check_glu_fused, glu_bwd, glu_fused_bwd
from .library import flat_or_none, kernel_op, unit_stride_rows
from .node import OpNode

KERNEL = "glu_fwd_fp8"


def _halves(x: Tensor, up: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    if up is not None:
        return x, up
    half = x.shape[-1] // 2
    return x[..., :half], x[..., half:]


def _check_all(x: Tensor, up: Optional[Tensor], probs, mask, activation: str, recipe: str) -> None:
    if up is None:
        check_glu_fused("glu_fp8", x, probs, mask, activation)
    else:
        check_glu("glu_fp8", x, up, probs, mask, activation)
    check_row_recipe("glu_fp8", recipe)


def _outputs(gate: Tensor, recipe: str) -> tuple[Tensor, Tensor, Tensor]:
    rows, f = math.prod(gate.shape[:-1]), gate.shape[-1]
    dtype, block_cols = producer_quantization(recipe, gate)
    return (
        gate.new_empty(gate.shape),
        gate.new_empty((rows, f), dtype=dtype),
        gate.new_empty(scale_shape(rows, f, 1, block_cols), dtype=torch.float32),
    )


@kernel_op("glu_fp8", (KERNEL,))
def glu_fp8(
    x: Tensor,
    up: Optional[Tensor],
    probs: Optional[Tensor],
    mask: Optional[Tensor],
    activation: str,
    recipe: str,
    impl: str = "auto",
) -> tuple[Tensor, Tensor, Tensor]:
    _check_all(x, up, probs, mask, activation, recipe)
    gate, up = _halves(x.contiguous() if up is None else x, up)
    if gate.numel() == 0:
        out, q, scale = _outputs(gate, recipe)
        return out, q, scale.fill_(1.0)
    dtype, block_cols = producer_quantization(recipe, gate)
    out, q, scale = registry.select(KERNEL, gate.device, impl)(
        unit_stride_rows(gate),
        unit_stride_rows(up),
        flat_or_none(probs),
        flat_or_none(mask),
        activation,
        dtype,
        block_cols,
        power_of_two=Recipe.from_name(recipe).power_of_two,
    )
    return out.view(gate.shape), q, scale


@glu_fp8.register_fake
def _(x, up, probs, mask, activation, recipe, impl="auto"):
    _check_all(x, up, probs, mask, activation, recipe)
    return _outputs(_halves(x, up)[0], recipe)


def _setup(ctx, inputs, output):
    x, up, probs, mask, activation, _recipe, impl = inputs
    ctx.save_for_backward(x, up, probs, mask)
    ctx.mark_non_differentiable(*output[1:])
    ctx.set_materialize_grads(False)  # out is the one output with a gradient: no zero-filled q for the backward
    ctx.activation, ctx.impl = activation, impl


def _backward(ctx, dout, _dq, _dscale):
    x, up, probs, mask = ctx.saved_tensors
    if up is None:
        dx, dprobs = glu_fused_bwd(dout, x, probs, mask, ctx.activation, ctx.impl)
        dup = None
    else:
        dx, dup, dprobs = glu_bwd(dout, x, up, probs, mask, ctx.activation, ctx.impl)
    return dx, dup, None if probs is None else dprobs, None, None, None, None


glu_fp8.register_autograd(_backward, setup_context=_setup)


def can_rewrite(out: Tensor, recipe: str, impl: str) -> bool:
    """Whether a GLU of fake output ``out`` can write its FP8 copy in the same pass.

    The copy is the input of FP8 linears of ``recipe``."""
    if recipe not in ROW_RECIPES or not all(registry.available_on(k, out.device) for k in (KERNEL, FWD_KERNEL)):
        return False
    block = producer_quantization(recipe, out)[1]
    return registry.has_capability(
        KERNEL, out.device, impl, registry.FP8_IN_ITS_PASS, out.shape[-1], out.element_size(), block
    )


class GLUFP8Node(OpNode):
    op = torch.ops.turbo_inductor.glu_fp8.default
    kernels = (KERNEL, BWD_KERNEL)
    outputs = ("out", "q", "scale")
