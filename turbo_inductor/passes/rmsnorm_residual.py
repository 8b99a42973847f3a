"""``rmsnorm(a + b)`` -> ``turbo_inductor.rmsnorm_residual(a, b)``: the pre-norm block's residual add fused in.

Runs on the rmsnorm pass's ops. The sum's other readers (the next residual add) read the op's second output.
Takes adds of two tensors of the sum's shape; the op promotes their dtypes as the add does (autocast).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..ops.library import SUPPORTED_FLOAT_DTYPES
from ..ops.rmsnorm import RMSNormNode, RMSNormResidualNode
from ..options import Options
from . import ir, surgery
from .manager import Phase, RewritePass


class RMSNormResidualPass(RewritePass):
    """``rmsnorm(a + b)`` and the sum to ``turbo_inductor.rmsnorm_residual``."""

    name = "rmsnorm_residual"
    phase = Phase.FUSE
    after = ("rmsnorm",)

    def apply(self, graph: fx.Graph, options: Options) -> int:
        position = {node: i for i, node in enumerate(graph.nodes)}
        count = 0
        for node in list(graph.nodes):
            norm = RMSNormNode.of(node)
            if norm is None:
                continue
            total = norm.x
            c = ir.call(total)
            operands = ir.binary_operands(c) if c is not None and c.op == "add" else None
            if operands is None or not all(_addend_of(o, total) for o in operands):
                continue
            # The fused op goes where the add was, so everything it reads must exist there: the weight's pure
            # producers (Gemma's 1 + w.float()) move before the add.
            if not surgery.available_at((norm.eps,), total, position):
                continue
            if surgery.gather_before(total, [norm.weight], []) is not None:
                continue
            surgery.hoist((norm.eps,), total, position)
            fused = surgery.insert_view(
                graph,
                total,
                RMSNormResidualNode,
                x=operands[0],
                residual=operands[1],
                weight=norm.weight,
                eps=norm.eps,
                impl=norm.impl,
            )
            node.replace_all_uses_with(fused.output("y"))
            graph.erase_node(node)
            total.replace_all_uses_with(fused.output("sum"))
            graph.erase_node(total)
            count += 1
        return count


def _addend_of(value, total: fx.Node) -> bool:
    """Whether ``value`` is a tensor of the sum's shape and device, in a float dtype that promotes to the sum's."""
    t, ref = ir.fake(value), ir.fake(total)
    return (
        t is not None
        and t.shape == ref.shape
        and t.device == ref.device
        and t.dtype in SUPPORTED_FLOAT_DTYPES
        and torch.promote_types(t.dtype, ref.dtype) == ref.dtype
    )
