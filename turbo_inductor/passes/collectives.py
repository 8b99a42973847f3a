"""Collectives as Dynamo captures them, for the GEMM + all-reduce passes: the functional all-reduce and its wait."""

from __future__ import annotations

import torch
import torch.fx as fx

from . import ir


def waited_sum_all_reduce(wait) -> tuple[fx.Node, fx.Node, str] | None:
    """(what is reduced, the all_reduce, group name) when ``wait`` waits on a functional sum all-reduce.
    The group must be given by name, and the wait must be the reduce's only reader."""
    functional = torch.ops._c10d_functional
    if not (
        ir.calls(wait, functions=(functional.wait_tensor, functional.wait_tensor.default))
        and ir.calls(wait.args[0], functions=(functional.all_reduce, functional.all_reduce.default))
    ):
        return None
    reduce = wait.args[0]
    source, op, group_name = (list(reduce.args) + [None, None, None])[:3]
    if (
        op != "sum"
        or not isinstance(group_name, str)
        or ir.only_user(reduce) is not wait
        or not isinstance(source, fx.Node)
    ):
        return None
    return source, reduce, group_name
