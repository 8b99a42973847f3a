"""FP8 linears reading one x that nothing quantized for them -> one ``turbo_inductor.fp8_shared_input`` they all read.

Each FP8 linear quantizes its own x, and Inductor cannot merge our kernels' calls as it merges identical torch ops.
Where q/k/v or gate/up stay separate linears (``tensorwise``, whose one W scale ``fp8_concat`` declines; a
``blockwise`` N that is no multiple of 128; ``save_weight_t=False``), x and x^T are quantized once for all of them.
It runs after the producers, which write x in FP8 from a norm or GLU where the recipe allows. Why: ``docs/passes.md``.
"""

from __future__ import annotations

import collections

import torch.fx as fx

from ..ops.fp8_linear import FP8LinearNode
from ..ops.fp8_shared_input import FP8SharedInputNode
from ..options import Options
from . import ir, surgery
from .manager import Phase, RewritePass, declined


class FP8SharedInputPass(RewritePass):
    """x and x^T quantized once for the FP8 linears reading x."""

    name = "fp8_shared_input"
    phase = Phase.PRODUCERS
    after = ("rmsnorm_fp8", "glu_fp8")

    def apply(self, graph: fx.Graph, options: Options) -> int:
        readers = collections.defaultdict(list)
        for node in graph.nodes:
            linear = FP8LinearNode.of(node)
            if linear is not None and linear.x_q is None:
                # Under autocast each linear reads its own cast of x: casts of one value to one dtype are one x.
                readers[(ir.under_cast(linear.x), linear.recipe, linear.impl)].append(linear)
        return sum(self._share(graph, group) for group in readers.values() if len(group) > 1)

    def _share(self, graph: fx.Graph, group: list[FP8LinearNode]) -> int:
        first = group[0]
        weights = [linear.weight for linear in group]
        cannot = surgery.gather_before(
            first.node, weights, [ir.under_cast(first.x)[0], *(linear.x for linear in group)]
        )
        if cannot:
            declined(self.name, first.node, cannot)
            return 0
        shared = surgery.insert_view(
            graph, first.node, FP8SharedInputNode, x=first.x, weights=weights, recipe=first.recipe, impl=first.impl
        )
        for linear in group:
            linear.set(
                x_q=shared.output("q"),
                x_scale=shared.output("scale"),
                x_t=shared.output("q_t"),
                x_t_scale=shared.output("scale_t"),
            )
        return 1
