"""``x * cos + rotate_half(x) * sin`` -> ``turbo_inductor.rotary``.

Spelling matched (Hugging Face's ``apply_rotary_pos_emb``, either order of each product and of the sum):
  ``x * cos + torch.cat((-x[..., D/2:], x[..., :D/2]), dim=-1) * sin`` for a 4-D x ([B, H, S, D], or [B, S, H, D])
  and cos, sin of one 4-D shape broadcasting to it (the model's table unsqueezed at the heads).
The table then stays one tensor that our kernel reads per row; Inductor would compute cos and sin again for every
element of every head (``docs/ops.md``, "Rotary embedding").
A table in a wider dtype than x (fp32 parameters under bf16 autocast: the Trainer's mixed precision) promotes the
sum. Where autocast casts every use of it back to x's dtype (attention, matmuls), the kernel rounds its fp32 sum to
x's dtype once, as that cast would; the wider value it stands for is a cast of that. Left alone: other rotations
(interleaved pairs, complex multiplies), a table of fewer dimensions or broadcast along D, and a promoted sum that
some use reads uncast.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..ops.rotary import RotaryNode, can_rewrite
from ..options import Options
from . import ir, patterns, surgery
from .autocast import AutocastCasts
from .manager import Phase, RewritePass, declined


def rotated_half_of(node) -> tuple[fx.Node, list[fx.Node]] | None:
    """(x, the nodes from x to ``node``) when ``node`` is ``torch.cat((-x[..., D/2:], x[..., :D/2]), dim=-1)``."""
    c = ir.call(node)
    if c is None or c.op != "cat":
        return None
    parts, dim = ir.arg(c, 0, "tensors"), ir.arg(c, 1, "dim", 0)
    if not isinstance(parts, (list, tuple)) or len(parts) != 2 or not ir.is_op(parts[0], "neg"):
        return None
    second, first = ir.call(parts[0]).args[0], parts[1]
    sc, fc = ir.call(second), ir.call(first)
    if sc is None or fc is None or sc.op != "getitem" or fc.op != "getitem" or sc.args[0] is not fc.args[0]:
        return None
    x = sc.args[0]
    xt = ir.fake(x)
    if xt is None or not patterns.last_dim_only(dim, xt.dim()) or not isinstance(xt.shape[-1], int) or xt.shape[-1] % 2:
        return None
    half = xt.shape[-1] // 2
    halves = [patterns.last_dim_slice(index, xt) for index in (fc.args[1], sc.args[1])]
    if halves != [(0, half), (half, 2 * half)]:
        return None
    return x, [second, first, parts[0], node]


def _products(node) -> tuple | None:
    """(a, b) of a multiply ``a * b``."""
    c = ir.call(node)
    return ir.binary_operands(c) if c is not None and c.op == "mul" else None


def rotation_of(node) -> tuple[fx.Node, fx.Node, fx.Node, list[fx.Node]] | None:
    """(x, cos, sin, the matched nodes, producers first) when ``node`` is ``x * cos + rotate_half(x) * sin``."""
    c = ir.call(node)
    terms = ir.binary_operands(c) if c is not None and c.op == "add" else None
    if terms is None:
        return None
    for plain, rotated in (terms, terms[::-1]):
        plain_ops, rotated_ops = _products(plain), _products(rotated)
        if plain_ops is None or rotated_ops is None:
            continue
        for half, sin in (rotated_ops, rotated_ops[::-1]):
            found = rotated_half_of(half)
            if found is None:
                continue
            x, matched = found
            cos = ir.other_operand(ir.call(plain), x)
            if not ir.is_missing(cos) and isinstance(cos, fx.Node) and isinstance(sin, fx.Node):
                return x, cos, sin, [*matched, plain, rotated]
    return None


class RotaryPass(RewritePass):
    """``x * cos + rotate_half(x) * sin`` (rotary position embedding) to ``turbo_inductor.rotary``."""

    name = "rotary"
    phase = Phase.FUSE

    def apply(self, graph: fx.Graph, options: Options) -> int:
        count, casts = 0, AutocastCasts(graph)
        for node in list(graph.nodes):
            found = rotation_of(node)
            if found is None:
                continue
            x, cos, sin, matched = found
            xt, ct, st, out = ir.fake(x), ir.fake(cos), ir.fake(sin), ir.fake(node)
            if any(t is None for t in (xt, ct, st, out)) or not can_rewrite(xt, ct, st):
                continue
            if out.shape != xt.shape:
                continue
            promoted = out.dtype != xt.dtype
            if promoted and casts.for_every_use(node) != xt.dtype:
                declined(self.name, node, f"the sum promotes to {out.dtype} and some use reads it uncast")
                continue
            rotated = surgery.insert_view(graph, node, RotaryNode, x=x, cos=cos, sin=sin, impl=options.impl).node
            if promoted:
                rotated = surgery.insert_op(graph, node, torch.Tensor.to, (rotated, out.dtype))
            node.replace_all_uses_with(rotated)
            graph.erase_node(node)
            surgery.erase_unused(matched)
            count += 1
        return count
