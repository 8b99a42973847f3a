"""RMSNorm -> ``turbo_inductor.rmsnorm``.

Spellings matched (any eps, fp32/bf16/fp16, any leading dims):
  - ``torch.rms_norm`` / ``F.rms_norm`` / ``nn.RMSNorm`` over the last dimension;
  - the decomposed form Hugging Face and torchtitan write::

        xf = x.to(torch.float32)                        # optional upcast (.float(), .to(), .type_as(), ...)
        var = xf.pow(2).mean(-1, keepdim=True)          # or xf ** 2, xf * xf, torch.square(xf)
        n = xf * torch.rsqrt(var + eps)                 # or xf / torch.sqrt(var + eps)
        y = weight * n.to(x.dtype)                      # optional cast back; weight optional, either side
        y = (n * weight).to(x.dtype)                    # or Gemma's: weighted in fp32, then cast back

A weight multiply that promotes (fp32 weight, bf16 norm) stays in the graph; only the normalization is replaced.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.fx as fx

from ..ops.rmsnorm import RMSNormNode, can_rewrite
from ..options import Options
from . import ir, patterns, surgery
from .manager import Phase, RewritePass


@dataclasses.dataclass
class RMSNormMatch:
    x: fx.Node
    weight: fx.Node | None
    eps: float | fx.Node  # a number, or a symbolic float's node (dynamic=True)
    output: fx.Node
    matched: list[fx.Node]  # nodes the rewrite makes dead, producers first


def match_functional(node: fx.Node) -> RMSNormMatch | None:
    """``torch.rms_norm(x, (H,), weight, eps)`` over the last dimension."""
    c = ir.call(node)
    if c is None or c.op != "rms_norm":
        return None
    names = ("input", "normalized_shape", "weight", "eps")
    bound = dict(zip(names, c.args)) | {k: v for k, v in c.kwargs.items() if k in names}
    x, shape, weight, eps = bound.get("input"), bound.get("normalized_shape"), bound.get("weight"), bound.get("eps")
    xt = ir.fake(x)
    if xt is None or not isinstance(shape, (list, tuple)) or len(shape) != 1 or shape[0] != xt.shape[-1]:
        return None
    if eps is None:  # torch.rms_norm's default: the epsilon of its fp32 computation dtype
        eps = torch.finfo(torch.float32).eps
    eps = ir.as_scalar(eps)
    if eps is None or (weight is not None and ir.fake(weight) is None):
        return None
    return RMSNormMatch(x, weight, eps, node, [node])


def match_decomposed(mean: fx.Node) -> RMSNormMatch | None:
    """The decomposed spelling, anchored at its ``mean``."""
    c = ir.call(mean)
    if c is None or c.op != "mean" or len(c.args) < 1 or c.kwargs.get("dtype") is not None:
        return None
    squares = c.args[0]
    dim = ir.arg(c, 1, "dim")
    keepdim = ir.arg(c, 2, "keepdim", False)
    xf = _squared(squares)
    xft = ir.fake(xf)
    if (
        xft is None
        or keepdim is not True
        or not patterns.last_dim_only(dim, xft.dim())
        or ir.only_user(squares) is not mean
    ):
        return None
    # var + eps
    add = ir.only_user(mean)
    ac = ir.call(add)
    if ac is None or ac.op != "add":
        return None
    eps = ir.as_scalar(ir.other_operand(ac, mean))
    if eps is None:
        return None
    # xf * rsqrt(var + eps)  |  xf / sqrt(var + eps)
    root = ir.only_user(add)
    rc = ir.call(root)
    normed = ir.only_user(root) if root is not None else None
    nc = ir.call(normed)
    if rc is None or nc is None:
        return None
    if rc.op == "rsqrt" and nc.op == "mul" and ir.other_operand(nc, root) is xf:
        pass
    elif rc.op == "sqrt" and nc.op == "div" and ir.binary_operands(nc) == (xf, root):
        pass
    else:
        return None
    matched = [squares, mean, add, root, normed]
    # optional cast back, then optional weight
    out = normed
    cast = ir.only_user(out)
    if cast is not None and ir.is_op(cast, "cast"):
        matched.append(cast)
        out = cast
    base = _match(xf, out, matched, eps)
    scale = ir.only_user(out)
    sc = ir.call(scale)
    if sc is not None and sc.op == "mul":
        weight = ir.other_operand(sc, out)
        wt = ir.fake(weight)
        # A promoting weight (fp32 weight * bf16 norm) stays a separate multiply. Fusing it would drop the
        # graph's rounding to bf16 before it.
        if (
            wt is not None
            and wt.dim() == 1
            and wt.shape[0] == xft.shape[-1]
            and ir.fake(scale).dtype == ir.fake(out).dtype
        ):
            weighted = _match(xf, scale, matched + [scale], eps, weight)
            if weighted is not None:
                return weighted
    return base


def _squared(node: Any) -> Any:
    """x for pow(x, 2), x ** 2, square(x) or x * x; else None."""
    c = ir.call(node)
    if c is None:
        return None
    if c.op == "pow" and len(c.args) == 2 and ir.as_number(c.args[1]) == 2.0:
        return c.args[0]
    if c.op == "square" and len(c.args) == 1:
        return c.args[0]
    if c.op == "mul":
        ops = ir.binary_operands(c)
        if ops is not None and ops[0] is ops[1]:
            return ops[0]
    return None


def _match(
    xf: fx.Node, out: fx.Node, matched: list[fx.Node], eps: float | fx.Node, weight: fx.Node | None = None
) -> RMSNormMatch | None:
    """The match whose output is ``out``. Its input is x before the upcast where dtypes allow, else xf itself.

    Where ``out`` is upcast and its one user casts it back to x's dtype (Gemma's ``(norm(x.float()) * (1 +
    w.float())).type_as(x)``), that cast is the output: the op then takes and saves x, not its fp32 copy."""
    x, cast = ir.strip_casts(xf), ir.only_user(out)
    if x is not xf and cast is not None and ir.is_op(cast, "cast") and _same_tensor_type(x, cast):
        return RMSNormMatch(x, weight, eps, cast, matched + [cast])
    for candidate in (x, xf):
        if _same_tensor_type(candidate, out):
            return RMSNormMatch(candidate, weight, eps, out, matched)
    return None


def _same_tensor_type(a: fx.Node, b: fx.Node) -> bool:
    at, bt = ir.fake(a), ir.fake(b)
    return at is not None and bt is not None and at.dtype == bt.dtype and at.shape == bt.shape


class RMSNormPass(RewritePass):
    """RMSNorm spellings to ``turbo_inductor.rmsnorm``."""

    name = "rmsnorm"
    phase = Phase.FUSE

    def apply(self, graph: fx.Graph, options: Options) -> int:
        count, erased = 0, set()
        for node in list(graph.nodes):
            if node in erased:  # matched by an earlier anchor
                continue
            found = match_functional(node) or match_decomposed(node)
            if found is None or not can_rewrite(ir.fake(found.x), ir.fake(found.weight)):
                continue
            norm = surgery.insert_view(
                graph, found.output, RMSNormNode, x=found.x, weight=found.weight, eps=found.eps, impl=options.impl
            )
            found.output.replace_all_uses_with(norm.node)
            erased.update(surgery.erase_unused(found.matched))
            count += 1
        return count
