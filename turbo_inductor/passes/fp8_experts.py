"""Grouped GEMMs -> ``turbo_inductor.fp8_grouped_mm`` with ``options={"fp8": RECIPE}``: MoE experts in FP8.

Runs on the grouped_mm pass's ops (K and N multiples of 16), as the option's ``experts`` says: ``"auto"`` (the
default) where the device's cost table says FP8 wins for the shape (``turbo_inductor.costs``), True always, False
never. Its ``exclude`` (on the expert parameter's name) and ``min_size`` (on K and N) apply as to linears.
"""

from __future__ import annotations

import re

import torch
import torch.fx as fx

from .. import costs
from ..ops.fp8_grouped_mm import FP8GroupedMMNode, can_rewrite_fp8
from ..ops.grouped_mm import GroupedMMNode
from ..options import Options
from ..recipes import AUTO, FP8Config
from . import fp8_option, ir, surgery
from .manager import Phase, RewritePass, decided, declined


def parameter_of(weight) -> fx.Node:
    """The node that ``weight`` transposes or casts, as in ``w.bfloat16().transpose(-2, -1)``.
    For experts' weights, that is the parameter's placeholder."""
    while isinstance(weight, fx.Node) and weight.args and (_transposes(weight) or ir.is_op(weight, "cast")):
        weight = weight.args[0]
    return weight


def _transposes(node: fx.Node) -> bool:
    return any(
        ir.calls(node, method, (function,))
        for method, function in (("transpose", torch.transpose), ("permute", torch.permute), ("t", torch.t))
    )


class FP8ExpertsPass(RewritePass):
    """MoE experts' grouped GEMMs to FP8 ones of the `fp8` option's recipe."""

    name = "fp8_experts"
    phase = Phase.CLAIM
    after = ("grouped_mm",)
    option_doc = (
        'MoE experts\' grouped GEMMs in FP8 where the `fp8` option covers them (its `experts`: `"auto"` by default, '
        "FP8 where the device's cost table says it wins)."
    )

    def apply(self, graph: fx.Graph, options: Options) -> int:
        config: FP8Config = options.value(fp8_option.NAME)
        if not (config.enabled and config.experts):
            return 0
        count = 0
        for node in list(graph.nodes):
            gemm = GroupedMMNode.of(node)
            if gemm is None:
                continue
            xt, wt, ot = (ir.fake(v) for v in (gemm.x, gemm.weight, gemm.offs))
            if not can_rewrite_fp8(xt, wt, ot):
                declined(
                    self.name, node, f"weight {list(wt.shape)}: no FP8 grouped GEMM (K and N static multiples of 16)"
                )
                continue
            name = fp8_option.parameter_name(parameter_of(gemm.weight))
            if (config.exclude and re.search(config.exclude, name)) or min(wt.shape[1:]) < config.min_size:
                declined(self.name, node, f"expert {name or '?'} excluded by the fp8 option's exclude or min_size")
                continue
            recipe = config.recipe
            if config.experts == AUTO:
                groups, k, n = wt.shape
                decision = costs.decide(costs.GROUPED_MM, recipe, xt.device, xt.shape[0], k, n, groups)
                decided(self.name, "experts", decision.reason)  # one line per shape and verdict
                if not decision.fp8:
                    continue
                recipe = decision.recipe  # the recipe or a substitute the table measured faster
            surgery.replace_with_view(
                graph,
                node,
                FP8GroupedMMNode,
                x=gemm.x,
                weight=gemm.weight,
                offs=gemm.offs,
                recipe=recipe,
                impl=gemm.impl,
                save_weight_t=config.saves_weight_t(experts=True),
            )
            count += 1
        return count
