"""Cross-entropy over class indices -> ``turbo_inductor.cross_entropy``.

Spellings matched: ``F.cross_entropy`` (``nn.CrossEntropyLoss`` calls it) on fp32 logits [N, V] and targets [N],
any ``ignore_index``, reduction mean, sum or none; no class weights, no label smoothing.
Hugging Face's causal-LM loss upcasts first, ``logits.float().view(-1, V)``: the op then reads the bf16 logits and
computes in fp32 as the upcast did, with no fp32 copy. Logits from an FP8 linear (the LM head) take the gradient's
reference, tensor math that Inductor fuses into that linear's quantization of dy, unless ``impl`` names another.
Why the loss is worth a kernel: ``docs/ops.md``, "Cross-entropy".
"""

from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn.functional as F

from ..kernels import registry
from ..ops.cross_entropy import BWD_KERNEL, REDUCTIONS, CrossEntropyNode, can_rewrite
from ..ops.fp8_linear import FP8LinearNode
from ..options import Options
from . import ir, surgery
from .manager import Phase, RewritePass, declined

_LOW_PRECISION = (torch.bfloat16, torch.float16)


def _upcast_source(node: fx.Node) -> fx.Node | None:
    """x for ``x.float()`` (any spelling of a cast to fp32) of a bf16/fp16 x, used by nothing else."""
    c = ir.call(node)
    if c is None or c.op != "cast" or c.kwargs["dtype"] != torch.float32 or len(node.users) != 1:
        return None
    source = ir.fake(c.args[0])
    return c.args[0] if source is not None and source.dtype in _LOW_PRECISION else None


def _without_upcast(logits: fx.Node) -> fx.Node:
    """The logits to hand the op: ``logits`` with its upcast dropped, directly or under a view (then erased)."""
    source = _upcast_source(logits)
    if source is not None:
        return source
    if ir.calls(logits, "view", (torch.reshape,)) or ir.calls(logits, "reshape"):
        upcast = logits.args[0]
        source = _upcast_source(upcast) if isinstance(upcast, fx.Node) and len(logits.users) == 1 else None
        if source is not None:  # the view now reads the low-precision logits
            logits.replace_input_with(upcast, source)
            logits.meta["example_value"] = ir.fake_as(logits, ir.fake(source).dtype)
            logits.graph.erase_node(upcast)
    return logits


def _from_fp8_linear(logits: fx.Node) -> bool:
    """Whether ``logits`` is an FP8 linear's output, directly or under views."""
    while isinstance(logits, fx.Node):
        if FP8LinearNode.matches(logits):
            return True
        if not (ir.calls(logits, "view", (torch.reshape,)) or ir.calls(logits, "reshape")):
            return False
        logits = logits.args[0]
    return False


class CrossEntropyPass(RewritePass):
    """`F.cross_entropy` to `turbo_inductor.cross_entropy`: the logits read in their own dtype."""

    name = "cross_entropy"
    phase = Phase.FUSE

    def apply(self, graph: fx.Graph, options: Options) -> int:
        count = 0
        for node, arguments in ir.calls_of(graph, F.cross_entropy):
            reason = self._declines(arguments)
            if reason is not None:
                declined(self.name, node, reason)
                continue
            upcast = arguments["input"]
            logits = _without_upcast(upcast)
            ce = surgery.insert_view(
                graph,
                node,
                CrossEntropyNode,
                logits=logits,
                target=arguments["target"],
                ignore_index=arguments["ignore_index"],
                reduction=arguments["reduction"],
                impl=self._impl(logits, options.impl),
            )
            node.replace_all_uses_with(ce.node)
            graph.erase_node(node)
            surgery.erase_unused([upcast] if upcast is not logits else [])
            count += 1
        return count

    @staticmethod
    def _impl(logits: fx.Node, impl: str) -> str:
        """``impl``; under auto, the gradient's reference where the logits come from an FP8 linear."""
        return f"{BWD_KERNEL}=reference" if impl == registry.AUTO and _from_fp8_linear(logits) else impl

    @staticmethod
    def _declines(arguments: dict) -> str | None:
        logits, target = ir.fake(arguments["input"]), ir.fake(arguments["target"])
        if logits is None or target is None:
            return "logits or target is not a tensor"
        if logits.dtype != torch.float32:
            return f"logits in {logits.dtype}: the op computes in fp32, as cross_entropy does for fp32 logits"
        if arguments["weight"] is not None or arguments["label_smoothing"] != 0.0:
            return "class weights or label smoothing"
        if arguments["size_average"] is not None or arguments["reduce"] is not None:
            return "the deprecated size_average / reduce arguments"
        if arguments["reduction"] not in REDUCTIONS or not isinstance(arguments["ignore_index"], int):
            return f"reduction {arguments['reduction']!r} or a symbolic ignore_index"
        if not can_rewrite(logits, target):
            return f"logits {list(logits.shape)} and target {target.dtype} {list(target.shape)}: not [N, V] and [N]"
        return None
