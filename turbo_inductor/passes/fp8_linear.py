"""Linear layers -> ``turbo_inductor.fp8_linear`` with ``options={"fp8": RECIPE}``: FP8 training and inference
of an unmodified model, no module swapping.

Off by default. The option takes a recipe name ("tensorwise", "rowwise", "blockwise", "mxfp8"), or a dict
``{"recipe": ..., "exclude": REGEX, "min_size": N, "save_weight_t": BOOL}``: parameters whose name matches
``exclude`` (e.g. "lm_head") stay in high precision, and so do linears with fewer than ``min_size`` input or output
features; ``save_weight_t=False`` has the backward quantize W^T again instead of keeping it from the forward
(``ops/fp8_linear.py``: less memory between forward and backward, for FSDP2).
Matched: ``nn.Linear`` / ``F.linear`` whose weight is [N, K] with N and K multiples of 16, in x's dtype
(fp32/bf16/fp16), bias optional; and ``x @ W.t()`` / ``x @ W.T`` / ``torch.matmul(x, W.transpose(0, 1))`` (weight W)
and ``x @ V`` (weight V^T) with a 2-D right operand. Under ``torch.autocast`` the operands are cast to the autocast
dtype first, as autocast casts them for the linear (fp32 weights, say): the FP8 linear computes in that dtype and
returns it.
"""

from __future__ import annotations

import dataclasses
import operator
import re
from typing import Any

import torch
import torch.fx as fx

from ..ops.fp8_linear import RECIPES, can_rewrite
from ..options import Options, parse_bool
from . import matcher as m
from .manager import RewritePass

OFF = "off"


@dataclasses.dataclass(frozen=True)
class FP8Option:
    recipe: str = OFF
    exclude: str = ""
    min_size: int = 0
    save_weight_t: bool = True


def parameter_name(node: fx.Node) -> str:
    """``layers.0.mlp.down_proj.weight`` for a placeholder Dynamo made from a module parameter, else ''."""
    source = getattr(node, "_dynamo_source", None)
    if node.op != "placeholder" or source is None:
        return ""
    name = source.name() if callable(source.name) else source.name  # a method in torch 2.11, a property later
    return ".".join(re.findall(r"_(?:modules|parameters|buffers)\['([^']+)'\]", name))


_MATMULS = (operator.matmul, torch.matmul, torch.Tensor.matmul)


def linear_of(node: fx.Node):
    """(x, weight, bias, transposed) for a linear spelled ``F.linear`` or as a matmul with a 2-D right operand:
    ``transposed`` when the weight is that operand's transpose (``x @ V``: weight V^T), not a node of the graph yet;
    None for anything else."""
    if node.op == "call_function" and node.target is torch._C._nn.linear:
        bias = m.arg(node, 2, "bias")
        return node.args[0], node.args[1], bias, False
    is_matmul = (node.op == "call_function" and node.target in _MATMULS) or (
        node.op == "call_method" and node.target == "matmul"
    )
    if not is_matmul or len(node.args) != 2 or node.kwargs:
        return None
    x, rhs = node.args
    rt = m.fake(rhs)
    if rt is None or rt.dim() != 2:
        return None
    weight = m.transpose_source(rhs)
    return (x, weight, None, False) if weight is not None else (x, rhs, None, True)


class FP8LinearPass(RewritePass):
    name = "fp8"
    default = OFF

    def parse_option(self, value: Any) -> FP8Option:
        if value in (None, False, OFF, "", "0", "false"):
            return FP8Option()
        fields = dict(value) if isinstance(value, dict) else {"recipe": value}
        unknown = set(fields) - {"recipe", "exclude", "min_size", "save_weight_t"}
        if unknown or fields.get("recipe") not in RECIPES:
            raise ValueError(
                f"primus_turbo: option 'fp8' takes one of {sorted(RECIPES)} or 'off', or a dict with "
                f"keys recipe/exclude/min_size/save_weight_t; got {value!r}"
            )
        re.compile(fields.get("exclude", ""))
        return FP8Option(
            fields["recipe"],
            fields.get("exclude", ""),
            int(fields.get("min_size", 0)),
            parse_bool("fp8.save_weight_t", fields.get("save_weight_t", True)),
        )

    def enabled(self, value: FP8Option) -> bool:
        return value.recipe != OFF

    def match(self, node: fx.Node, options: Options):
        """``linear_of(node)`` when this pass, as the options configure it, turns ``node`` into an FP8 linear;
        None otherwise."""
        option: FP8Option = options.value(self.name)
        found = linear_of(node) if self.enabled(option) else None
        if found is None:
            return None
        x, weight, bias, transposed = found
        fakes = m.linear_operand_fakes(node, x, weight, bias)
        if fakes is None:
            return None
        _, xt, wt, bt = fakes
        wt = wt.t() if transposed else wt
        eligible = (
            can_rewrite(xt, wt, bt)
            and min(wt.shape) >= option.min_size
            and not (option.exclude and re.search(option.exclude, parameter_name(weight)))
        )
        return found if eligible else None

    def apply(self, graph: fx.Graph, options: Options) -> int:
        option: FP8Option = options.value(self.name)
        count = 0
        for node in list(graph.nodes):
            found = self.match(node, options)
            if found is None:
                continue
            x, weight, bias, transposed = found
            if transposed:
                weight = m.insert_op(graph, node, torch.ops.aten.t.default, (weight,))
            x, weight, bias = m.cast_to(graph, node, (x, weight, bias), m.linear_dtype(node))
            linear = m.replace_with_op(
                graph, node, torch.ops.turbo_inductor.fp8_linear.default, (x, weight, bias, option.recipe, options.impl)
            )
            if not option.save_weight_t:  # a keyword: the producer fusions hand x_q and x_scale over as arguments
                linear.kwargs = {"save_weight_t": False}
            count += 1
        return count
