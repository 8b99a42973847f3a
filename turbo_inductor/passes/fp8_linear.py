"""Linears -> ``turbo_inductor.fp8_linear`` with ``options={"fp8": RECIPE}``: FP8 training of an unmodified model.

Takes every linear spelling (``matcher.linear_of``) whose weight is [N, K], N and K multiples of 16.
Under ``torch.autocast`` the operands are cast to the autocast dtype first (``docs/passes.md``).
"""

from __future__ import annotations

import re
from typing import Any

import torch.fx as fx

from ..ops.fp8_linear import FP8LinearNode, can_rewrite
from ..options import Options
from ..recipes import OFF, RECIPES, FP8Config
from . import claims
from . import matcher as m
from .manager import Phase, RewritePass

NAME = "fp8"


def parameter_name(node: fx.Node) -> str:
    """``layers.0.mlp.down_proj.weight`` for a placeholder Dynamo made from a module parameter, else ''."""
    source = getattr(node, "_dynamo_source", None)
    if node.op != "placeholder" or source is None:
        return ""
    name = source.name() if callable(source.name) else source.name  # a method in torch 2.11, a property later
    return ".".join(re.findall(r"_(?:modules|parameters|buffers)\['([^']+)'\]", name))


@claims.claimant(NAME, priority=100)  # a user who asked for FP8 gets FP8
def wants(linear: m.Linear, options: Options) -> bool:
    config: FP8Config = options.value(NAME)
    if not config.enabled:
        return False
    fakes = linear.fakes()
    if fakes is None:
        return False
    _, xt, wt, bt = fakes
    excluded = config.exclude and re.search(config.exclude, parameter_name(linear.weight))
    return can_rewrite(xt, wt, bt) and min(wt.shape) >= config.min_size and not excluded


class FP8LinearPass(RewritePass):
    """Linears to FP8 linears of the ``fp8`` option's recipe."""

    name = NAME
    phase = Phase.CLAIM
    default = OFF
    option_doc = (
        f"FP8 training of every linear: a recipe ({', '.join(f'`{r}`' for r in RECIPES)}), or "
        '`{"recipe": ..., "exclude": REGEX, "min_size": N, "save_weight_t": BOOL, "experts": BOOL}`. Parameters '
        "whose name matches `exclude`, and linears narrower than `min_size`, stay in high precision. "
        "`save_weight_t=False` quantizes W^T again in the backward instead of keeping it (less memory; FSDP2). "
        "`experts=False` keeps MoE experts' grouped GEMMs in high precision. Details: `docs/fp8.md`."
    )

    def parse_option(self, value: Any) -> FP8Config:
        return FP8Config.from_option(value)

    def enabled(self, value: FP8Config) -> bool:
        return value.enabled

    def apply(self, graph: fx.Graph, options: Options) -> int:
        config: FP8Config = options.value(self.name)
        count = 0
        for node, linear in claims.claimed(graph, self.name, options):
            fp8 = m.insert_linear(
                graph,
                node,
                linear,
                FP8LinearNode,
                recipe=config.recipe,
                impl=options.impl,
                save_weight_t=config.save_weight_t,
            )
            node.replace_all_uses_with(fp8.node)
            graph.erase_node(node)
            count += 1
        return count
