"""``moe_permute`` feeding FP8 experts -> ``turbo_inductor.moe_permute_fp8``: x quantized once per token, its FP8 rows
and scales moved into expert order instead of its bf16 rows (half the bytes, and T rows quantized instead of T * k).

Taken where x_sorted's only readers are FP8 grouped GEMMs of one recipe that quantizes x within rows, which then take
x, the moved q and scale, and positions (``fp8_grouped_mm``). Where anything else reads x_sorted it stays.
"""

from __future__ import annotations

import torch.fx as fx

from ..ops.fp8_grouped_mm import reads_permuted_x_in_place
from ..ops.moe import MoEPermuteFP8Node, MoEPermuteNode, can_permute_fp8
from ..options import Options
from . import ir, surgery
from .fp8_input import fp8_readers
from .manager import Phase, RewritePass, declined

# The permute's outputs that the FP8 permute also returns; x_sorted gives way to q and scale.
SHARED_OUTPUTS = ("weights_sorted", "offs", "order", "positions")


class MoEPermuteFP8Pass(RewritePass):
    """Permutes feeding FP8 experts move x in FP8."""

    name = "moe_permute_fp8"
    phase = Phase.PRODUCERS
    after = ("moe_permute", "fp8_experts")

    def apply(self, graph: fx.Graph, options: Options) -> int:
        count = 0
        for node in list(graph.nodes):
            permute = MoEPermuteNode.of(node)
            x_sorted = permute.output("x_sorted") if permute is not None else None
            if x_sorted is None:
                continue
            readers = fp8_readers(x_sorted)
            if readers is None or len(readers[0]) != len(x_sorted.users):
                declined(self.name, node, "x_sorted is read by more than FP8 grouped GEMMs of one recipe")
                continue
            gemms, recipe = readers
            if not can_permute_fp8(ir.fake(permute.x), recipe, permute.impl):
                declined(self.name, node, f"no FP8 permute of these tokens in {recipe}'s blocks")
                continue
            if not all(reads_permuted_x_in_place(recipe, ir.fake(gemm.weight).requires_grad) for gemm in gemms):
                declined(self.name, node, f"{recipe}'s wgrad would gather x's rows in expert order anyway")
                continue
            fused = surgery.insert_view(
                graph,
                node,
                MoEPermuteFP8Node,
                x=permute.x,
                indices=permute.indices,
                weights=permute.weights,
                num_experts=permute.num_experts,
                recipe=recipe,
                impl=permute.impl,
            )
            for name in SHARED_OUTPUTS:
                if permute.output(name) is not None:
                    permute.output(name).replace_all_uses_with(fused.output(name))
            for gemm in gemms:
                gemm.set(
                    x=permute.x,
                    x_q=fused.output("q"),
                    x_scale=fused.output("scale"),
                    positions=fused.output("positions"),
                )
            surgery.erase_unused([node, *node.users])
            count += 1
        return count
