"""Matcher helpers shared by the rewrite passes, on the torch IR Dynamo captures.

Torch IR is not normalized: ``x.pow(2)``, ``torch.pow(x, 2)`` and ``x ** 2`` are different nodes.
:func:`call` gives one canonical view, so a pass matches ``("pow", (x, 2))`` once for every spelling.
"""

from __future__ import annotations

import dataclasses
import inspect
import operator
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.fx as fx

from ..ops.node import OpNode, view_of

SITE = "turbo_inductor_site"  # meta key of the nodes insert_view makes: the pass that made them

# function targets -> canonical op name
_FUNCTIONS: dict[Callable, str] = {
    operator.add: "add",
    torch.add: "add",
    torch.Tensor.add: "add",
    operator.sub: "sub",
    torch.sub: "sub",
    torch.Tensor.sub: "sub",
    operator.mul: "mul",
    torch.mul: "mul",
    torch.Tensor.mul: "mul",
    operator.truediv: "div",
    torch.div: "div",
    torch.Tensor.div: "div",
    operator.pow: "pow",
    torch.pow: "pow",
    torch.Tensor.pow: "pow",
    torch.square: "square",
    torch.Tensor.square: "square",
    torch.mean: "mean",
    torch.Tensor.mean: "mean",
    torch.rsqrt: "rsqrt",
    torch.Tensor.rsqrt: "rsqrt",
    torch.sqrt: "sqrt",
    torch.Tensor.sqrt: "sqrt",
    torch.rms_norm: "rms_norm",
    torch.nn.functional.rms_norm: "rms_norm",
    torch.Tensor.to: "cast",
    torch.Tensor.float: "cast",
    torch.Tensor.type_as: "cast",
    torch.nn.functional.silu: "silu",
    torch.nn.functional.gelu: "gelu",
    torch.chunk: "chunk",
    torch.Tensor.chunk: "chunk",
    torch.split: "split",
    torch.Tensor.split: "split",
    operator.getitem: "getitem",
    operator.neg: "neg",
    torch.neg: "neg",
    torch.Tensor.neg: "neg",
    torch.cat: "cat",
    torch.concat: "cat",
    torch.concatenate: "cat",
}
# method names -> canonical op name
_METHODS: dict[str, str] = {
    "add": "add",
    "sub": "sub",
    "mul": "mul",
    "div": "div",
    "pow": "pow",
    "square": "square",
    "mean": "mean",
    "rsqrt": "rsqrt",
    "sqrt": "sqrt",
    "to": "cast",
    "float": "cast",
    "half": "cast",
    "bfloat16": "cast",
    "type_as": "cast",
    "type": "cast",
    "chunk": "chunk",
    "split": "split",
    "int": "cast",
    "long": "cast",
    "neg": "neg",
}
# Keyword arguments that change what an op computes: a node using one has no canonical view.
_MEANINGFUL_KWARGS = {"alpha", "rounding_mode", "out", "memory_format"}


@dataclasses.dataclass(frozen=True)
class Call:
    op: str
    args: tuple
    kwargs: dict


def fake(value: Any) -> torch.Tensor | None:
    """The fake tensor Dynamo recorded for a node (None for non-tensors and constants)."""
    if isinstance(value, fx.Node):
        value = _example(value)
    return value if isinstance(value, torch.Tensor) else None


def _example(node: fx.Node) -> Any:
    """What Dynamo recorded for a node's value: a fake tensor, a symbolic scalar, ..."""
    return node.meta.get("example_value", node.meta.get("val"))


def example_value(value: Any) -> Any:
    """What Dynamo recorded for a node (a fake tensor, a symbolic size, ...); a constant as it is."""
    return _example(value) if isinstance(value, fx.Node) else value


def fake_as(value: Any, dtype: torch.dtype) -> torch.Tensor | None:
    """:func:`fake` of ``value`` as it would be cast to ``dtype``."""
    t = fake(value)
    if t is None or t.dtype == dtype:
        return t
    with t.fake_mode:
        return t.to(dtype)


def linear_dtype(linear: fx.Node) -> torch.dtype | None:
    """The dtype a linear-like ``linear`` computes in: its result's.
    Under ``torch.autocast`` that is the autocast dtype, whatever its operands' dtypes."""
    out = fake(linear)
    return out.dtype if out is not None else None


def linear_operand_fakes(linear: fx.Node, x: Any, weight: Any, bias: Any) -> tuple | None:
    """``(dtype, x, weight, bias)``: the linear's dtype (:func:`linear_dtype`) and its operands' fakes cast to it.
    bias is None without one. None where an operand has no fake."""
    dtype = linear_dtype(linear)
    if dtype is None:
        return None
    xt, wt, bt = (fake_as(v, dtype) for v in (x, weight, bias))
    if xt is None or wt is None or (bias is not None and bt is None):
        return None
    return dtype, xt, wt, bt


def cast_to(graph: fx.Graph, before: fx.Node, values: tuple, dtype: torch.dtype) -> tuple:
    """``values`` (nodes or None) as ``dtype``, with a ``Tensor.to`` inserted before ``before`` where needed.
    This makes autocast's casts explicit for the op that replaces a linear."""
    return tuple(
        insert_op(graph, before, torch.Tensor.to, (v, dtype))
        if isinstance(v, fx.Node) and fake(v) is not None and fake(v).dtype != dtype
        else v
        for v in values
    )


def call(node: Any) -> Call | None:
    """Canonical view of ``node``, or None when it is not one of the ops the passes know."""
    if not isinstance(node, fx.Node):
        return None
    if node.op == "call_function":
        op = _FUNCTIONS.get(node.target)
    elif node.op == "call_method":
        op = _METHODS.get(node.target)
    else:
        return None
    if op is None or _MEANINGFUL_KWARGS & set(node.kwargs):
        return None
    if op == "cast":
        return _cast(node)
    return Call(op, tuple(node.args), dict(node.kwargs))


def _cast(node: fx.Node) -> Call | None:
    """A dtype conversion that keeps shape and device; ``Call("cast", (x,), {"dtype": ...})``."""
    source, out = fake(node.args[0]) if node.args else None, fake(node)
    if source is None or out is None or source.shape != out.shape or source.device != out.device:
        return None
    return Call("cast", (node.args[0],), {"dtype": out.dtype})


def calls_of(graph: fx.Graph, function: Callable) -> Iterator[tuple[fx.Node, dict[str, Any]]]:
    """Each node calling ``function`` as written, with its arguments by name, defaults filled in."""
    signature = inspect.signature(function)
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not function:
            continue
        try:
            bound = signature.bind(*node.args, **node.kwargs)
        except TypeError:
            continue
        bound.apply_defaults()
        yield node, bound.arguments


def calls(node: Any, method: str = "", functions: tuple = ()) -> bool:
    """Whether ``node`` calls Tensor method ``method`` or one of ``functions``, exactly as written.
    For ops that :func:`call` has no canonical view of."""
    return isinstance(node, fx.Node) and (
        (node.op == "call_method" and node.target == method)
        or (node.op == "call_function" and node.target in functions)
    )


def is_op(node: Any, op: str) -> bool:
    c = call(node)
    return c is not None and c.op == op


def strip_casts(node: Any) -> Any:
    """The value under any chain of dtype casts."""
    while (c := call(node)) is not None and c.op == "cast":
        node = c.args[0]
    return node


def binary_operands(c: Call) -> tuple[Any, Any] | None:
    """(lhs, rhs) of add/mul/sub/div given positionally or as ``other=``."""
    args = list(c.args) + [c.kwargs[k] for k in ("other",) if k in c.kwargs]
    return (args[0], args[1]) if len(args) == 2 else None


def other_operand(c: Call, node: Any) -> Any:
    """For a commutative binary op taking ``node``, the other operand; a sentinel when neither is ``node``."""
    ops = binary_operands(c)
    if ops is None:
        return _MISSING
    lhs, rhs = ops
    if lhs is node:
        return rhs
    if rhs is node:
        return lhs
    return _MISSING


_MISSING = object()


def is_missing(value: Any) -> bool:
    return value is _MISSING


def as_number(value: Any) -> float | None:
    """A Python int/float constant (not a bool, not a graph value)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def as_scalar(value: Any) -> float | fx.Node | None:
    """:func:`as_number`, or a graph value holding a symbolic float, as it is.
    Under ``dynamic=True`` a norm's eps is such a value (``docs/passes.md``)."""
    number = as_number(value)
    if number is not None:
        return number
    return value if _is_symbolic_float(value) else None


def _is_symbolic_float(value: Any) -> bool:
    return isinstance(value, fx.Node) and isinstance(_example(value), torch.SymFloat)


def adds_a_unit_dim(node) -> bool:
    """``t.unsqueeze(d)``, ``t[..., None]`` (full slices and None only) or ``t.view/reshape(...)``.
    The caller checks the shapes ([rows] -> [rows, 1]): then each form relabels t's elements alike."""
    if not isinstance(node, fx.Node) or not node.args or not isinstance(node.args[0], fx.Node):
        return False
    target = node.target
    if target in (torch.unsqueeze, torch.Tensor.unsqueeze, torch.reshape, torch.Tensor.view, torch.Tensor.reshape) or (
        node.op == "call_method" and target in ("unsqueeze", "view", "reshape")
    ):
        return True
    c = call(node)
    index = c.args[1] if c is not None and c.op == "getitem" else None
    return (
        isinstance(index, tuple)
        and None in index
        and all(i is None or i is Ellipsis or i == slice(None) for i in index)
    )


def row_vector_of(scale: Any, rows_shape: tuple) -> fx.Node | None:
    """``p`` of shape ``rows_shape`` when ``scale`` is ``p[..., None]``, through dtype casts on either side.
    That is one value per row of a tensor of shape ``rows_shape + (width,)``."""
    st = fake(scale)
    if st is None or tuple(st.shape) != tuple(rows_shape) + (1,):
        return None
    unsqueezed = strip_casts(scale)
    if not adds_a_unit_dim(unsqueezed):
        return None
    p = strip_casts(unsqueezed.args[0])
    pt = fake(p)
    return p if pt is not None and tuple(pt.shape) == tuple(rows_shape) else None


def only_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def users_within(nodes: Iterable[fx.Node], allowed: set[fx.Node]) -> bool:
    """True when every user of every node is in ``allowed`` (so the nodes can be removed)."""
    return all(user in allowed for n in nodes for user in n.users)


def arg(c: Call | fx.Node, index: int, name: str, default: Any = None) -> Any:
    """Argument ``name`` of a call (or of a node as written), given at position ``index`` or by keyword."""
    return c.args[index] if len(c.args) > index else c.kwargs.get(name, default)


def last_dim_only(dim: Any, ndim: int) -> bool:
    """``dim`` names exactly the last dimension (-1, ndim-1, [-1] or (ndim-1,))."""
    if isinstance(dim, (list, tuple)):
        if len(dim) != 1:
            return False
        dim = dim[0]
    return isinstance(dim, int) and not isinstance(dim, bool) and dim in (-1, ndim - 1)


def last_dim_slice(index, xt) -> tuple[int, int] | None:
    """(start, stop) when ``x[index]`` slices only the last dimension with step 1."""
    if not isinstance(index, tuple) or not index or not isinstance(index[-1], slice):
        return None
    leading = index[:-1]
    if leading and leading[0] is Ellipsis:
        leading = leading[1:]
    elif len(index) != xt.dim():
        return None
    if any(s != slice(None) for s in leading) or index[-1].step not in (None, 1):
        return None
    start, stop = index[-1].start or 0, index[-1].stop
    stop = xt.shape[-1] if stop is None else stop
    return (start, stop) if isinstance(start, int) and isinstance(stop, int) else None


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
    fake_mode = next(fake(n).fake_mode for n in nodes if fake(n) is not None)  # the mode Dynamo traced with
    with graph.inserting_before(before):
        node = graph.call_function(op, args, kwargs)
        with fake_mode:
            node.meta["example_value"] = op(*fx.map_arg(args, _example), **fx.map_arg(kwargs, _example))
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


def insert_linear(
    graph: fx.Graph, before: fx.Node, linear: Linear, view: type[OpNode], x: fx.Node | None = None, **arguments: Any
) -> OpNode:
    """Our op ``view`` in place of ``linear``, inserted before ``before``: its x (``x`` where given), W [N, K] and
    bias cast to the linear's dtype (autocast's casts made explicit), and ``arguments``."""
    weight = weight_of(graph, linear)
    values = (linear.x if x is None else x, weight, linear.bias)
    x, weight, bias = cast_to(graph, before, values, linear_dtype(linear.node))
    return insert_view(graph, before, view, x=x, weight=weight, bias=bias, **arguments)


def available_at(value: Any, node: fx.Node, position: dict[fx.Node, int]) -> bool:
    """Whether an op inserted before ``node`` can read ``value`` (``position`` maps nodes to indices).
    Yes if it comes earlier, or can move there: a ``get_attr``, or a symbolic float of earlier values.
    Freezing and ``dynamic=True`` put those just before their first use (``docs/passes.md``)."""
    if not isinstance(value, fx.Node) or position[value] < position[node]:
        return True
    movable = value.op == "get_attr" or (
        _is_symbolic_float(value) and all(position[n] < position[node] for n in value.all_input_nodes)
    )
    if not movable:
        return False
    node.prepend(value)
    position[value] = position[node] - 0.5
    return True


def under_cast(x: fx.Node) -> tuple[fx.Node, torch.dtype | None]:
    """What ``x`` reads: the value under a dtype cast and the cast's dtype, or x itself.
    Under autocast each linear reads its own cast of x (``matcher.insert_linear``)."""
    c = call(x)
    return (c.args[0], c.kwargs["dtype"]) if c is not None and c.op == "cast" else (x, None)


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


def erase_unused(nodes: Iterable[fx.Node]) -> None:
    """Erase the matched nodes (given producers first) that are now dead."""
    for n in reversed(list(nodes)):
        if not n.users:
            n.graph.erase_node(n)


def transpose_source(node) -> fx.Node | None:
    """W for ``W.t()``, ``W.T``, ``W.transpose(0, 1)`` (either order, or -1/-2) of a 2-D W."""
    if not isinstance(node, fx.Node) or not node.args or not isinstance(node.args[0], fx.Node):
        return None
    source, rest = node.args[0], tuple(node.args[1:])
    if node.op == "call_method":
        method = node.target
    elif node.target in (torch.t, torch.transpose):
        method = node.target.__name__
    elif node.target is getattr and rest in (("T",), ("mT",)):
        method, rest = "t", ()
    else:
        return None
    is_t = method == "t" and not rest
    is_swap = method == "transpose" and len(rest) == 2 and {d % 2 for d in rest if isinstance(d, int)} == {0, 1}
    st = fake(source)
    return source if (is_t or is_swap) and st is not None and st.dim() == 2 else None


_MATMULS = (operator.matmul, torch.matmul, torch.Tensor.matmul)


@dataclasses.dataclass(frozen=True)
class Linear:
    """A linear ``y = x W^T + bias``, however spelled. ``weight`` is W [N, K].
    With ``weight_transposed`` it is V [K, N] of ``x @ V``; :func:`weight_of` inserts the transpose."""

    node: fx.Node
    x: Any
    weight: Any
    bias: Any
    weight_transposed: bool = False

    def fakes(self) -> tuple | None:
        """(dtype, x, W [N, K], bias) as fakes cast to the linear's dtype (:func:`linear_dtype`).
        None where an operand has no fake."""
        found = linear_operand_fakes(self.node, self.x, self.weight, self.bias)
        if found is None:
            return None
        dtype, xt, wt, bt = found
        return dtype, xt, wt.t() if self.weight_transposed else wt, bt


def linear_of(node: Any) -> Linear | None:
    """The linear ``node`` computes, or None. ``F.linear``, ``x @ W.t()``, ``x @ W.T``, ``x @ V`` (V 2-D),
    ``torch.matmul(x, W.transpose(0, 1))``, ``torch.mm`` of 2-D operands, ``torch.addmm(bias, x, W.t())``."""
    if not isinstance(node, fx.Node):
        return None
    if node.op == "call_function" and node.target is torch._C._nn.linear:
        return Linear(node, node.args[0], node.args[1], arg(node, 2, "bias"))
    if calls(node, "addmm", (torch.addmm,)):
        if len(node.args) != 3 or any(k not in ("beta", "alpha") or node.kwargs[k] != 1 for k in node.kwargs):
            return None
        bias, x, rhs = node.args
        found = _matmul_linear(node, x, rhs)
        bt, yt = fake(bias), fake(node)
        if found is None or bt is None or yt is None or bt.dim() != 1 or bt.shape[0] != yt.shape[-1]:
            return None
        return dataclasses.replace(found, bias=bias)
    is_matmul = (node.op == "call_function" and node.target in _MATMULS) or calls(node, "matmul")
    is_mm = calls(node, "mm", (torch.mm,))
    if not (is_matmul or is_mm) or len(node.args) != 2 or node.kwargs:
        return None
    x, rhs = node.args
    xt = fake(x)
    if is_mm and (xt is None or xt.dim() != 2):
        return None
    return _matmul_linear(node, x, rhs)


def _matmul_linear(node: fx.Node, x: Any, rhs: Any) -> Linear | None:
    rt = fake(rhs)
    if rt is None or rt.dim() != 2:
        return None
    weight = transpose_source(rhs)
    return Linear(node, x, weight, None) if weight is not None else Linear(node, x, rhs, None, True)


def weight_of(graph: fx.Graph, linear: Linear) -> fx.Node:
    """W [N, K] as a node, inserting ``V.t()`` before the linear for ``x @ V``."""
    if not linear.weight_transposed:
        return linear.weight
    return insert_op(graph, linear.node, torch.ops.aten.t.default, (linear.weight,))


def op_name(node: fx.Node) -> str:
    """A readable name for the op a node runs, for op counts before and after the passes."""
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    if node.op == "call_function":
        target = node.target
        if isinstance(target, torch._ops.OpOverload):
            target = target.overloadpacket
        if isinstance(target, torch._ops.OpOverloadPacket):
            return str(target._qualified_op_name).replace("::", ".")
        name = getattr(target, "__qualname__", None) or getattr(target, "__name__", str(target))
        # torch's C functions (torch.rsqrt) carry their implementing class in the qualified name.
        return "torch." + target.__name__ if name.startswith("_VariableFunctionsClass.") else name
    return node.op
