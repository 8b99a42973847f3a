"""What the producer passes (``rmsnorm_fp8``, ``glu_fp8``) share.
They find the FP8 linears and grouped GEMMs reading a value, and hand them its FP8 form."""

from __future__ import annotations

import torch.fx as fx

from ..ops.fp8_grouped_mm import FP8GroupedMMNode
from ..ops.fp8_linear import FP8LinearNode

FP8Reader = FP8LinearNode | FP8GroupedMMNode


def fp8_readers(value: fx.Node) -> tuple[list[FP8Reader], str] | None:
    """The FP8 linears and grouped GEMMs that read ``value`` as x and quantize it themselves, and their recipe.
    None when there are none, or their recipes differ."""
    readers = [view(u) for u in value.users for view in (FP8LinearNode, FP8GroupedMMNode) if view.matches(u)]
    readers = [reader for reader in readers if reader.x is value and reader.x_q is None]
    recipes = {reader.recipe for reader in readers}
    return (readers, recipes.pop()) if len(recipes) == 1 else None


def hand_over(readers: list[FP8Reader], q: fx.Node, scale: fx.Node) -> None:
    """Give each reader its x already quantized; it then quantizes only x^T."""
    for reader in readers:
        reader.set(x_q=q, x_scale=scale)
