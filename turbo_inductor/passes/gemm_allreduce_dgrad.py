"""A column-parallel linear's input-gradient all-reduce -> ``turbo_inductor.linear_dgrad_allreduce``.

Matched: one linear reading ``autograd_function_apply(fwd_body, bwd_body, x)``, Megatron's copy to the
tensor-parallel region. fwd_body is the identity; bwd_body sum all-reduces the gradient, in either spelling.
With dynamic shapes Dynamo passes x's symbolic sizes to the call too: x is the one tensor the call takes.
The backward's ``dy @ W`` and that all-reduce then run as one GEMM + all-reduce (``docs/passes.md``).
"""

from __future__ import annotations

import dataclasses
import operator

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from ..ops.gemm_allreduce import LinearDgradAllReduceNode, can_rewrite
from ..options import Options
from . import claims, collectives, ir, linears, surgery
from .manager import Phase, RewritePass

NAME = "gemm_allreduce_dgrad"
_PASS_THROUGH = {"view_as", "view", "clone", "contiguous", "alias", "detach"}
_HOUSEKEEPING = (torch._C._set_grad_enabled,)


def _body(graph: fx.Graph, node) -> fx.Graph | None:
    if not isinstance(node, fx.Node) or node.op != "get_attr":
        return None
    module = getattr(graph.owning_module, node.target, None)
    return module.graph if isinstance(module, fx.GraphModule) else None


def _returned(body: fx.Graph) -> fx.Node | None:
    """The first tensor the body returns."""
    output = next(n for n in body.nodes if n.op == "output")
    return next((leaf for leaf in pytree.tree_leaves(output.args) if isinstance(leaf, fx.Node)), None)


def _through_views(node: fx.Node) -> fx.Node:
    while node.op == "call_method" and node.target in _PASS_THROUGH and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node


def _is_identity(body: fx.Graph) -> bool:
    returned = _returned(body)
    calls = [n for n in body.nodes if n.op in ("call_function", "call_method")]
    return (
        returned is not None
        and _through_views(returned).op == "placeholder"
        and all(n.target in _HOUSEKEEPING or (n.op == "call_method" and n.target in _PASS_THROUGH) for n in calls)
    )


def _is_size(value) -> bool:
    return isinstance(ir.example_value(value), (int, torch.SymInt))


def _identity_input(fwd: fx.Graph, inputs: tuple) -> fx.Node | None:
    """The input the identity forward body returns, when every other input is a size.

    Dynamo passes each symbolic size the body reads as one more input, in no fixed position. A placeholder's
    position among the body's placeholders is its input's position in the call.
    """
    if not _is_identity(fwd):
        return None
    placeholders = [n for n in fwd.nodes if n.op == "placeholder"]
    position = placeholders.index(_through_views(_returned(fwd)))
    others = inputs[:position] + inputs[position + 1 :]
    if len(placeholders) != len(inputs) or not all(_is_size(other) for other in others):
        return None
    return inputs[position] if ir.fake(inputs[position]) is not None else None


def _reduced_group(body: fx.Graph) -> str | None:
    """The group's name when the body returns the sum all-reduce of its gradient and does nothing else."""
    returned = _returned(body)
    if returned is None:
        return None
    copies = [u for u in returned.users if u.op == "call_method" and u.target == "copy_" and u.args[0] is returned]
    copy_back = copies[0] if len(copies) == 1 else None  # in place: returned.copy_(wait(all_reduce(returned)))
    found = collectives.waited_sum_all_reduce(returned if copy_back is None else copy_back.args[1])
    if found is None:
        return None
    gradient, reduce, group_name = found
    if _through_views(gradient).op != "placeholder" or (copy_back is not None and gradient is not returned):
        return None
    expected = {reduce, ir.only_user(reduce)} | ({copy_back} if copy_back is not None else set())
    others = [
        n
        for n in body.nodes
        if n.op in ("call_function", "call_method")
        and n not in expected
        and n.target not in _HOUSEKEEPING
        and not (n.op == "call_method" and n.target in _PASS_THROUGH)
    ]
    return group_name if not others else None


@dataclasses.dataclass(frozen=True)
class GradientReduction:
    function: fx.Node  # autograd_function_apply(fwd_body, bwd_body, *sizes, x, *sizes)
    item: fx.Node  # its output, the linear's input
    x: fx.Node  # the function's input
    group_name: str


def gradient_reduction_of(linear: linears.Linear) -> GradientReduction | None:
    """The identity-forward, all-reduce-backward function whose output only the linear reads."""
    item = linear.x
    if not ir.calls(item, functions=(operator.getitem,)) or item.args[1] != 0 or ir.only_user(item) is not linear.node:
        return None
    function = item.args[0]
    if (
        function.op != "call_function"
        or function.target is not torch.ops.higher_order.autograd_function_apply
        or ir.only_user(function) is not item
    ):
        return None
    graph = function.graph
    fwd, bwd = _body(graph, function.args[0]), _body(graph, function.args[1])
    if fwd is None or bwd is None:
        return None
    x, group_name = _identity_input(fwd, function.args[2:]), _reduced_group(bwd)
    return GradientReduction(function, item, x, group_name) if x is not None and group_name is not None else None


@claims.claimant(NAME, priority=40)
def wants(linear: linears.Linear, options: Options) -> bool:
    fakes = linear.fakes()
    return (
        bool(options.value(NAME))
        and fakes is not None
        and gradient_reduction_of(linear) is not None
        and can_rewrite(*fakes[1:])
    )


class GemmAllReduceDgradPass(RewritePass):
    """A column-parallel linear's dgrad and its all-reduce as one op."""

    name = NAME
    phase = Phase.CLAIM

    def apply(self, graph: fx.Graph, options: Options) -> int:
        count = 0
        for node, linear in claims.claimed(graph, self.name, options):
            reduction = gradient_reduction_of(linear)
            function = reduction.function
            new = linears.insert_linear(
                graph,
                node,
                linear,
                LinearDgradAllReduceNode,
                x=reduction.x,
                group_name=reduction.group_name,
                impl=options.impl,
            ).node
            node.replace_all_uses_with(new)
            surgery.erase_unused([function.args[0], function.args[1], function, reduction.item, node])
            count += 1
        return count
