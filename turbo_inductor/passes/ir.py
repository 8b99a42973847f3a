"""The canonical view of the torch IR Dynamo captures, and what Dynamo recorded for its values.

Torch IR is not normalized: ``x.pow(2)``, ``torch.pow(x, 2)`` and ``x ** 2`` are different nodes.
:func:`call` gives one view of them, so a pass matches ``("pow", (x, 2))`` once for every spelling.
"""

from __future__ import annotations

import dataclasses
import inspect
import operator
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx as fx

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


def under_cast(x: fx.Node) -> tuple[fx.Node, torch.dtype | None]:
    """What ``x`` reads: the value under a dtype cast and the cast's dtype, or x itself.
    Under autocast each linear reads its own cast of x (``linears.insert_linear``)."""
    c = call(x)
    return (c.args[0], c.kwargs["dtype"]) if c is not None and c.op == "cast" else (x, None)


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


def arg(c: Call | fx.Node, index: int, name: str, default: Any = None) -> Any:
    """Argument ``name`` of a call (or of a node as written), given at position ``index`` or by keyword."""
    return c.args[index] if len(c.args) > index else c.kwargs.get(name, default)


def only_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


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
    return value if is_symbolic_float(value) else None


def is_symbolic_float(value: Any) -> bool:
    """Whether ``value`` is a graph value holding a symbolic float (``.item()`` of an input, under dynamic=True)."""
    return isinstance(value, fx.Node) and isinstance(_example(value), torch.SymFloat)


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
