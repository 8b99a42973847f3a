"""GLU -> ``turbo_inductor.glu_fp8``: a GLU whose output feeds FP8 GEMMs also writes it in FP8 for them.

Its ``fp8_linear`` and ``fp8_grouped_mm`` readers (down projections) take its q and scale as ``x_q``, ``x_scale``.
Taken when they share one recipe that quantizes x within rows (``docs/passes.md``).
"""

from __future__ import annotations

import torch.fx as fx

from ..ops.glu import GLUFusedNode, GLUNode
from ..ops.glu_fp8 import GLUFP8Node, can_rewrite
from ..options import Options
from . import ir, surgery
from .fp8_input import fp8_readers, hand_over
from .manager import Phase, RewritePass


class GLUFP8Pass(RewritePass):
    """GLUs feeding FP8 linears or experts write their FP8 input."""

    name = "glu_fp8"
    phase = Phase.PRODUCERS
    after = ("glu", "fp8", "fp8_experts")

    def apply(self, graph: fx.Graph, options: Options) -> int:
        count = 0
        for node in list(graph.nodes):
            glu = GLUNode.of(node) or GLUFusedNode.of(node)
            readers = fp8_readers(node) if glu is not None else None
            if readers is None or not can_rewrite(ir.fake(node), readers[1], glu.impl):
                continue
            linears, recipe = readers
            x, up = (glu.gate, glu.up) if isinstance(glu, GLUNode) else (glu.x, None)
            fused = surgery.insert_view(
                graph,
                node,
                GLUFP8Node,
                x=x,
                up=up,
                probs=glu.probs,
                mask=glu.mask,
                activation=glu.activation,
                recipe=recipe,
                impl=glu.impl,
            )
            node.replace_all_uses_with(fused.output("out"))
            hand_over(linears, fused.output("q"), fused.output("scale"))
            graph.erase_node(node)
            count += 1
        return count
