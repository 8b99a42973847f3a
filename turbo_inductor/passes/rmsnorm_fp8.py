"""RMSNorm -> ``turbo_inductor.rmsnorm_fp8``: a norm whose output feeds FP8 linears also writes it in FP8 for them.

Its ``fp8_linear`` readers (q/k/v, gate and up projections) take its q and scale as ``x_q``, ``x_scale``.
Taken when they share one recipe that quantizes x within rows. Autocast's casts fold in (``docs/passes.md``).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..ops.rmsnorm import RMSNormNode, RMSNormResidualNode
from ..ops.rmsnorm_fp8 import RMSNormFP8Node, can_rewrite
from ..options import Options
from . import ir, surgery
from .fp8_input import fp8_readers, hand_over
from .manager import Phase, RewritePass


class RMSNormFP8Pass(RewritePass):
    """RMSNorms feeding FP8 linears write their FP8 input."""

    name = "rmsnorm_fp8"
    phase = Phase.PRODUCERS
    after = ("rmsnorm_residual", "fp8")

    def apply(self, graph: fx.Graph, options: Options) -> int:
        position = {node: i for i, node in enumerate(graph.nodes)}
        count = 0
        for node in list(graph.nodes):
            norm = RMSNormNode.of(node) or RMSNormResidualNode.of(node)
            if norm is None:
                continue
            with_residual = isinstance(norm, RMSNormResidualNode)
            normed, total = (norm.output("y"), norm.output("sum")) if with_residual else (node, None)
            if normed is None:
                continue
            read, out_dtype = _read_as(normed, position)
            readers = fp8_readers(read)
            if readers is None or not can_rewrite(ir.fake(norm.x), readers[1], norm.impl):
                continue
            linears, recipe = readers
            fused = surgery.insert_view(
                graph,
                node,
                RMSNormFP8Node,
                x=norm.x,
                residual=norm.residual if with_residual else None,
                weight=norm.weight,
                eps=norm.eps,
                recipe=recipe,
                impl=norm.impl,
                out_dtype=out_dtype,
            )
            y = fused.output("y")
            casts = [] if read is normed else [u for u in normed.users if not _reads_shape(u)]
            for value in casts:  # they go: y is their value
                value.replace_all_uses_with(y)
            normed.replace_all_uses_with(y)  # its other users read y's shape alone (with casts), or y
            if total is not None:
                total.replace_all_uses_with(fused.output("sum"))
            hand_over(linears, fused.output("q"), fused.output("scale"))
            surgery.erase_unused(dict.fromkeys([node, *[n for n in (normed, total) if n is not None], *casts]))
            count += 1
        return count


def _read_as(normed: fx.Node, position: dict[fx.Node, int]) -> tuple[fx.Node, torch.dtype | None]:
    """(the value the linears read, the dtype the norm writes y in, or None for its own).
    Where every user casts the output to one dtype (autocast), the first such cast and that dtype.
    Users that read only its shape do not count: under dynamic shapes Dynamo reads ``.size()`` for views."""
    casts = [u for u in normed.users if not _reads_shape(u)]
    calls = [ir.call(c) for c in casts]
    if not casts or any(c is None or c.op != "cast" or c.args[0] is not normed for c in calls):
        return normed, None
    dtypes = {c.kwargs["dtype"] for c in calls}
    if len(dtypes) != 1:
        return normed, None
    return min(casts, key=lambda c: position.get(c, len(position))), dtypes.pop()


def _reads_shape(node: fx.Node) -> bool:
    """Whether ``node`` reads only its input's shape, which the norm's output keeps in any dtype."""
    return ir.calls(node, "size") or ir.calls(node, "dim")
