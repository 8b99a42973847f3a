"""RMSNorm -> FP8 linear: the norm writes its output in FP8 for the linears reading it (``turbo_inductor.rmsnorm_fp8``).

Runs after the rmsnorm, rmsnorm_residual and fp8 passes, on the ops they made: a ``turbo_inductor.rmsnorm`` or
``rmsnorm_residual`` whose normalized output is x of ``turbo_inductor.fp8_linear`` nodes (the attention's q/k/v
projections, the MLP's gate and up) becomes ``rmsnorm_fp8``, and those linears take its q and scale as
``x_q``, ``x_scale``. The norm's other users, and the linears' backward (which quantizes x^T from y), read y as
before. Taken when every FP8 linear of the output uses one recipe that quantizes x in blocks within a row
(``fp8_linear.quantizes_in_rows``); with mixed recipes, or none such, the graph is left alone.

Under ``torch.autocast`` the linears read the norm's output through casts (an fp32 norm, bf16 linears: the fp8
pass makes autocast's casts explicit). Where every user of the output is a cast to one dtype, the norm writes y in
that dtype (``out_dtype``) and the casts go: y is the cast's value bit for bit, and in backward the norm reads dy
in that dtype where the cast's backward would have converted it first.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..ops.rmsnorm import rmsnorm as rmsnorm_op
from ..ops.rmsnorm import rmsnorm_residual as rmsnorm_residual_op
from ..ops.rmsnorm_fp8 import can_rewrite
from ..ops.rmsnorm_fp8 import rmsnorm_fp8 as rmsnorm_fp8_op
from ..options import Options
from . import matcher as m
from .fp8_input import fp8_readers, hand_over
from .manager import RewritePass


class RMSNormFP8Pass(RewritePass):
    name = "rmsnorm_fp8"

    def apply(self, graph: fx.Graph, options: Options) -> int:
        position = {node: i for i, node in enumerate(graph.nodes)}
        count = 0
        for norm in list(graph.nodes):
            outputs = _outputs(norm)
            if outputs is None:
                continue
            normed, total = outputs
            x, residual, weight, eps, impl = _arguments(norm)
            read, out_dtype = _read_as(normed, position)
            readers = fp8_readers(read)
            if readers is None or not can_rewrite(m.fake(x), readers[1]):
                continue
            linears, recipe = readers
            y, new_total, q, scale = m.insert_op(
                graph, norm, rmsnorm_fp8_op, (x, residual, weight, eps, recipe, impl, out_dtype), n_outputs=4
            )
            casts = [] if read is normed else [u for u in normed.users if not _reads_shape(u)]
            for value in casts:  # they go: y is their value
                value.replace_all_uses_with(y)
            normed.replace_all_uses_with(y)  # its other users read y's shape alone (with casts), or y
            if total is not None:
                total.replace_all_uses_with(new_total)
            hand_over(linears, q, scale)
            m.erase_unused(dict.fromkeys([norm, *[n for n in (normed, total) if n is not None], *casts]))
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


def _arguments(norm: fx.Node) -> tuple:
    """(x, residual, weight, eps, impl) of an rmsnorm / rmsnorm_residual node (positional, as the passes write them)."""
    if norm.target is rmsnorm_op:
        x, weight, eps, impl = norm.args
        return x, None, weight, eps, impl
    x, residual, weight, eps, impl = norm.args
    return x, residual, weight, eps, impl
