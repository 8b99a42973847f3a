"""RMSNorm -> FP8 linear: the norm writes its output in FP8 for the linears reading it (``turbo_inductor.rmsnorm_fp8``).

Runs after the rmsnorm, rmsnorm_residual and fp8 passes, on the ops they made: a ``turbo_inductor.rmsnorm`` or
``rmsnorm_residual`` whose normalized output is x of ``turbo_inductor.fp8_linear`` nodes (the attention's q/k/v
projections, the MLP's gate and up) becomes ``rmsnorm_fp8``, and those linears take its q and scale as
``x_q``, ``x_scale``. The norm's other users, and the linears' backward (which quantizes x^T from y), read y as
before. Taken when every FP8 linear of the output uses one recipe that quantizes x in blocks within a row
(``Recipe.quantizes_x_in_rows``); with mixed recipes, or none such, the graph is left alone.

Under ``torch.autocast`` the linears read the norm's output through casts (an fp32 norm, bf16 linears: the fp8
pass makes autocast's casts explicit). Where every user of the output is a cast to one dtype, the norm writes y in
that dtype (``out_dtype``) and the casts go: y is the cast's value bit for bit, and in backward the norm reads dy
in that dtype where the cast's backward would have converted it first.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..ops.rmsnorm import RMSNormNode, RMSNormResidualNode
from ..ops.rmsnorm_fp8 import RMSNormFP8Node, can_rewrite
from ..options import Options
from . import matcher as m
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
            if readers is None or not can_rewrite(m.fake(norm.x), readers[1], norm.impl):
                continue
            linears, recipe = readers
            fused = m.insert_view(
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
            m.erase_unused(dict.fromkeys([node, *[n for n in (normed, total) if n is not None], *casts]))
            count += 1
        return count


def _read_as(normed: fx.Node, position: dict[fx.Node, int]) -> tuple[fx.Node, torch.dtype | None]:
    """(the value the linears read, the dtype the norm writes y in; None: its own): the norm's output; or, where every
    user of it casts it to one dtype (autocast's casts for its linears), the first of those casts and that dtype.
    Users that read only its shape (with dynamic shapes Dynamo reads ``.size()`` for later views) do not count."""
    casts = [u for u in normed.users if not _reads_shape(u)]
    calls = [m.call(c) for c in casts]
    if not casts or any(c is None or c.op != "cast" or c.args[0] is not normed for c in calls):
        return normed, None
    dtypes = {c.kwargs["dtype"] for c in calls}
    if len(dtypes) != 1:
        return normed, None
    return min(casts, key=lambda c: position.get(c, len(position))), dtypes.pop()


def _reads_shape(node: fx.Node) -> bool:
    """Whether ``node`` reads only its input's shape, which the norm's output keeps in any dtype."""
    return m.calls(node, "size") or m.calls(node, "dim")
