"""Hand-written dynamic FP8 quantization feeding ``torch._scaled_mm`` -> ``turbo_inductor.fp8_linear``.

Matched, for each operand t of ``torch._scaled_mm(q_x, q_w.t(), scale_a=s_x, scale_b=s_w, out_dtype=x.dtype,
use_fast_accum=True)``:
    s = t.abs().amax()[.float()].clamp(min=1e-12) / FMAX         (also torch.amax / torch.abs / clamp_min)
    q = (t[.float()] / s).clamp(-FMAX, FMAX).to(<the device's e4m3>)
That is "tensorwise"; with ``amax(dim=-1, keepdim=True)`` for both and ``scale_b=s_w.t()``, "rowwise".
What is left alone, and why the results agree: ``docs/passes.md``.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..kernels.reference.fp8_quant import AMAX_FLOOR
from ..ops.fp8_linear import FP8LinearNode, can_rewrite
from ..ops.fp8_operands import fp8_formats
from ..options import Options
from ..recipes import RECIPES
from . import ir, patterns, surgery
from .manager import Phase, RewritePass


def _clamp_bounds(node) -> tuple | None:
    """(min, max) of ``clamp`` / ``clamp_min`` given as numbers, None for anything else."""
    if ir.calls(node, "clamp_min", (torch.clamp_min,)):
        return ir.arg(node, 1, "min"), None
    if not ir.calls(node, "clamp", (torch.clamp,)):
        return None
    return ir.arg(node, 1, "min"), ir.arg(node, 2, "max")


def _scale_source(scale, fmax: float) -> tuple[fx.Node, str] | None:
    """(t, recipe) when ``scale`` is ``t.abs().amax()[.float()].clamp(min=AMAX_FLOOR) / fmax``: "tensorwise".
    With ``amax(dim=-1, keepdim=True)`` of a 2-D t: "rowwise"."""
    c = ir.call(scale)
    if c is None or c.op != "div" or ir.binary_operands(c) is None or ir.binary_operands(c)[1] != fmax:
        return None
    floored = ir.binary_operands(c)[0]
    if _clamp_bounds(floored) != (AMAX_FLOOR, None):
        return None
    amax = ir.strip_casts(floored.args[0])
    if not ir.calls(amax, "amax", (torch.amax,)):
        return None
    if len(amax.args) == 1 and not amax.kwargs:  # no dim: the whole tensor
        recipe = "tensorwise"
    elif patterns.last_dim_only(ir.arg(amax, 1, "dim"), 2) and ir.arg(amax, 2, "keepdim") is True:
        recipe = "rowwise"
    else:
        return None
    absolute = amax.args[0]
    if not ir.calls(absolute, "abs", (torch.abs,)) or len(absolute.args) != 1:
        return None
    source = ir.fake(absolute.args[0])
    if recipe == "rowwise" and (source is None or source.dim() != 2):
        return None
    return absolute.args[0], recipe


def quantized(q, fp8_dtype: torch.dtype) -> tuple[fx.Node, fx.Node, str] | None:
    """(t, its scale node, recipe) when ``q`` is ``(t / s).clamp(-FMAX, FMAX).to(fp8_dtype)``.
    s must be t's tensorwise or rowwise scale."""
    c = ir.call(q)
    if c is None or c.op != "cast" or c.kwargs["dtype"] != fp8_dtype:
        return None
    fmax = torch.finfo(fp8_dtype).max
    clamp = c.args[0]
    if _clamp_bounds(clamp) != (-fmax, fmax):
        return None
    divided = ir.call(clamp.args[0])
    operands = ir.binary_operands(divided) if divided is not None and divided.op == "div" else None
    if operands is None:
        return None
    t, scale = ir.strip_casts(operands[0]), operands[1]
    source = _scale_source(scale, fmax)
    return (t, scale, source[1]) if source is not None and source[0] is t else None


class FP8ScaledMMPass(RewritePass):
    """Hand-written FP8 quantization and ``torch._scaled_mm`` to our FP8 linear."""

    name = "fp8_scaled_mm"
    phase = Phase.CLAIM

    def apply(self, graph: fx.Graph, options: Options) -> int:
        count = 0
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target is not torch._scaled_mm or len(node.args) != 2:
                continue
            extra = {
                k: v for k, v in node.kwargs.items() if k not in ("scale_a", "scale_b", "out_dtype", "use_fast_accum")
            }
            if any(v is not None for v in extra.values()):  # bias, scale_result
                continue
            qx, qw_t = node.args
            qw = patterns.transpose_source(qw_t)
            xt = ir.fake(qx)
            if qw is None or xt is None:
                continue
            e4m3 = fp8_formats(xt.device)[0]
            x_side, w_side = quantized(qx, e4m3), quantized(qw, e4m3)
            if x_side is None or w_side is None or x_side[2] != w_side[2]:
                continue
            (x, x_scale, recipe), (w, w_scale, _) = x_side, w_side
            if node.kwargs.get("use_fast_accum", False) is not RECIPES[recipe].fast_accum_forward:
                continue
            scale_b = node.kwargs.get("scale_b")  # rowwise: W's per-row scales as a [1, N] row
            if (
                node.kwargs.get("scale_a") is not x_scale
                or (scale_b if recipe == "tensorwise" else patterns.transpose_source(scale_b)) is not w_scale
            ):
                continue
            x_fake, w_fake = ir.fake(x), ir.fake(w)
            if (
                x_fake is None
                or w_fake is None
                or node.kwargs.get("out_dtype") != x_fake.dtype
                or not can_rewrite(x_fake, w_fake, None)
            ):
                continue
            surgery.replace_with_view(
                graph, node, FP8LinearNode, x=x, weight=w, bias=None, recipe=recipe, impl=options.impl
            )
            surgery.erase_unused(surgery.producers([qx, qw_t, scale_b], stop={x, w}))  # scale_b: rowwise, a transpose
            count += 1
        return count
