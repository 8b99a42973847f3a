"""Where ``torch.autocast`` casts, on the torch IR Dynamo captures.

A Dynamo graph does not show autocast's casts: AOTAutograd inserts them when it traces the graph, under the
autocast state of the compile (the caller's ``with torch.autocast``) and the regions the graph enters itself
(``_enter_autocast`` / ``_exit_autocast`` nodes). A pass that makes a value in a narrower dtype than the graph says
(the rotary embedding of bf16 q by an fp32 table, under bf16 autocast) keeps the values only where autocast casts
every use of it to that dtype anyway.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
import torch.nn.functional as F

from . import ir

# Ops that autocast runs in its lower-precision dtype on CPU and CUDA, casting their floating inputs to it.
_LOWER_PRECISION_FUNCTIONS = {
    F.scaled_dot_product_attention,
    F.linear,
    torch.matmul,
    operator.matmul,
    torch.mm,
    torch.bmm,
    torch.baddbmm,
    torch.addmm,
}
_LOWER_PRECISION_METHODS = {"matmul", "mm", "bmm", "baddbmm", "addmm", "__matmul__"}
# Ops that only move or copy elements: a cast commutes with them.
_LAYOUT_FUNCTIONS = {
    operator.getitem,
    torch.cat,
    torch.concat,
    torch.transpose,
    torch.permute,
    torch.reshape,
    torch.flatten,
    torch.unsqueeze,
    torch.squeeze,
    torch.repeat_interleave,
}
_LAYOUT_METHODS = {
    "view",
    "reshape",
    "transpose",
    "permute",
    "contiguous",
    "expand",
    "unsqueeze",
    "squeeze",
    "flatten",
    "clone",
    "repeat",
    "repeat_interleave",
    "__getitem__",
}
_ENTER, _EXIT = torch.amp.autocast_mode._enter_autocast, torch.amp.autocast_mode._exit_autocast


def dtypes_in_force(graph: fx.Graph, device_type: str) -> dict[fx.Node, torch.dtype | None]:
    """The autocast dtype for ``device_type`` at each node of ``graph`` (None where autocast is off): the state of
    this compile, changed by the regions the graph enters and leaves."""
    on = torch.is_autocast_enabled(device_type)
    stack = [torch.get_autocast_dtype(device_type) if on else None]
    in_force = {}
    for node in graph.nodes:
        if node.op == "call_function" and node.target is _ENTER:
            device, dtype, enabled = (list(node.args) + [None, None, True])[:3]
            if device != device_type:
                stack.append(stack[-1])
            elif not enabled:
                stack.append(None)
            else:
                stack.append(dtype or stack[-1] or torch.get_autocast_dtype(device_type))
        elif node.op == "call_function" and node.target is _EXIT and len(stack) > 1:
            stack.pop()
        in_force[node] = stack[-1]
    return in_force


def _is(node: fx.Node, functions: set, methods: set) -> bool:
    if node.op == "call_function":
        return node.target in functions
    return node.op == "call_method" and node.target in methods


def cast_for_every_use(node: fx.Node, in_force: dict[fx.Node, torch.dtype | None]) -> torch.dtype | None:
    """The dtype autocast casts ``node``'s value to wherever it is used, through ops that only move elements; None
    where some use reads it uncast (another op, a graph output) or uses differ. ``in_force``: the graph's
    :func:`dtypes_in_force`."""
    dtypes, todo, seen = set(), list(node.users), set()
    while todo:
        user = todo.pop()
        if user in seen:
            continue
        seen.add(user)
        if _is(user, _LOWER_PRECISION_FUNCTIONS, _LOWER_PRECISION_METHODS) and in_force.get(user) is not None:
            dtypes.add(in_force[user])
        elif _is(user, _LAYOUT_FUNCTIONS, _LAYOUT_METHODS):
            todo.extend(user.users)
        else:
            return None
    return dtypes.pop() if len(dtypes) == 1 else None


class AutocastCasts:
    """Where autocast casts in one graph: :func:`cast_for_every_use` of its nodes, with the dtypes in force per
    device type computed once."""

    def __init__(self, graph: fx.Graph):
        self.graph, self._in_force = graph, {}

    def for_every_use(self, node: fx.Node) -> torch.dtype | None:
        """The dtype autocast casts ``node``'s value to wherever it is used, or None (:func:`cast_for_every_use`)."""
        value = ir.fake(node)
        if value is None:
            return None
        device_type = value.device.type
        if device_type not in self._in_force:
            self._in_force[device_type] = dtypes_in_force(self.graph, device_type)
        return cast_for_every_use(node, self._in_force[device_type])
