"""What the producer passes (``rmsnorm_fp8``, ``glu_fp8``) share: the FP8 linears reading a value, and handing them
its FP8 form."""

from __future__ import annotations

import torch.fx as fx

from ..ops.fp8_linear import FP8LinearNode


def fp8_readers(value: fx.Node) -> tuple[list[FP8LinearNode], str] | None:
    """The FP8 linears that read ``value`` as x and quantize it themselves, and their one recipe; None when there
    are none, or their recipes differ."""
    linears = [FP8LinearNode(u) for u in value.users if FP8LinearNode.matches(u)]
    linears = [linear for linear in linears if linear.x is value and linear.x_q is None]
    recipes = {linear.recipe for linear in linears}
    return (linears, recipes.pop()) if len(recipes) == 1 else None


def hand_over(linears: list[FP8LinearNode], q: fx.Node, scale: fx.Node) -> None:
    """Give each linear its x already quantized: they then quantize only x^T."""
    for linear in linears:
        linear.set(x_q=q, x_scale=scale)
