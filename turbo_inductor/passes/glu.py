"""``act(gate) * up`` -> ``turbo_inductor.glu``, or ``turbo_inductor.glu_fused`` for a fused gate/up projection.

Spellings matched (either multiplication order; fp32/bf16/fp16; any leading dims):
  - ``F.silu(g) * u`` (``nn.SiLU``, Hugging Face's ``act_fn(gate_proj(x)) * up_proj(x)``, torchtitan's
    ``w2(F.silu(w1(x)) * w3(x))``), ``F.gelu(g) * u``, ``F.gelu(g, approximate="tanh") * u``.
  - g and u as halves of one projection: ``x.chunk(2, -1)``, ``x.split(F, -1)``, ``x.split([F, F], -1)``,
    ``x[..., :F]`` and ``x[..., F:]``. ``glu_fused`` reads both halves of x in place.
  - Either form times an fp32 weight per row, ``(act(g) * u) * probs[..., None]``: MoE router weights, as ``probs``.
Left alone: other activations, broadcasting or promoting multiplies, an activation read elsewhere too.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..ops.glu import GLUFusedNode, GLUNode, can_rewrite
from ..options import Options
from . import ir, patterns, surgery
from .manager import Phase, RewritePass

_GELU = {"none": "gelu", "tanh": "gelu_tanh"}


def activation_of(node) -> tuple[str, fx.Node] | None:
    """(activation name, its input) for ``F.silu(g)`` / ``F.gelu(g, approximate=...)``."""
    c = ir.call(node)
    if c is None:
        return None
    if c.op == "silu" and not ir.arg(c, 1, "inplace", False):
        return "silu", ir.arg(c, 0, "input")
    if c.op == "gelu" and ir.arg(c, 1, "approximate", "none") in _GELU:
        return _GELU[ir.arg(c, 1, "approximate", "none")], ir.arg(c, 0, "input")
    return None


def halves_of(gate, up) -> tuple[fx.Node, list[fx.Node]] | None:
    """(x, split nodes) when gate and up are x's first and second halves along its last dimension."""
    gc, uc = ir.call(gate), ir.call(up)
    if gc is None or uc is None or gc.op != "getitem" or uc.op != "getitem" or gc.args[0] is not uc.args[0]:
        return None
    source, gate_index, up_index = gc.args[0], gc.args[1], uc.args[1]
    if isinstance(gate_index, int):  # items of chunk / split
        sc = ir.call(source)
        if sc is None or sc.op not in ("chunk", "split") or (gate_index, up_index) != (0, 1):
            return None
        x = sc.args[0]
        xt = ir.fake(x)
        if xt is None or set(source.users) != {gate, up} or not _splits_in_halves(sc, xt):
            return None
        return x, [source]
    xt = ir.fake(source)
    if xt is None or not isinstance(xt.shape[-1], int) or xt.shape[-1] % 2:
        return None
    half = xt.shape[-1] // 2
    halves = [patterns.last_dim_slice(index, xt) for index in (gate_index, up_index)]
    if halves == [(0, half), (half, 2 * half)]:
        return source, []
    return None


def _splits_in_halves(c: ir.Call, xt) -> bool:
    width = xt.shape[-1]
    if not isinstance(width, int) or width % 2:
        return False
    if c.op == "chunk":
        return ir.arg(c, 1, "chunks") == 2 and patterns.last_dim_only(ir.arg(c, 2, "dim", 0), xt.dim())
    size = ir.arg(c, 1, "split_size_or_sections", c.kwargs.get("split_size"))
    halves = size == width // 2 or (isinstance(size, (list, tuple)) and list(size) == [width // 2] * 2)
    return halves and patterns.last_dim_only(ir.arg(c, 2, "dim", 0), xt.dim())


def row_weight_of(scale, out) -> fx.Node | None:
    """``p`` (fp32, shaped like ``out`` without its last dim) when ``scale`` is ``p[..., None]``, through casts.
    That is one weight per row of ``out``."""
    ot = ir.fake(out)
    probs = patterns.row_vector_of(scale, ot.shape[:-1]) if ot is not None else None
    pt = ir.fake(probs)
    if probs is None or pt.dtype != torch.float32 or pt.device != ot.device:
        return None
    return probs


def _weighting(node) -> tuple[fx.Node, fx.Node, list[fx.Node]] | None:
    """(the multiply, probs, the nodes from probs to the weight) when ``node``'s one use multiplies it by a
    per-row weight. The multiply keeps shape and dtype; the nodes are listed producers first."""
    user = ir.only_user(node)
    c = ir.call(user)
    if c is None or c.op != "mul":
        return None
    scale = ir.other_operand(c, node)
    if ir.is_missing(scale) or not _same_type(node, user):
        return None
    probs = row_weight_of(scale, node)
    if probs is None:
        return None
    chain = [scale]
    while chain[0].args[0] is not probs:
        chain.insert(0, chain[0].args[0])
    return user, probs, chain


def _same_type(*nodes) -> bool:
    tensors = [ir.fake(n) for n in nodes]
    return all(t is not None for t in tensors) and all(
        t.shape == tensors[0].shape and t.dtype == tensors[0].dtype and t.device == tensors[0].device for t in tensors
    )


class GLUPass(RewritePass):
    """``act(gate) * up`` (SwiGLU, GeGLU) to ``turbo_inductor.glu`` / ``glu_fused``."""

    name = "glu"
    phase = Phase.FUSE

    def apply(self, graph: fx.Graph, options: Options) -> int:
        count, erased = 0, set()
        for node in list(graph.nodes):
            if node in erased:  # a split matched with an earlier multiply
                continue
            c = ir.call(node)
            operands = ir.binary_operands(c) if c is not None and c.op == "mul" else None
            if operands is None:
                continue
            for act, up in (operands, operands[::-1]):
                found = activation_of(act)
                if found is None or ir.only_user(act) is not node:
                    continue
                activation, gate = found
                if not _same_type(gate, up, node) or not can_rewrite(ir.fake(gate)):
                    continue
                out, probs, weight_nodes = _weighting(node) or (node, None, [])
                common = {"probs": probs, "activation": activation, "impl": options.impl}
                halves = halves_of(gate, up)
                if halves is not None:
                    x, split_nodes = halves
                    new = surgery.insert_view(graph, out, GLUFusedNode, x=x, **common)
                    matched = split_nodes + [gate, up, act, node]
                else:
                    new = surgery.insert_view(graph, out, GLUNode, gate=gate, up=up, **common)
                    matched = [act, node]
                out.replace_all_uses_with(new.node)
                erased.update(surgery.erase_unused(weight_nodes + matched + ([out] if out is not node else [])))
                count += 1
                break
        return count
