"""Grouped GEMMs (MoE experts) -> ``turbo_inductor.grouped_mm``: one form for every spelling.

Spellings: ``torch._grouped_mm(x, w, offs=offs)`` (also ``F.grouped_mm`` under Dynamo), ``aten._grouped_mm``, and
``torch.ops.transformers.grouped_mm_fallback``. Taken: x [S, K], weight [E, K, N], offs [E] int32, no bias.
The result must be in x's dtype. Why one form: ``docs/passes.md``.
"""

from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn.functional as F

from ..ops.grouped_mm import GroupedMMNode, can_rewrite
from ..options import Options
from . import ir, surgery
from .manager import Phase, RewritePass, declined

NAME = "grouped_mm"
_ATEN = getattr(torch.ops.aten, "_grouped_mm", None)
_TORCH_SPELLINGS = tuple(
    target
    for target in (getattr(torch, "_grouped_mm", None), getattr(F, "grouped_mm", None), getattr(_ATEN, "default", None))
    if target is not None
)
# (x, weight, offs, bias) by position; keyword names differ by spelling. An out_dtype shows in the result.
_KEYWORDS = (("self", "mat_a", "input"), ("mat2", "mat_b", "weight"), ("offs",), ("bias",))


def _transformers_fallback(target) -> bool:
    """transformers' ``grouped_mm_fallback`` op (its overload or packet), without importing transformers."""
    packet = getattr(target, "overloadpacket", target)
    return getattr(packet, "_qualified_op_name", "") == "transformers::grouped_mm_fallback"


def _operands(node: fx.Node) -> list | None:
    """[x, weight, offs, bias] of a grouped GEMM call of any spelling; None for other nodes."""
    if node.op != "call_function" or not (node.target in _TORCH_SPELLINGS or _transformers_fallback(node.target)):
        return None
    values = []
    for i, names in enumerate(_KEYWORDS):
        given = [node.kwargs[name] for name in names if name in node.kwargs]
        values.append(node.args[i] if i < len(node.args) else given[0] if given else None)
    return values


def _read_through_cast(x):
    """x's producer where x casts it to its own dtype (a no-op), else x.
    transformers casts x to the weight's dtype; reading through lets x's producer (a GLU) feed the op."""
    c = ir.call(x)
    source = c.args[0] if c is not None and c.op == "cast" else None
    return source if ir.fake(source) is not None and ir.fake(source).dtype == ir.fake(x).dtype else x


class GroupedMMPass(RewritePass):
    """`torch._grouped_mm` and transformers' fallback to `turbo_inductor.grouped_mm`."""

    name = NAME
    phase = Phase.CANONICALIZE

    def apply(self, graph: fx.Graph, options: Options) -> int:
        count = 0
        for node in list(graph.nodes):
            operands = _operands(node)
            if operands is None:
                continue
            x, weight, offs, bias = operands
            xt, wt, ot, yt = (ir.fake(v) for v in (x, weight, offs, node))
            if bias is not None or any(t is None for t in (xt, wt, ot, yt)) or yt.dtype != xt.dtype:
                declined(self.name, node, "a bias, an output dtype other than x's, or operands without fakes")
                continue
            if not can_rewrite(xt, wt, ot):
                declined(
                    self.name,
                    node,
                    f"operands the op does not take: x {xt.dtype} {list(xt.shape)}, weight "
                    f"{wt.dtype} {list(wt.shape)}, offs {ot.dtype} {list(ot.shape)}",
                )
                continue
            source = _read_through_cast(x)
            surgery.replace_with_view(graph, node, GroupedMMNode, x=source, weight=weight, offs=offs, impl=options.impl)
            if source is not x and not x.users:
                graph.erase_node(x)
            count += 1
        return count
