"""Linears however spelled (``F.linear``, ``x @ W.t()``, ``torch.mm``, ``addmm``, ...), the dtype they compute in,
and our op inserted in place of one with autocast's casts made explicit."""

from __future__ import annotations

import dataclasses
import operator
from typing import Any

import torch
import torch.fx as fx

from ..ops.node import OpNode
from . import ir, patterns, surgery

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
        return Linear(node, node.args[0], node.args[1], ir.arg(node, 2, "bias"))
    if ir.calls(node, "addmm", (torch.addmm,)):
        if len(node.args) != 3 or any(k not in ("beta", "alpha") or node.kwargs[k] != 1 for k in node.kwargs):
            return None
        bias, x, rhs = node.args
        found = _matmul_linear(node, x, rhs)
        bt, yt = ir.fake(bias), ir.fake(node)
        if found is None or bt is None or yt is None or bt.dim() != 1 or bt.shape[0] != yt.shape[-1]:
            return None
        return dataclasses.replace(found, bias=bias)
    is_matmul = (node.op == "call_function" and node.target in _MATMULS) or ir.calls(node, "matmul")
    is_mm = ir.calls(node, "mm", (torch.mm,))
    if not (is_matmul or is_mm) or len(node.args) != 2 or node.kwargs:
        return None
    x, rhs = node.args
    xt = ir.fake(x)
    if is_mm and (xt is None or xt.dim() != 2):
        return None
    return _matmul_linear(node, x, rhs)


def _matmul_linear(node: fx.Node, x: Any, rhs: Any) -> Linear | None:
    rt = ir.fake(rhs)
    if rt is None or rt.dim() != 2:
        return None
    weight = patterns.transpose_source(rhs)
    return Linear(node, x, weight, None) if weight is not None else Linear(node, x, rhs, None, True)


def weight_of(graph: fx.Graph, linear: Linear) -> fx.Node:
    """W [N, K] as a node, inserting ``V.t()`` before the linear for ``x @ V``."""
    if not linear.weight_transposed:
        return linear.weight
    return surgery.insert_op(graph, linear.node, torch.ops.aten.t.default, (linear.weight,))


def linear_dtype(linear: fx.Node) -> torch.dtype | None:
    """The dtype a linear-like ``linear`` computes in: its result's.
    Under ``torch.autocast`` that is the autocast dtype, whatever its operands' dtypes."""
    out = ir.fake(linear)
    return out.dtype if out is not None else None


def linear_operand_fakes(linear: fx.Node, x: Any, weight: Any, bias: Any) -> tuple | None:
    """``(dtype, x, weight, bias)``: the linear's dtype (:func:`linear_dtype`) and its operands' fakes cast to it.
    bias is None without one. None where an operand has no fake."""
    dtype = linear_dtype(linear)
    if dtype is None:
        return None
    xt, wt, bt = (ir.fake_as(v, dtype) for v in (x, weight, bias))
    if xt is None or wt is None or (bias is not None and bt is None):
        return None
    return dtype, xt, wt, bt


def cast_to(graph: fx.Graph, before: fx.Node, values: tuple, dtype: torch.dtype) -> tuple:
    """``values`` (nodes or None) as ``dtype``, with a ``Tensor.to`` inserted before ``before`` where needed.
    This makes autocast's casts explicit for the op that replaces a linear."""
    return tuple(
        surgery.insert_op(graph, before, torch.Tensor.to, (v, dtype))
        if isinstance(v, fx.Node) and ir.fake(v) is not None and ir.fake(v).dtype != dtype
        else v
        for v in values
    )


def insert_linear(
    graph: fx.Graph,
    before: fx.Node,
    linear: Linear,
    view: type[OpNode],
    x: fx.Node | None = None,
    fp32_weight: bool = False,
    **arguments: Any,
) -> OpNode:
    """Our op ``view`` in place of ``linear``, inserted before ``before``: its x (``x`` where given), W [N, K] and
    bias cast to the linear's dtype (autocast's casts made explicit), and ``arguments``.
    With ``fp32_weight`` a float32 W stays float32, for an op that reads it so (``fp8_linear``)."""
    weight = weight_of(graph, linear)
    w = ir.fake(weight)
    kept = fp32_weight and w is not None and w.dtype == torch.float32
    values = (linear.x if x is None else x, None if kept else weight, linear.bias)
    x, cast_weight, bias = cast_to(graph, before, values, linear_dtype(linear.node))
    weight = weight if kept else cast_weight
    return surgery.insert_view(graph, before, view, x=x, weight=weight, bias=bias, **arguments)
