"""Graph surgery for the rewrite passes: inserting our ops' calls, moving the nodes they read before them, erasing
what a rewrite left dead."""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from typing import Any

import torch.fx as fx

from ..ops.node import OpNode, view_of
from . import ir

SITE = "turbo_inductor_site"  # meta key of the nodes insert_view makes: the pass that made them


def insert_op(
    graph: fx.Graph,
    before: fx.Node,
    op: Callable,
    args: tuple,
    n_outputs: int = 0,
    kwargs: dict | None = None,
) -> list[fx.Node] | fx.Node:
    """Insert ``op(*args, **kwargs)`` before ``before``, with Dynamo's example value filled in.
    Returns the node, or for ``n_outputs`` > 0 one ``getitem`` node per output."""
    kwargs = kwargs or {}
    nodes: list[fx.Node] = []  # the arguments' nodes, in lists too (``aten.cat``)
    fx.map_arg((args, kwargs), nodes.append)
    fake_mode = next(ir.fake(n).fake_mode for n in nodes if ir.fake(n) is not None)  # the mode Dynamo traced with
    with graph.inserting_before(before):
        node = graph.call_function(op, args, kwargs)
        with fake_mode:
            node.meta["example_value"] = op(*fx.map_arg(args, ir.example_value), **fx.map_arg(kwargs, ir.example_value))
        if not n_outputs:
            return node
        items = []
        for i in range(n_outputs):
            item = graph.call_function(operator.getitem, (node, i))
            item.meta["example_value"] = node.meta["example_value"][i]
            items.append(item)
    return items


def insert_view(graph: fx.Graph, before: fx.Node, view: type[OpNode], **arguments: Any) -> OpNode:
    """A call of our op ``view.op`` with ``arguments`` by name, inserted before ``before``.
    An op with several results gets one ``getitem`` node per result (``view.output(name)``)."""
    args, kwargs = view.call_arguments(**arguments)
    items = insert_op(graph, before, view.op, args, len(view.outputs), kwargs)
    new = view(items[0].args[0] if view.outputs else items)
    new.node.meta[SITE] = None  # a fused site: the pass manager fills in the pass that made it
    return new


def replace_with_view(graph: fx.Graph, node: fx.Node, view: type[OpNode], **arguments: Any) -> OpNode:
    """A call of our op ``view.op`` in place of ``node``: inserted before it, given its users, ``node`` erased."""
    new = insert_view(graph, node, view, **arguments)
    node.replace_all_uses_with(new.node)
    graph.erase_node(node)
    return new


def producers(roots: list[fx.Node], stop: set) -> list[fx.Node]:
    """``roots`` and what they were computed from, down to ``stop`` and placeholders, producers first.
    That is what a replaced match may leave dead, for :func:`erase_unused`."""
    order = {n: i for i, n in enumerate(roots[0].graph.nodes)}
    seen, todo = set(), list(roots)
    while todo:
        n = todo.pop()
        if n in seen or n in stop or not isinstance(n, fx.Node) or n.op == "placeholder":
            continue
        seen.add(n)
        todo.extend(a for a in n.all_input_nodes)
    return sorted(seen, key=order.__getitem__)


def erase_unused(nodes: Iterable[fx.Node]) -> list[fx.Node]:
    """Erase the matched nodes (given producers first) that are now dead; returns those erased."""
    erased = []
    for n in reversed(list(nodes)):
        if not n.users:
            n.graph.erase_node(n)
            erased.append(n)
    return erased


def available_at(values: Iterable, node: fx.Node, position: dict[fx.Node, float]) -> bool:
    """Whether an op inserted before ``node`` can read every one of ``values`` (``position`` maps nodes to
    indices): each comes earlier, or :func:`hoist` can move it there. A ``get_attr`` can move, and so can a
    symbolic float of earlier values (or of values moving with it): freezing and ``dynamic=True`` put those just
    before their first use (``docs/passes.md``). Moves nothing."""
    moving: set[fx.Node] = set()
    for value in values:
        if not isinstance(value, fx.Node) or position[value] < position[node] or value in moving:
            continue
        if not (
            value.op == "get_attr"
            or (
                ir.is_symbolic_float(value)
                and all(position[n] < position[node] or n in moving for n in value.all_input_nodes)
            )
        ):
            return False
        moving.add(value)
    return True


def hoist(values: Iterable, node: fx.Node, position: dict[fx.Node, float]) -> None:
    """Move each of ``values`` that comes after ``node`` to just before it, in order, and record that in
    ``position``. Only where :func:`available_at` says so: it raises otherwise, having moved nothing."""
    values = list(values)
    if not available_at(values, node, position):
        raise ValueError(f"hoist: a value cannot move before {node.format_node()}")
    for value in values:
        if isinstance(value, fx.Node) and position[value] >= position[node]:
            node.prepend(value)
            position[value] = position[node] - 0.5


def _movable_before(value, node: fx.Node, position: dict, moving: set) -> bool:
    """Whether ``value`` is available before ``node`` once the pure nodes it needs move there (added to ``moving``).
    A later linear's weight cast or transpose comes just before it. Our ops' nodes, ``node`` first, do not move."""
    if not isinstance(value, fx.Node) or position[value] < position[node] or value in moving:
        return True
    if value.op not in ("get_attr", "call_function", "call_method") or value.is_impure() or view_of(value) is not None:
        return False
    moving.add(value)
    return all(_movable_before(v, node, position, moving) for v in value.all_input_nodes)


def _written_in_place(value) -> bool:
    """Whether an in-place op (``w.mul_(2)``, ``aten.copy_``) writes ``value``: read earlier, it may differ."""
    for user in value.users if isinstance(value, fx.Node) else ():
        name = user.target if user.op == "call_method" else getattr(user.target, "__name__", "")
        schema = getattr(user.target, "_schema", None)
        if (isinstance(name, str) and name.endswith("_") and not name.endswith("__")) or (schema and schema.is_mutable):
            return True
    return False


def gather_before(node: fx.Node, operands: list, reads: list) -> str | None:
    """Move the pure producers of ``operands`` that come after ``node`` (a later linear's weight cast) to just
    before it, so that one op inserted there reads them all. Returns why it cannot, having moved nothing: an operand
    computed from what cannot move, or one of ``reads``, ``operands`` or the moved nodes' inputs written in place."""
    position = {n: i for i, n in enumerate(node.graph.nodes)}
    moving: set = set()
    if not all(_movable_before(v, node, position, moving) for v in operands):
        return "a later linear's weight is computed after the first linear"
    if any(map(_written_in_place, [*reads, *operands, *(v for n in moving for v in n.all_input_nodes)])):
        return "x or a weight is written in place: read earlier, it would differ"
    for moved in sorted(moving, key=position.__getitem__):
        node.prepend(moved)
    return None
