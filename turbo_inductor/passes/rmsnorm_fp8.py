"""RMSNorm -> FP8 linear: the norm writes its output in FP8 for the linears reading it (``turbo_inductor.rmsnorm_fp8``).

Runs after the rmsnorm, rmsnorm_residual and fp8 passes, on the ops they made: a ``turbo_inductor.rmsnorm`` or
``rmsnorm_residual`` whose normalized output is x of ``turbo_inductor.fp8_linear`` nodes (the attention's q/k/v
projections, the MLP's gate and up) becomes ``rmsnorm_fp8``, and those linears take its q and scale as
``x_q``, ``x_scale``. The norm's other users, and the linears' backward (which quantizes x^T from y), read y as
before. Taken when every FP8 linear of the output uses one recipe that quantizes x in blocks within a row
(``fp8_linear.quantizes_in_rows``); with mixed recipes, or none such, the graph is left alone.
"""
from __future__ import annotations

import operator

import torch.fx as fx

from ..ops.rmsnorm import rmsnorm as rmsnorm_op, rmsnorm_residual as rmsnorm_residual_op
from ..ops.rmsnorm_fp8 import can_rewrite, rmsnorm_fp8 as rmsnorm_fp8_op
from ..options import Options
from . import matcher as m
from .fp8_input import fp8_readers, hand_over
from .manager import RewritePass


class RMSNormFP8Pass(RewritePass):
    name = "rmsnorm_fp8"

    def apply(self, graph: fx.Graph, options: Options) -> int:
        count = 0
        for norm in list(graph.nodes):
            outputs = _outputs(norm)
            if outputs is None:
                continue
            normed, total = outputs
            readers = fp8_readers(normed)
            if readers is None or not can_rewrite(m.fake(normed), readers[1]):
                continue
            linears, recipe = readers
            x, residual, weight, eps, impl = _arguments(norm)
            y, new_total, q, scale = m.insert_op(graph, norm, rmsnorm_fp8_op,
                                                 (x, residual, weight, eps, recipe, impl), n_outputs=4)
            normed.replace_all_uses_with(y)
            if total is not None:
                total.replace_all_uses_with(new_total)
            hand_over(linears, q, scale)
            m.erase_unused([norm] + [n for n in (normed, total) if n is not None and n is not norm])
            count += 1
        return count


def _outputs(norm: fx.Node) -> tuple[fx.Node, fx.Node | None] | None:
    """(normalized output, sum or None) of a norm node the passes made, as nodes of the graph; None for others."""
    if norm.target is rmsnorm_op:
        return norm, None
    if norm.target is not rmsnorm_residual_op:
        return None
    items = {u.args[1]: u for u in norm.users if u.target is operator.getitem}
    if 0 not in items:
        return None
    return items[0], items.get(1)


def _arguments(norm: fx.Node) -> tuple:
    """(x, residual, weight, eps, impl) of an rmsnorm / rmsnorm_residual node (positional, as the passes write them)."""
    if norm.target is rmsnorm_op:
        x, weight, eps, impl = norm.args
        return x, None, weight, eps, impl
    x, residual, weight, eps, impl = norm.args
    return x, residual, weight, eps, impl
