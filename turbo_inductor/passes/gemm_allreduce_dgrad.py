"""A column-parallel linear's backward all-reduce -> ``turbo_inductor.linear_dgrad_allreduce``: the input of a
tensor-parallel column-parallel linear goes through an autograd function that is the identity forward and sums
the gradient over the ranks backward (Megatron's ``copy_to_tensor_model_parallel_region``); the linear's input
gradient ``dy @ W`` and that sum then run as one GEMM + all-reduce (the kernels of ``gemm_allreduce``).

Dynamo keeps such a function as ``autograd_function_apply(fwd_body, bwd_body, x)``. Matched where:
  - the forward body returns its input, or a view or copy of it (``view_as``, ``view``, ``clone``, ...);
  - the backward body returns the sum all-reduce of the gradient on one group by name, in either spelling
    (``funcol.all_reduce`` + wait, or in-place ``dist.all_reduce`` on the gradient or a copy of it), and nothing
    else;
  - the function's one output feeds one ``F.linear`` and nothing else (several readers would each need their own
    reduction: more collectives than the one written), and the ``fp8`` option does not turn that linear into an
    FP8 linear (a user who asked for FP8 gets FP8, its gradient's all-reduce as written).
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from ..ops.gemm_allreduce import can_rewrite
from ..options import Options
from . import matcher as m
from .fp8_linear import FP8LinearPass
from .gemm_allreduce import waited_sum_all_reduce
from .manager import RewritePass

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


def _reduced_group(body: fx.Graph) -> str | None:
    """The group's name when the body returns the sum all-reduce of its gradient and does nothing else."""
    returned = _returned(body)
    if returned is None:
        return None
    copies = [u for u in returned.users if u.op == "call_method" and u.target == "copy_" and u.args[0] is returned]
    copy_back = copies[0] if len(copies) == 1 else None  # in place: returned.copy_(wait(all_reduce(returned)))
    found = waited_sum_all_reduce(returned if copy_back is None else copy_back.args[1])
    if found is None:
        return None
    gradient, reduce, group_name = found
    if _through_views(gradient).op != "placeholder" or (copy_back is not None and gradient is not returned):
        return None
    expected = {reduce, m.only_user(reduce)} | ({copy_back} if copy_back is not None else set())
    others = [
        n
        for n in body.nodes
        if n.op in ("call_function", "call_method")
        and n not in expected
        and n.target not in _HOUSEKEEPING
        and not (n.op == "call_method" and n.target in _PASS_THROUGH)
    ]
    return group_name if not others else None


class GemmAllReduceDgradPass(RewritePass):
    name = "gemm_allreduce_dgrad"

    def apply(self, graph: fx.Graph, options: Options) -> int:
        count = 0
        for node in list(graph.nodes):
            if (
                node.op != "call_function"
                or node.target is not torch.ops.higher_order.autograd_function_apply
                or len(node.args) != 3
            ):
                continue
            fwd, bwd = _body(graph, node.args[0]), _body(graph, node.args[1])
            if fwd is None or bwd is None or not _is_identity(fwd):
                continue
            group_name = _reduced_group(bwd)
            item = m.only_user(node)
            if group_name is None or item is None or item.target is not operator.getitem or item.args[1] != 0:
                continue
            linear = m.only_user(item)
            if (
                linear is None
                or linear.target is not torch._C._nn.linear
                or linear.args[0] is not item
                or FP8LinearPass().match(linear, options) is not None
            ):  # FP8 asked for: the linear stays FP8
                continue
            x, weight, bias = node.args[2], linear.args[1], m.arg(linear, 2, "bias")
            fakes = m.linear_operand_fakes(linear, x, weight, bias)
            if fakes is None or not can_rewrite(*fakes[1:]):
                continue
            x, weight, bias = m.cast_to(graph, linear, (x, weight, bias), fakes[0])  # autocast's casts, if any
            new = m.insert_op(
                graph,
                linear,
                torch.ops.turbo_inductor.linear_dgrad_allreduce.default,
                (x, weight, bias, group_name, options.impl),
            )
            linear.replace_all_uses_with(new)
            m.erase_unused([node.args[0], node.args[1], node, item, linear])
            count += 1
        return count
