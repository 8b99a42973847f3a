"""Linear layers -> ``turbo_inductor.fp8_linear`` with ``options={"fp8": RECIPE}``: FP8 training and inference
of an unmodified model, no module swapping.

Off by default. The option takes a recipe name ("tensorwise", "rowwise", "blockwise", "mxfp8"), or a dict
``{"recipe": ..., "exclude": REGEX, "min_size": N}``: parameters whose name matches ``exclude`` (e.g. "lm_head")
stay in high precision, and so do linears with fewer than ``min_size`` input or output features.
Matched: ``nn.Linear`` / ``F.linear`` whose weight is [N, K] with N and K multiples of 16, in x's dtype
(fp32/bf16/fp16), bias optional.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch
import torch.fx as fx

from ..ops.fp8_linear import RECIPES, can_rewrite
from ..options import Options
from . import matcher as m
from .manager import RewritePass

OFF = "off"


@dataclasses.dataclass(frozen=True)
class FP8Option:
    recipe: str = OFF
    exclude: str = ""
    min_size: int = 0


def parameter_name(node: fx.Node) -> str:
    """``layers.0.mlp.down_proj.weight`` for a placeholder Dynamo made from a module parameter, else ''."""
    source = getattr(node, "_dynamo_source", None)
    if node.op != "placeholder" or source is None:
        return ""
    name = source.name() if callable(source.name) else source.name  # a method in torch 2.11, a property later
    return ".".join(re.findall(r"_(?:modules|parameters|buffers)\['([^']+)'\]", name))


class FP8LinearPass(RewritePass):
    name = "fp8"
    default = OFF

    def parse_option(self, value: Any) -> FP8Option:
        if value in (None, False, OFF, "", "0", "false"):
            return FP8Option()
        fields = dict(value) if isinstance(value, dict) else {"recipe": value}
        unknown = set(fields) - {"recipe", "exclude", "min_size"}
        if unknown or fields.get("recipe") not in RECIPES:
            raise ValueError(f"primus_turbo: option 'fp8' takes one of {sorted(RECIPES)} or 'off', or a dict with "
                             f"keys recipe/exclude/min_size; got {value!r}")
        re.compile(fields.get("exclude", ""))
        return FP8Option(fields["recipe"], fields.get("exclude", ""), int(fields.get("min_size", 0)))

    def enabled(self, value: FP8Option) -> bool:
        return value.recipe != OFF

    def apply(self, graph: fx.Graph, options: Options) -> int:
        option: FP8Option = options.value(self.name)
        exclude = re.compile(option.exclude) if option.exclude else None
        count = 0
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target is not torch._C._nn.linear:
                continue
            x, weight = node.args[0], node.args[1]
            bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
            xt, wt, bt = m.fake(x), m.fake(weight), m.fake(bias)
            if xt is None or wt is None or (bias is not None and bt is None) or not can_rewrite(xt, wt, bt):
                continue
            if min(wt.shape) < option.min_size or (exclude and exclude.search(parameter_name(weight))):
                continue
            new = m.insert_op(graph, node, torch.ops.turbo_inductor.fp8_linear.default,
                              (x, weight, bias, option.recipe, options.impl))
            node.replace_all_uses_with(new)
            graph.erase_node(node)
            count += 1
        return count
