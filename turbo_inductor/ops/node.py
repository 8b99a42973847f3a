"""Named views of our ops' nodes in an FX graph, derived from each op's schema.

Passes read and write our ops' arguments by name through these views, never by position.
A new optional argument on an op then changes no pass.
"""

from __future__ import annotations

import operator
from typing import Any, ClassVar

import torch
import torch.fx as fx

_NO_DEFAULT = object()
_VIEWS: dict = {}  # op -> its OpNode subclass


class OpNode:
    """A node calling ``op``.

    Subclasses set ``op``; a view reads and writes every argument of its schema by name (``view.x_q``,
    ``set(x_q=...)``), so it spells none. An annotation on a view must name an argument of the schema.
    An op returning several results names them in ``outputs``. ``kernels``: the registry kernels the op runs,
    forward and backward (reported per compiled graph, ``CompileRecord.implementations``)."""

    op: ClassVar[torch._ops.OpOverload]
    outputs: ClassVar[tuple[str, ...]] = ()
    kernels: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        names = {a.name for a in cls.op._schema.arguments}
        unknown = [name for name in cls.__annotations__ if name not in names]
        if unknown:
            raise TypeError(f"{cls.__name__}: {unknown} are not arguments of {cls.op._schema}")
        returns = len(cls.op._schema.returns)
        if cls.outputs and len(cls.outputs) != returns:
            raise TypeError(f"{cls.__name__}: outputs {cls.outputs} but {cls.op} returns {returns} values")
        _VIEWS[cls.op] = cls  # only a view that passed the checks: a rejected one must not replace the op's view

    def __init__(self, node: fx.Node):
        if not self.matches(node):
            raise TypeError(f"{type(self).__name__}: {node.format_node()} does not call {self.op}")
        self.node = node

    @classmethod
    def matches(cls, node: Any) -> bool:
        return isinstance(node, fx.Node) and node.op == "call_function" and node.target is cls.op

    @classmethod
    def of(cls, node: Any) -> OpNode | None:
        """The view of ``node``, or None where it does not call this op."""
        return cls(node) if cls.matches(node) else None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "node":
            raise AttributeError(name)
        return self.arguments()[name] if name in _names(type(self).op) else super().__getattribute__(name)

    def arguments(self) -> dict[str, Any]:
        """Every argument by name, defaults filled in."""
        schema = type(self).op._schema
        values = {}
        for i, argument in enumerate(schema.arguments):
            if not argument.kwarg_only and i < len(self.node.args):
                values[argument.name] = self.node.args[i]
            elif argument.name in self.node.kwargs:
                values[argument.name] = self.node.kwargs[argument.name]
            else:
                values[argument.name] = _default(argument)
        return values

    def set(self, **values: Any) -> None:
        """Replace the arguments named in ``values``."""
        args, kwargs = self.call_arguments(**(self.arguments() | values))
        self.node.args, self.node.kwargs = args, kwargs

    @classmethod
    def call_arguments(cls, **values: Any) -> tuple[tuple, dict]:
        """(args, kwargs) of a call with these arguments, in schema order, trailing defaults left out.

        Keyword-only arguments go in kwargs. A missing required argument or an unknown name is an error."""
        schema = cls.op._schema
        unknown = set(values) - _names(cls.op)
        if unknown:
            raise TypeError(f"{cls.__name__}: {sorted(unknown)} are not arguments of {schema}")
        args, kwargs = [], {}
        for argument in schema.arguments:
            value = values.get(argument.name, _default(argument))
            if value is _NO_DEFAULT:
                raise TypeError(f"{cls.__name__}: argument {argument.name!r} of {schema} is required")
            if argument.kwarg_only:
                if argument.name in values:
                    kwargs[argument.name] = value
            else:
                args.append((argument, value))
        while args and args[-1][0].has_default_value() and _same(args[-1][1], _default(args[-1][0])):
            args.pop()
        return tuple(value for _, value in args), kwargs

    def output(self, name: str) -> fx.Node | None:
        """The node reading result ``name`` (a ``getitem``), or None where nothing reads it."""
        index = self.outputs.index(name)
        return next(
            (u for u in self.node.users if u.target is operator.getitem and u.args[1] == index),
            None,
        )


def _names(op: torch._ops.OpOverload) -> set[str]:
    return {a.name for a in op._schema.arguments}


def _default(argument) -> Any:
    """The schema's default; None for an optional argument without one (``Tensor? mask``)."""
    if argument.has_default_value():
        return argument.default_value
    return None if isinstance(argument.type, torch.OptionalType) else _NO_DEFAULT


def _same(value: Any, default: Any) -> bool:
    return type(value) is type(default) and value == default if not isinstance(value, fx.Node) else False


def view_of(node: Any) -> OpNode | None:
    """The view of ``node`` where it calls one of our ops that has a view, else None."""
    view = _VIEWS.get(getattr(node, "target", None)) if isinstance(node, fx.Node) else None
    return view.of(node) if view is not None else None
