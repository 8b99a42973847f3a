"""transformers' sentinel masks around the experts' grouped GEMMs -> nothing.

transformers 5.17 masks the rows of sentinel choices (expert ids >= E, expert parallelism's) always; 5.25 only under
expert parallelism: ``x_sorted.masked_fill_(mask, 0)`` before the first grouped GEMM and ``y.masked_fill(mask, 0)``
on its output, ``mask = (ids[order] >= E).unsqueeze(-1)``. Ids >= E sort last, past offs[-1]: rows our grouped GEMMs
never read, and write as zero in y and in x's gradient. So where our permute made x_sorted and only our grouped GEMMs
read it, both masks change nothing, and go: a pass over [T * k, H] and one over [T * k, 2I], forward and backward.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..ops.fp8_grouped_mm import FP8GroupedMMNode
from ..ops.grouped_mm import GroupedMMNode
from ..ops.moe import MoEPermuteNode
from ..options import Options
from . import ir, moe_indices, patterns
from .manager import Phase, RewritePass, declined

GEMMS = (GroupedMMNode, FP8GroupedMMNode)


def masks_sentinel_rows(node: fx.Node, permute: MoEPermuteNode, method: str) -> bool:
    """Whether ``node`` is ``t.<method>((sorted ids >= c).unsqueeze(-1), value)`` with c >= E: the sorted ids are
    the permute's ``indices.reshape(-1)[order]``, compared before any other reader (one may write them in place)."""
    if not ir.calls(node, method) or ir.as_number(ir.arg(node, 2, "value")) is None:
        return False
    compare = patterns.row_vector_of(ir.arg(node, 1, "mask"), tuple(ir.fake(node.args[0]).shape[:1]))
    if not ir.calls(compare, "ge", (operator.ge, torch.ge)) or len(compare.args) != 2 or compare.kwargs:
        return False
    ids, bound = compare.args
    c = ir.call(ids)
    if not (isinstance(bound, int) and bound >= permute.num_experts and c is not None and c.op == "getitem"):
        return False
    first_reader = ids.next
    while first_reader not in ids.users:
        first_reader = first_reader.next
    return (
        c.args[1] is permute.output("order")
        and moe_indices.flat_source(c.args[0]) is permute.indices
        and first_reader is compare
    )


class MoESentinelMaskPass(RewritePass):
    """transformers' sentinel-row masks on our grouped GEMMs, dropped."""

    name = "moe_sentinel_mask"
    phase = Phase.FUSE
    after = ("moe_permute",)  # and our grouped GEMMs, from the earlier phases

    def apply(self, graph: fx.Graph, options: Options) -> int:
        count = 0
        for node in list(graph.nodes):
            permute = MoEPermuteNode.of(node)
            if permute is None or permute.output("x_sorted") is None or permute.output("offs") is None:
                continue
            x_sorted, offs = permute.output("x_sorted"), permute.output("offs")
            gemms = [view(u) for u in offs.users for view in GEMMS if view.matches(u) and view(u).offs is offs]
            # In place and unread: the GEMMs read x_sorted after it, through the same node.
            fills = [u for u in x_sorted.users if not u.users and masks_sentinel_rows(u, permute, "masked_fill_")]
            others = set(x_sorted.users) - set(fills) - {g.node for g in gemms}
            if fills and others:
                declined(self.name, node, "x_sorted is read by more than our grouped GEMMs of the permute's offsets")
                fills = []
            # A fill of zero only: the GEMM's rows past offs[-1] are zero already.
            masks = [
                (u, gemm.node)
                for gemm in gemms
                for u in gemm.node.users
                if masks_sentinel_rows(u, permute, "masked_fill") and ir.as_number(ir.arg(u, 2, "value")) == 0
            ]
            for fill in fills:
                graph.erase_node(fill)
            for mask, gemm in masks:
                mask.replace_all_uses_with(gemm)
                graph.erase_node(mask)
            count += bool(fills or masks)
        return count
