"""Linears -> ``turbo_inductor.fp8_linear`` with ``options={"fp8": RECIPE}``: FP8 training of an unmodified model.

Takes every linear spelling (``linears.linear_of``) whose weight is [N, K], N and K multiples of 16.
Under ``torch.autocast`` x and bias are cast to the autocast dtype first; an fp32 W is not (``docs/passes.md``).
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch.fx as fx

from .. import costs
from ..ops.fp8_linear import FP8LinearNode, can_rewrite
from ..options import Options
from ..recipes import AUTO, OFF, RECIPES, FP8Config
from . import claims, fp8_option, linears
from .manager import Phase, RewritePass, decided

NAME = fp8_option.NAME


@claims.claimant(NAME, priority=100)  # a user who asked for FP8 gets FP8
def wants(linear: linears.Linear, options: Options) -> bool:
    config: FP8Config = options.value(NAME)
    if not config.enabled:
        return False
    fakes = linear.fakes()
    if fakes is None:
        return False
    _, xt, wt, bt = fakes
    name = fp8_option.parameter_name(linear.weight)
    excluded = config.exclude and re.search(config.exclude, name)
    if not can_rewrite(xt, wt, bt) or min(wt.shape) < config.min_size or excluded or config.linears is False:
        return False
    if config.linears != AUTO:
        return True
    rows = math.prod(xt.shape[:-1]) if all(isinstance(d, int) for d in xt.shape[:-1]) else None
    decision = costs.decide(costs.LINEAR, config.recipe, xt.device, rows, wt.shape[1], wt.shape[0])
    decided(NAME, "linear", decision.reason)  # one line per shape and verdict
    return decision.fp8


class FP8LinearPass(RewritePass):
    """Linears to FP8 linears of the ``fp8`` option's recipe."""

    name = NAME
    phase = Phase.CLAIM
    default = OFF
    option_doc = (
        f"FP8 training of every linear: a recipe ({', '.join(f'`{r}`' for r in RECIPES)}), or "
        '`{"recipe": ..., "exclude": REGEX, "min_size": N, "save_weight_t": BOOL or "auto", "experts": BOOL or '
        '"auto", "linears": BOOL or "auto"}`. Parameters whose name matches `exclude`, and linears narrower than '
        "`min_size`, stay in high precision. `save_weight_t=False` quantizes W^T again in the backward instead of "
        'keeping it (less memory; FSDP2). `"auto"` (the default) keeps it only for linears `fp8_concat` joins, whose '
        "backward would otherwise hold the concatenated W, and MoE experts. `experts` (MoE experts' grouped GEMMs) and "
        '`linears`: `"auto"` (the default) takes FP8 where the device\'s cost table measured it faster, or for a shape '
        "it did not measure, as its default (experts: high precision, linears: FP8); true forces FP8, false keeps high "
        "precision. Each choice is logged and kept in the compile record. Details: `docs/fp8.md`."
    )

    def parse_option(self, value: Any) -> FP8Config:
        return FP8Config.from_option(value)

    def enabled(self, value: FP8Config) -> bool:
        return value.enabled

    def apply(self, graph: fx.Graph, options: Options) -> int:
        config: FP8Config = options.value(self.name)
        count = 0
        for node, linear in claims.claimed(graph, self.name, options):
            fp8 = linears.insert_linear(
                graph,
                node,
                linear,
                FP8LinearNode,
                fp32_weight=True,  # quantized from fp32: no cast of W, and dW written in fp32 (autocast)
                recipe=config.recipe,
                impl=options.impl,
                save_weight_t=config.saves_weight_t(),
            )
            node.replace_all_uses_with(fp8.node)
            graph.erase_node(node)
            count += 1
        return count
