"""Embedding lookup: ``F.embedding(indices, weight, padding_idx)``, with a weight gradient written in one pass.

Ops in ``torch.ops.turbo_inductor``:
  embedding(weight, indices, padding_idx, impl) -> weight[indices]         custom op; backward: embedding_bwd
  embedding_bwd(grad, indices, num_weights, padding_idx, impl) -> dweight  custom op (not differentiable)

``padding_idx`` -1 means none; its row gets no gradient. dweight is summed in fp32 and rounded once to the weight's
dtype. Why a kernel: ``docs/ops.md``, "Embedding".
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..kernels import registry
from .library import SUPPORTED_FLOAT_DTYPES, check, check_float, check_same_device, kernel_op
from .node import OpNode

FWD_KERNEL, BWD_KERNEL = "embedding_fwd", "embedding_bwd"
INDEX_DTYPES = (torch.int64, torch.int32)


def padding_row(padding_idx: int | None, num_weights: int) -> int:
    """F.embedding's ``padding_idx`` as the ops take it: -1 for None, a negative index counted from the end."""
    if padding_idx is None:
        return -1
    return padding_idx + num_weights if padding_idx < 0 else padding_idx


def _check_indices(op: str, indices: Tensor, num_weights: int, padding_idx: int) -> None:
    check(
        isinstance(indices, Tensor) and indices.dtype in INDEX_DTYPES,
        op,
        lambda: f"indices must be an int64 or int32 tensor, got {getattr(indices, 'dtype', indices)}",
    )
    check(
        padding_idx == -1 or 0 <= padding_idx < num_weights,
        op,
        lambda: f"padding_idx must be -1 (none) or a row in [0, {num_weights}), got {padding_idx}",
    )


def _check_inputs(weight: Tensor, indices: Tensor, padding_idx: int) -> None:
    check_float("embedding", "weight", weight)
    check(weight.dim() == 2, "embedding", lambda: f"weight must be 2-D [V, H], got shape {list(weight.shape)}")
    _check_indices("embedding", indices, weight.shape[0], padding_idx)
    check_same_device("embedding", weight=weight, indices=indices)


@kernel_op("embedding", (FWD_KERNEL,))
def embedding(weight: Tensor, indices: Tensor, padding_idx: int = -1, impl: str = "auto") -> Tensor:
    _check_inputs(weight, indices, padding_idx)
    return registry.select(FWD_KERNEL, weight.device, impl)(weight.contiguous(), indices.contiguous())


@embedding.register_fake
def _(weight, indices, padding_idx=-1, impl="auto"):
    _check_inputs(weight, indices, padding_idx)
    return weight.new_empty((*indices.shape, weight.shape[1]))


@kernel_op("embedding_bwd", (BWD_KERNEL,))
def embedding_bwd(grad: Tensor, indices: Tensor, num_weights: int, padding_idx: int = -1, impl: str = "auto") -> Tensor:
    _check_backward(grad, indices, num_weights, padding_idx)
    rows = grad.reshape(-1, grad.shape[-1]).contiguous()
    if rows.shape[0] == 0 or rows.shape[1] == 0 or num_weights == 0:
        return grad.new_zeros((num_weights, grad.shape[-1]))
    return registry.select(BWD_KERNEL, grad.device, impl)(rows, indices.reshape(-1), num_weights, padding_idx)


@embedding_bwd.register_fake
def _(grad, indices, num_weights, padding_idx=-1, impl="auto"):
    _check_backward(grad, indices, num_weights, padding_idx)
    return grad.new_empty((num_weights, grad.shape[-1]))


def _check_backward(grad: Tensor, indices: Tensor, num_weights: int, padding_idx: int) -> None:
    check_float("embedding_bwd", "grad", grad)
    _check_indices("embedding_bwd", indices, num_weights, padding_idx)
    check(
        grad.dim() >= 1 and grad.shape[:-1] == indices.shape,
        "embedding_bwd",
        lambda: f"grad {list(grad.shape)} must be indices' shape {list(indices.shape)} plus one dimension",
    )


def _setup(ctx, inputs, output):
    weight, indices, padding_idx, impl = inputs
    ctx.save_for_backward(indices)
    ctx.num_weights, ctx.padding_idx, ctx.impl, ctx.dtype = weight.shape[0], padding_idx, impl, weight.dtype


def _backward(ctx, grad):
    (indices,) = ctx.saved_tensors
    dweight = embedding_bwd(grad.to(ctx.dtype), indices, ctx.num_weights, ctx.padding_idx, ctx.impl)
    return dweight, None, None, None


embedding.register_autograd(_backward, setup_context=_setup)


def can_rewrite(weight: Tensor, indices: Tensor) -> bool:
    """Whether our ops can run this lookup (fake tensors), forward and backward."""
    return (
        weight.dtype in SUPPORTED_FLOAT_DTYPES
        and weight.dim() == 2
        and indices.dtype in INDEX_DTYPES
        and indices.device == weight.device
        and math.prod(weight.shape) > 0
        and all(registry.available_on(kernel, weight.device) for kernel in (FWD_KERNEL, BWD_KERNEL))
    )


class EmbeddingNode(OpNode):
    op = torch.ops.turbo_inductor.embedding.default
    kernels = (FWD_KERNEL, BWD_KERNEL)
