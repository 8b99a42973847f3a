"""torchao's float8 training linears (``convert_to_float8_training``) -> ``turbo_inductor.fp8_linear``.

Dynamo keeps the linear's matmul as one ``trampoline_autograd_apply(x, weight.t(), linear_mm_config, config)``.
It is replaced where torchao's config is exactly one of our recipes; other configs stay torchao's.
W^T is kept for the backward as the ``fp8`` option's ``save_weight_t`` says (by default ``"auto"``).
The config mapping: ``docs/passes.md``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from ..ops.fp8_linear import FP8LinearNode, can_rewrite
from ..ops.fp8_operands import fp8_formats
from ..options import Options
from ..recipes import RECIPES
from . import fp8_option, ir, patterns, surgery
from .manager import Phase, RewritePass

_FUNCTION = ("torchao.float8.float8_linear", "matmul_with_hp_or_float8_args")
_CASTS = (
    "cast_config_input",
    "cast_config_input_for_grad_weight",
    "cast_config_weight",
    "cast_config_weight_for_grad_input",
    "cast_config_grad_output",
    "cast_config_grad_output_for_grad_weight",
)


def autograd_function_of(node: fx.Node) -> type | None:
    """The ``torch.autograd.Function`` whose ``apply`` Dynamo kept as this node, else None.
    Its trampoline holds the class in its closure."""
    target = node.target if node.op == "call_function" else None
    for cell in getattr(target, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # a cell not filled yet
            continue
        if isinstance(value, type) and issubclass(value, torch.autograd.Function):
            return value
    return None


def _constant(value: Any) -> Any:
    """The value of a graph argument built from constants by torchao's float8 config classes."""
    if isinstance(value, fx.Node):
        if value.op != "call_function" or not getattr(value.target, "__module__", "").startswith("torchao.float8"):
            raise ValueError(f"not a torchao float8 config: {value.format_node()}")
        return value.target(*[_constant(a) for a in value.args], **{k: _constant(v) for k, v in value.kwargs.items()})
    return value


def recipe_of(config: Any, device: torch.device) -> str | None:
    """Our recipe computing what torchao's ``Float8LinearConfig`` computes, or None."""
    if config.enable_fsdp_float8_all_gather or config.pad_inner_dim:
        return None
    casts = {name: getattr(config, name) for name in _CASTS}
    if any(c.scaling_type.name != "DYNAMIC" for c in casts.values()):
        return None
    granularities = {c.scaling_granularity.name for c in casts.values()}
    e4m3, e5m2 = fp8_formats(device)
    formats = [c.target_dtype for c in casts.values()]
    if (
        granularities == {"TENSORWISE"}
        and not config.round_scales_to_power_of_2
        and formats == [e4m3, e4m3, e4m3, e4m3, e5m2, e5m2]
    ):
        recipe = "tensorwise"
    elif granularities == {"AXISWISE"} and config.round_scales_to_power_of_2 and formats == [e4m3] * len(_CASTS):
        recipe = "rowwise_pow2"
    else:
        return None
    gemms = (config.gemm_config_output, config.gemm_config_grad_input, config.gemm_config_grad_weight)
    fast_accum = [RECIPES[recipe].fast_accum_forward, False, False]  # our forward, dgrad and wgrad GEMMs
    return recipe if [g.use_fast_accum for g in gemms] == fast_accum else None


class TorchaoFloat8Pass(RewritePass):
    """torchao float8 linears of our recipes to our FP8 linear."""

    name = "torchao_float8"
    phase = Phase.CLAIM

    def apply(self, graph: fx.Graph, options: Options) -> int:
        count, save_weight_t = 0, options.value(fp8_option.NAME).saves_weight_t()
        for node in list(graph.nodes):
            function = autograd_function_of(node)
            if (
                function is None
                or (function.__module__, function.__name__) != _FUNCTION
                or len(node.args) != 4
                or node.kwargs
            ):
                continue
            x, weight_t, mm_config, config = node.args
            weight, x_fake = patterns.transpose_source(weight_t), ir.fake(x)
            if weight is None or x_fake is None or ir.fake(weight) is None:
                continue
            try:
                recipe = recipe_of(_constant(config), x_fake.device)
            except (ValueError, TypeError, AttributeError):  # a config we cannot read: torchao keeps it
                continue
            if recipe is None or not can_rewrite(x_fake, ir.fake(weight), None):
                continue
            surgery.replace_with_view(
                graph,
                node,
                FP8LinearNode,
                x=x,
                weight=weight,
                bias=None,
                recipe=recipe,
                impl=options.impl,
                save_weight_t=save_weight_t,
            )
            surgery.erase_unused(surgery.producers([mm_config, config, weight_t], stop={x, weight}))
            count += 1
        return count
