"""A bf16 or fp16 ``mm`` whose one use is its cast to fp32 -> ``aten.mm.dtype(a, b, float32)``: the GEMM writes fp32.
A view between them (a 3-D input's gradient) stays, as a view of the fp32 product.

Under ``torch.autocast`` with fp32 parameters, each weight's gradient is a bf16 mm cast back to fp32 in the backward
graph: a pass over every gradient each step, and a rounding to bf16 on the way. cuBLAS accumulates in fp32 and
writes it instead. A POST_GRAD pass: the cast only exists in AOTAutograd's backward graph. CUDA only (cuBLAS's
``mm.dtype``; unmeasured on ROCm). Why: ``docs/passes.md``, "Autocast".
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..options import Options
from . import ir
from .manager import Phase, RewritePass

aten, prims = torch.ops.aten, torch.ops.prims
_NARROW = (torch.bfloat16, torch.float16)
_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def _fp32_cast_of_mm(node: fx.Node) -> tuple[fx.Node, fx.Node | None] | None:
    """``(mm, view)``: the mm that ``node`` casts to fp32, directly (view None) or through one view, where each is
    the next one's one use, the operands are bf16 or fp16 alike, and they are on an NVIDIA GPU; else None."""
    if node.target is not prims.convert_element_type.default or node.args[1] != torch.float32:
        return None
    mm, view = node.args[0], None
    if isinstance(mm, fx.Node) and mm.target in _VIEWS and len(mm.users) == 1:
        mm, view = mm.args[0], mm
    if not isinstance(mm, fx.Node) or mm.target is not aten.mm.default or len(mm.users) != 1:
        return None
    a, b = map(ir.fake, mm.args)
    if a is None or b is None or a.dtype != b.dtype:
        return None
    return (mm, view) if a.dtype in _NARROW and a.device.type == "cuda" and torch.version.hip is None else None


def _lowered() -> bool:
    """Whether this torch has ``mm.dtype`` and Inductor lowers it (to cuBLAS's ``mm_dtype_out``): torch >= 2.8."""
    from torch._inductor.kernel import mm as inductor_mm

    return hasattr(aten.mm, "dtype") and hasattr(inductor_mm, "aten_mm_dtype")


class MMFP32OutputPass(RewritePass):
    """A bf16 mm cast to fp32 (a gradient under autocast) as one mm writing fp32."""

    name = "mm_fp32_output"
    phase = Phase.POST_GRAD
    option_doc = (
        "A bf16 or fp16 matmul whose one use is its cast to fp32 (each fp32 parameter's gradient under autocast) "
        "writes fp32 itself: one pass over each gradient less per step, and no rounding to bf16. CUDA only. "
        "Details: `docs/passes.md`."
    )

    def apply(self, graph: fx.Graph, options: Options) -> int:
        if not _lowered():
            return 0
        count = 0
        for node in list(graph.nodes):
            matched = _fp32_cast_of_mm(node)
            if matched is None:
                continue
            mm, view = matched
            with graph.inserting_before(mm):
                fused = graph.call_function(aten.mm.dtype, (*mm.args, torch.float32))
            if view is None:
                fused.meta.update(node.meta)
            else:
                fused.meta["val"] = ir.fake_as(mm, torch.float32)
                view.replace_input_with(mm, fused)
                view.meta.update(node.meta)
            node.replace_all_uses_with(view if view is not None else fused)
            graph.erase_node(node)
            graph.erase_node(mm)
            count += 1
        return count
