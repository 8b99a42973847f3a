"""``all_reduce(F.linear(x, w, b), "sum", group)`` -> ``turbo_inductor.gemm_allreduce``: a tensor-parallel
row-parallel linear, its reduction overlapped with the GEMM.

Both spellings Dynamo produces are matched (``shared/platform.md``), in training and inference:
  - functional collectives: ``funcol.all_reduce(linear, "sum", group)`` -> ``_c10d_functional.all_reduce`` then
    ``wait_tensor``; the wait's users read the fused op;
  - in-place ``dist.all_reduce(y, group=group)``: the same pair, then ``y.copy_(wait)``; the users of y after the
    copy read the fused op, and the copy goes.
Left alone: other reductions than sum, a linear whose unreduced result is read elsewhere, a process group given by
anything but its name, and a linear the ``fp8`` option turns into an FP8 linear (its all-reduce then stays as
written: a user who asked for FP8 gets FP8; an FP8 form of this op is to come).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..ops.gemm_allreduce import can_rewrite
from ..options import Options
from . import matcher as m
from .fp8_linear import FP8LinearPass
from .manager import RewritePass


def waited_sum_all_reduce(wait) -> tuple[fx.Node, fx.Node, str] | None:
    """(what is reduced, the all_reduce, group name) when ``wait`` waits on a functional sum all-reduce of a node on
    a group given by name, the wait its only reader."""
    functional = torch.ops._c10d_functional
    if not (
        m.calls(wait, functions=(functional.wait_tensor, functional.wait_tensor.default))
        and m.calls(wait.args[0], functions=(functional.all_reduce, functional.all_reduce.default))
    ):
        return None
    reduce = wait.args[0]
    source, op, group_name = (list(reduce.args) + [None, None, None])[:3]
    if (
        op != "sum"
        or not isinstance(group_name, str)
        or m.only_user(reduce) is not wait
        or not isinstance(source, fx.Node)
    ):
        return None
    return source, reduce, group_name


def _reduced_linear(wait: fx.Node):
    """(linear, all_reduce, group name) when ``wait`` waits on a sum all-reduce of an F.linear."""
    found = waited_sum_all_reduce(wait)
    if found is None or found[0].target is not torch._C._nn.linear:
        return None
    return found


class GemmAllReducePass(RewritePass):
    name = "gemm_allreduce"

    def apply(self, graph: fx.Graph, options: Options) -> int:
        count = 0
        for wait in list(graph.nodes):
            found = _reduced_linear(wait)
            if found is None:
                continue
            linear, reduce, group_name = found
            if FP8LinearPass().match(linear, options) is not None:
                continue
            x, weight = linear.args[0], linear.args[1]
            bias = m.arg(linear, 2, "bias")
            fakes = m.linear_operand_fakes(linear, x, weight, bias)
            if fakes is None or not can_rewrite(*fakes[1:]):
                continue
            dtype = fakes[0]
            copy_back = self._in_place_copy(linear, reduce, wait)
            if copy_back is None and set(linear.users) != {reduce}:
                continue  # the unreduced result is read elsewhere
            anchor = copy_back if copy_back is not None else wait
            x, weight, bias = m.cast_to(graph, anchor, (x, weight, bias), dtype)  # autocast's casts, if any
            new = m.insert_op(
                graph,
                anchor,
                torch.ops.turbo_inductor.gemm_allreduce.default,
                (x, weight, bias, group_name, options.impl),
            )
            if copy_back is not None:
                # y's readers after the copy saw the reduced value: they read the fused op now.
                linear.replace_all_uses_with(new, delete_user_cb=lambda user: user not in (reduce, copy_back))
                graph.erase_node(copy_back)
            wait.replace_all_uses_with(new)
            m.erase_unused([linear, reduce, wait])
            count += 1
        return count

    @staticmethod
    def _in_place_copy(linear: fx.Node, reduce: fx.Node, wait: fx.Node) -> fx.Node | None:
        """``linear.copy_(wait)`` when it follows and nothing reads the linear between the reduce and the copy
        (the in-place ``dist.all_reduce`` form), else None."""
        copies = [u for u in wait.users if u.op == "call_method" and u.target == "copy_" and u.args[0] is linear]
        if len(copies) != 1 or set(wait.users) != {copies[0]}:
            return None
        copy_back = copies[0]
        order = {node: i for i, node in enumerate(linear.graph.nodes)}
        readers = [u for u in linear.users if u not in (reduce, copy_back)]
        return copy_back if all(order[u] > order[copy_back] for u in readers) else None
