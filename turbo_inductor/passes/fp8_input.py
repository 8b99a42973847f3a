"""What the passes that fuse an FP8 linear's input quantization into the op producing the input share
(``rmsnorm_fp8``, ``glu_fp8``): finding the linears that read a value, and handing them its FP8 form."""

from __future__ import annotations

import torch.fx as fx

from ..ops.fp8_linear import fp8_linear as fp8_linear_op

# fp8_linear(x, weight, bias, recipe, impl, x_q, x_scale): the passes that make it write the first five
_RECIPE, _WRITTEN = 3, 5


def fp8_readers(value: fx.Node) -> tuple[list[fx.Node], str] | None:
    """The ``fp8_linear`` nodes that read ``value`` as their x and quantize it themselves, and their one recipe;
    None when there are none, or their recipes differ (each would want x quantized its own way)."""
    linears = [u for u in value.users if u.target is fp8_linear_op and u.args[0] is value and len(u.args) == _WRITTEN]
    recipes = {u.args[_RECIPE] for u in linears}
    return (linears, recipes.pop()) if len(recipes) == 1 else None


def hand_over(linears: list[fx.Node], q: fx.Node, scale: fx.Node) -> None:
    """Give each linear its x already quantized (``x_q``, ``x_scale``): they then quantize only x^T."""
    for linear in linears:
        linear.args = (*linear.args, q, scale)
