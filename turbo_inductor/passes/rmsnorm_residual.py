"""``rmsnorm(a + b)`` -> ``turbo_inductor.rmsnorm_residual(a, b)``: the pre-norm block's residual add fused in.

Runs after the rmsnorm pass, on the ``turbo_inductor.rmsnorm`` nodes it made. The sum usually feeds the next
residual add as well: those other users read the fused op's second output. Only adds of two tensors of the sum's
shape are taken (a broadcasting add is not the residual stream); their dtypes may differ where the add promotes
them (under ``torch.autocast`` a bf16 branch output joins an fp32 residual stream): the op promotes as the add.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..ops.library import SUPPORTED_FLOAT_DTYPES
from ..ops.rmsnorm import rmsnorm as rmsnorm_op
from ..ops.rmsnorm import rmsnorm_residual as rmsnorm_residual_op
from ..options import Options
from . import matcher as m
from .manager import RewritePass


class RMSNormResidualPass(RewritePass):
    name = "rmsnorm_residual"

    def apply(self, graph: fx.Graph, options: Options) -> int:
        position = {node: i for i, node in enumerate(graph.nodes)}
        count = 0
        for norm in list(graph.nodes):
            if norm.target is not rmsnorm_op:
                continue
            total, weight, eps, impl = norm.args
            c = m.call(total)
            operands = m.binary_operands(c) if c is not None and c.op == "add" else None
            if operands is None or not all(_addend_of(o, total) for o in operands):
                continue
            # the fused op replaces the add, so everything it reads must exist there
            if not all(m.available_at(v, total, position) for v in (weight, eps)):
                continue
            normed, new_total = m.insert_op(
                graph, total, rmsnorm_residual_op, (*operands, weight, eps, impl), n_outputs=2
            )
            norm.replace_all_uses_with(normed)
            graph.erase_node(norm)
            total.replace_all_uses_with(new_total)
            graph.erase_node(total)
            count += 1
        return count


def _addend_of(value, total: fx.Node) -> bool:
    """Whether ``value`` is a tensor of the sum's shape and device, in a float dtype that promotes to the sum's."""
    t, ref = m.fake(value), m.fake(total)
    return (
        t is not None
        and t.shape == ref.shape
        and t.device == ref.device
        and t.dtype in SUPPORTED_FLOAT_DTYPES
        and torch.promote_types(t.dtype, ref.dtype) == ref.dtype
    )
