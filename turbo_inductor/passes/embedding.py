"""Embedding lookups -> ``turbo_inductor.embedding``.

Spellings matched: ``F.embedding`` (``nn.Embedding`` calls it) of a 2-D float weight, any ``padding_idx``; no
``max_norm`` (it renormalizes the weight in place), no ``scale_grad_by_freq``, no sparse gradient. The lookup is our
row copy (its reader, our norm, cannot take Inductor's gather into its kernel); the weight gradient is one write of
the table instead of Inductor's fp32 table, scatter and cast (``docs/ops.md``, "Embedding").
"""

from __future__ import annotations

import torch.fx as fx
import torch.nn.functional as F

from ..ops.embedding import EmbeddingNode, can_rewrite, padding_row
from ..options import Options
from . import ir, surgery
from .manager import Phase, RewritePass, declined


class EmbeddingPass(RewritePass):
    """`F.embedding` to `turbo_inductor.embedding`: its weight gradient written in one pass."""

    name = "embedding"
    phase = Phase.FUSE

    def apply(self, graph: fx.Graph, options: Options) -> int:
        count = 0
        for node, arguments in ir.calls_of(graph, F.embedding):
            weight, indices = ir.fake(arguments["weight"]), ir.fake(arguments["input"])
            if weight is None or indices is None or not can_rewrite(weight, indices):
                declined(self.name, node, "not a 2-D float weight and integer indices on one device")
                continue
            if arguments["max_norm"] is not None or arguments["scale_grad_by_freq"] or arguments["sparse"]:
                declined(self.name, node, "max_norm, scale_grad_by_freq or a sparse gradient")
                continue
            surgery.replace_with_view(
                graph,
                node,
                EmbeddingNode,
                weight=arguments["weight"],
                indices=arguments["input"],
                padding_idx=padding_row(arguments["padding_idx"], weight.shape[0]),
                impl=options.impl,
            )
            count += 1
        return count
