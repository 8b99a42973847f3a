"""GLU -> FP8 linear: the GLU writes its output in FP8 for the linear that reads it (``turbo_inductor.glu_fp8``).

Runs after the glu and fp8 passes, on the ops they made: a ``turbo_inductor.glu`` or ``glu_fused`` (SwiGLU, GeGLU)
whose output is x of ``turbo_inductor.fp8_linear`` nodes (the MLP's down projection) becomes ``glu_fp8``, and those
linears take its q and scale as ``x_q``, ``x_scale``. The output's other users, and the linears' backward, read it as
before. Taken when the linears share one recipe that quantizes x in blocks within a row
(``fp8_linear.quantizes_in_rows``).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..ops.glu_fp8 import can_rewrite
from ..options import Options
from . import matcher as m
from .fp8_input import fp8_readers, hand_over
from .manager import RewritePass


class GLUFP8Pass(RewritePass):
    name = "glu_fp8"

    def apply(self, graph: fx.Graph, options: Options) -> int:
        glu_op, glu_fused_op = torch.ops.turbo_inductor.glu.default, torch.ops.turbo_inductor.glu_fused.default
        count = 0
        for glu in list(graph.nodes):
            if glu.target not in (glu_op, glu_fused_op):
                continue
            readers = fp8_readers(glu)
            if readers is None or not can_rewrite(m.fake(glu), readers[1]):
                continue
            linears, recipe = readers
            # glu_fp8(x, up, probs, mask, activation, recipe, impl): glu's arguments, or glu_fused's with no up
            x, *rest = glu.args
            args = (x, *rest[:-1]) if glu.target is glu_op else (x, None, *rest[:-1])
            out, q, scale = m.insert_op(
                graph, glu, torch.ops.turbo_inductor.glu_fp8.default, (*args, recipe, rest[-1]), n_outputs=3
            )
            glu.replace_all_uses_with(out)
            hand_over(linears, q, scale)
            graph.erase_node(glu)
            count += 1
        return count
