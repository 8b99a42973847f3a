"""Cross-entropy of logits [N, V] against class targets [N], computed in fp32: ``F.cross_entropy(logits.float(),
target, ignore_index=..., reduction=...)`` without the fp32 copy of the logits.

Ops in ``torch.ops.turbo_inductor``:
  cross_entropy(logits, target, ignore_index, reduction, impl) -> loss          public (composite over the forward)
  cross_entropy_fwd(logits, target, ignore_index, impl) -> (loss, lse)          custom op, per row, fp32 [N] each
  cross_entropy_bwd(logits, target, lse, dloss, ignore_index, impl) -> dlogits  custom op (not differentiable)

A row whose target is ``ignore_index`` has loss 0 and counts in no mean; a target outside [0, V) gives NaN.
The gradient, ``(softmax - onehot) * dloss`` in fp32 returned in the logits' dtype, is ``cross_entropy_bwd``. Its
reference is plain tensor math, which Inductor fuses into the gradient's consumer (an FP8 LM head's quantization
of dy); its Triton kernel is faster where nothing would fuse. ``docs/ops.md``, "Cross-entropy".
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels import registry
from .library import SUPPORTED_FLOAT_DTYPES, check, check_float, check_same_device, composite_op, kernel_op
from .node import OpNode

FWD_KERNEL, BWD_KERNEL = "cross_entropy_fwd", "cross_entropy_bwd"
REDUCTIONS = ("mean", "sum", "none")
TARGET_DTYPES = (torch.int64, torch.int32)


def _check_inputs(op: str, logits: Tensor, target: Tensor) -> None:
    check_float(op, "logits", logits)
    check(logits.dim() == 2, op, lambda: f"logits must be 2-D [N, V], got shape {list(logits.shape)}")
    check(
        isinstance(target, Tensor) and target.dtype in TARGET_DTYPES,
        op,
        lambda: f"target must be an int64 or int32 tensor of class indices, got {getattr(target, 'dtype', target)}",
    )
    check(
        target.dim() == 1 and target.shape[0] == logits.shape[0],
        op,
        lambda: f"target must be 1-D with logits' {logits.shape[0]} rows, got shape {list(target.shape)}",
    )
    check(logits.shape[1] > 0, op, lambda: "logits must have at least one class")
    check_same_device(op, logits=logits, target=target)


@kernel_op("cross_entropy_fwd", (FWD_KERNEL,))
def cross_entropy_fwd(
    logits: Tensor, target: Tensor, ignore_index: int = -100, impl: str = "auto"
) -> tuple[Tensor, Tensor]:
    _check_inputs("cross_entropy", logits, target)
    if logits.shape[0] == 0:
        empty = logits.new_empty((0,), dtype=torch.float32)
        return empty, torch.empty_like(empty)
    return registry.select(FWD_KERNEL, logits.device, impl)(logits.contiguous(), target.contiguous(), ignore_index)


@cross_entropy_fwd.register_fake
def _(logits, target, ignore_index=-100, impl="auto"):
    _check_inputs("cross_entropy", logits, target)
    rows = logits.new_empty((logits.shape[0],), dtype=torch.float32)
    return rows, torch.empty_like(rows)


@kernel_op("cross_entropy_bwd", (BWD_KERNEL,))
def cross_entropy_bwd(
    logits: Tensor, target: Tensor, lse: Tensor, dloss: Tensor, ignore_index: int = -100, impl: str = "auto"
) -> Tensor:
    _check_backward(logits, target, lse, dloss)
    if logits.shape[0] == 0:
        return torch.empty_like(logits)
    return registry.select(BWD_KERNEL, logits.device, impl)(
        logits.contiguous(), target.contiguous(), lse.contiguous(), dloss.contiguous(), ignore_index
    )


@cross_entropy_bwd.register_fake
def _(logits, target, lse, dloss, ignore_index=-100, impl="auto"):
    _check_backward(logits, target, lse, dloss)
    return torch.empty_like(logits, memory_format=torch.contiguous_format)


def _check_backward(logits: Tensor, target: Tensor, lse: Tensor, dloss: Tensor) -> None:
    _check_inputs("cross_entropy_bwd", logits, target)
    for name, rows in (("lse", lse), ("dloss", dloss)):
        check(
            rows.dtype == torch.float32 and rows.shape == (logits.shape[0],),
            "cross_entropy_bwd",
            lambda name=name, rows=rows: (
                f"{name} must be fp32 [{logits.shape[0]}], got {rows.dtype} {list(rows.shape)}"
            ),
        )


def _setup_fwd(ctx, inputs, output):
    logits, target, ignore_index, impl = inputs
    ctx.save_for_backward(logits, target, output[1])
    ctx.ignore_index, ctx.impl = ignore_index, impl
    ctx.mark_non_differentiable(output[1])


def _backward_fwd(ctx, dloss, _dlse):
    logits, target, lse = ctx.saved_tensors
    return cross_entropy_bwd(logits, target, lse, dloss.float(), ctx.ignore_index, ctx.impl), None, None, None


cross_entropy_fwd.register_autograd(_backward_fwd, setup_context=_setup_fwd)


# The schema spelled out: inferred from the signature, ignore_index would become a SymInt.
@composite_op(
    "cross_entropy",
    "(Tensor logits, Tensor target, int ignore_index=-100, str reduction='mean', str impl='auto') -> Tensor",
)
def cross_entropy(logits: Tensor, target: Tensor, ignore_index: int = -100, reduction: str = "mean", impl="auto"):
    check(reduction in REDUCTIONS, "cross_entropy", lambda: f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    loss, _ = cross_entropy_fwd(logits, target, ignore_index, impl)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / (target != ignore_index).sum()  # NaN where every row is ignored, as torch's


def can_rewrite(logits: Tensor, target: Tensor) -> bool:
    """Whether our ops can run this cross-entropy (fake tensors), forward and backward."""
    return (
        logits.dtype in SUPPORTED_FLOAT_DTYPES
        and logits.dim() == 2
        and target.dtype in TARGET_DTYPES
        and target.dim() == 1
        and target.device == logits.device
        and registry.available_on(FWD_KERNEL, logits.device)
        and registry.available_on(BWD_KERNEL, logits.device)
    )


class CrossEntropyNode(OpNode):
    op = cross_entropy
    kernels = (FWD_KERNEL, BWD_KERNEL)
