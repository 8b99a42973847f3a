"""Norms whose output autocast casts to bf16 wherever it is used -> the norm writes bf16 itself (``out_dtype``).

Under ``torch.autocast`` with fp32 parameters the residual stream is fp32, so each norm's output is fp32, and
autocast casts it for the bf16 linears reading it. The norm then writes y in bf16: the same values, rounded once,
and no fp32 copy written and read again. The graph keeps its fp32 value as a cast of that (``Tensor.to``), which
autocast's cast right after folds away (Inductor's ``pointless_convert``). The gradient comes back in bf16: the
linears' dx, summed in fp32 and rounded once, as in a bf16 model. Norms feeding FP8 linears are ``rmsnorm_fp8``'s.
Why: ``docs/ops.md``, "Autocast".
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..ops.rmsnorm import RMSNormNode, RMSNormResidualNode
from ..options import Options
from . import ir, surgery
from .autocast import AutocastCasts
from .manager import Phase, RewritePass


class RMSNormAutocastPass(RewritePass):
    """Norms that autocast casts to bf16 write bf16."""

    name = "rmsnorm_autocast"
    phase = Phase.PRODUCERS
    after = ("rmsnorm_residual", "rmsnorm_fp8")

    def apply(self, graph: fx.Graph, options: Options) -> int:
        count, casts = 0, AutocastCasts(graph)
        for node in list(graph.nodes):
            norm = RMSNormNode.of(node) or RMSNormResidualNode.of(node)
            if norm is None or norm.out_dtype is not None:
                continue
            with_residual = isinstance(norm, RMSNormResidualNode)
            y = norm.output("y") if with_residual else node
            yt = ir.fake(y) if y is not None else None
            if yt is None:
                continue
            narrow = casts.for_every_use(y)
            if narrow is None or narrow.itemsize >= yt.dtype.itemsize:
                continue
            fused = surgery.insert_view(graph, node, type(norm), **(norm.arguments() | {"out_dtype": narrow}))
            written = fused.output("y") if with_residual else fused.node
            for user in list(y.users):  # a cast per use: each pair of casts then folds, even where CSE would merge
                user.replace_input_with(y, surgery.insert_op(graph, node, torch.Tensor.to, (written, yt.dtype)))
            total = norm.output("sum") if with_residual else None
            if total is not None:
                total.replace_all_uses_with(fused.output("sum"))
            surgery.erase_unused(dict.fromkeys([node, *[n for n in (y, total) if n is not None and n is not node]]))
            count += 1
        return count
