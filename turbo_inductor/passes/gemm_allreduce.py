"""A linear whose result is sum all-reduced -> ``turbo_inductor.gemm_allreduce``: a row-parallel linear.

Both spellings Dynamo produces, in training and inference:
  - ``funcol.all_reduce(y, "sum", group)``: ``_c10d_functional.all_reduce``, then ``wait_tensor``.
  - In place, ``dist.all_reduce(y, group=group)``: the same pair, then ``y.copy_(wait)`` (``docs/passes.md``).
Left alone: other reductions, groups not given by name, an unreduced result read elsewhere, linears fp8 takes.
"""

from __future__ import annotations

import dataclasses

import torch.fx as fx

from ..ops.gemm_allreduce import GemmAllReduceNode, can_rewrite
from ..options import Options
from . import claims, collectives, ir, linears, surgery
from .manager import Phase, RewritePass

NAME = "gemm_allreduce"


@dataclasses.dataclass(frozen=True)
class Reduction:
    reduce: fx.Node
    wait: fx.Node
    group_name: str
    copy_back: fx.Node | None  # y.copy_(wait) of the in-place form


def reduction_of(linear: fx.Node) -> Reduction | None:
    """The sum all-reduce of ``linear``'s result, where nothing else reads the unreduced value."""
    for reduce in linear.users:
        wait = ir.only_user(reduce)
        found = collectives.waited_sum_all_reduce(wait) if wait is not None else None
        if found is None or found[0] is not linear:
            continue
        copy_back = _in_place_copy(linear, reduce, wait)
        if copy_back is None and set(linear.users) != {reduce}:
            return None
        return Reduction(reduce, wait, found[2], copy_back)
    return None


def _in_place_copy(linear: fx.Node, reduce: fx.Node, wait: fx.Node) -> fx.Node | None:
    """``linear.copy_(wait)`` of the in-place ``dist.all_reduce`` form, else None.
    Nothing may read the linear between the reduce and the copy."""
    copies = [u for u in wait.users if u.op == "call_method" and u.target == "copy_" and u.args[0] is linear]
    if len(copies) != 1 or set(wait.users) != {copies[0]}:
        return None
    copy_back = copies[0]
    order = {node: i for i, node in enumerate(linear.graph.nodes)}
    readers = [u for u in linear.users if u not in (reduce, copy_back)]
    return copy_back if all(order[u] > order[copy_back] for u in readers) else None


@claims.claimant(NAME, priority=50)
def wants(linear: linears.Linear, options: Options) -> bool:
    fakes = linear.fakes()
    return (
        bool(options.value(NAME))
        and fakes is not None
        and reduction_of(linear.node) is not None
        and can_rewrite(*fakes[1:])
    )


class GemmAllReducePass(RewritePass):
    """A row-parallel linear and its all-reduce as one GEMM + all-reduce op."""

    name = NAME
    phase = Phase.CLAIM

    def apply(self, graph: fx.Graph, options: Options) -> int:
        count = 0
        for node, linear in claims.claimed(graph, self.name, options):
            reduction = reduction_of(node)
            anchor = reduction.copy_back or reduction.wait
            new = linears.insert_linear(
                graph, anchor, linear, GemmAllReduceNode, group_name=reduction.group_name, impl=options.impl
            ).node
            if reduction.copy_back is not None:
                # y's readers after the copy saw the reduced value; now they read the fused op.
                node.replace_all_uses_with(
                    new, delete_user_cb=lambda u: u not in (reduction.reduce, reduction.copy_back)
                )
                graph.erase_node(reduction.copy_back)
            reduction.wait.replace_all_uses_with(new)
            surgery.erase_unused([node, reduction.reduce, reduction.wait])
            count += 1
        return count
