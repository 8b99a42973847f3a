"""Gated linear units: ``act(gate) * up`` with act in silu (SwiGLU), gelu (GeGLU, exact erf) and gelu_tanh.

Ops in ``torch.ops.turbo_inductor``:
  glu(gate, up, probs, mask, activation, impl) -> out                    custom op; backward: glu_bwd
  glu_fused(x, probs, mask, activation, impl) -> out                     x = [..., 2F]: gate half, then up half
  glu_bwd(dout, gate, up, probs, mask, activation, impl) -> (dgate, dup, dprobs)
  glu_fused_bwd(dout, x, probs, mask, activation, impl) -> (dx, dprobs)
  swiglu(gate, up, impl) -> out                                          public name for glu(..., "silu")

``probs`` (optional, fp32, one per row) scales each row and gets a gradient.
``mask`` (optional, bool, one per row): rows where it is False are exact zeros in the output and every gradient.
Math in fp32, results in the input dtype. The backward recomputes the activation from the inputs.
Without probs, ``dprobs`` is empty. Why: ``docs/ops.md``, "Gated linear units".
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..kernels import registry
from .library import (
    SUPPORTED_FLOAT_DTYPES,
    check,
    check_float,
    check_same_device,
    composite_op,
    flat_or_none,
    kernel_op,
    unit_stride_rows,
)
from .node import OpNode

ACTIVATIONS = ("silu", "gelu", "gelu_tanh")
FWD_KERNEL, BWD_KERNEL = "glu_fwd", "glu_bwd"


def check_glu(
    op: str, gate: Tensor, up: Tensor, probs: Optional[Tensor], mask: Optional[Tensor], activation: str
) -> None:
    check_float(op, "gate", gate)
    check(gate.dim() >= 1, op, lambda: "inputs must have at least one dimension")
    check(
        up.shape == gate.shape and up.dtype == gate.dtype,
        op,
        lambda: f"up ({list(up.shape)}, {up.dtype}) must match gate ({list(gate.shape)}, {gate.dtype})",
    )
    check(activation in ACTIVATIONS, op, lambda: f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if probs is not None:
        check(
            probs.dtype == torch.float32 and probs.shape == gate.shape[:-1],
            op,
            lambda: f"probs must be float32 of shape {list(gate.shape[:-1])}, got {probs.dtype} {list(probs.shape)}",
        )
    if mask is not None:
        check(probs is not None, op, lambda: "mask needs probs (it drops rows of the MoE form)")
        check(
            mask.dtype == torch.bool and mask.shape == gate.shape[:-1],
            op,
            lambda: f"mask must be bool of shape {list(gate.shape[:-1])}, got {mask.dtype} {list(mask.shape)}",
        )
    check_same_device(op, gate=gate, up=up, probs=probs, mask=mask)


def check_glu_fused(op: str, x: Tensor, probs, mask, activation) -> None:
    check_float(op, "x", x)
    check(
        x.dim() >= 1 and x.shape[-1] % 2 == 0,
        op,
        lambda: f"x's last dimension holds gate and up halves: it must be even, got shape {list(x.shape)}",
    )
    half = x.shape[-1] // 2
    check_glu(op, x[..., :half], x[..., half:], probs, mask, activation)


def _no_probs_grad(like: Tensor) -> Tensor:
    return like.new_empty(0, dtype=torch.float32)


def _forward(gate: Tensor, up: Tensor, probs, mask, activation: str, impl: str) -> Tensor:
    if gate.numel() == 0:
        return gate.new_empty(gate.shape)
    out = registry.select(FWD_KERNEL, gate.device, impl)(
        unit_stride_rows(gate), unit_stride_rows(up), flat_or_none(probs), flat_or_none(mask), activation
    )
    return out.view(gate.shape)


def _backward(dout, gate, up, probs, mask, activation, impl, fused: bool):
    """(dgate, dup, dprobs) in gate's shape. dprobs is empty without probs.

    With ``fused``: (dx, None, dprobs), dx the gradient of the fused input holding gate and up."""
    rows_shape = gate.shape[:-1]
    if gate.numel() == 0:
        dgate = gate.new_zeros(rows_shape + (2 * gate.shape[-1],)) if fused else torch.zeros_like(gate)
        dprobs = _no_probs_grad(gate) if probs is None else torch.zeros_like(probs)
        return dgate, None if fused else torch.zeros_like(up), dprobs
    dgate, dup, dprobs = registry.select(BWD_KERNEL, gate.device, impl)(
        unit_stride_rows(dout),
        unit_stride_rows(gate),
        unit_stride_rows(up),
        flat_or_none(probs),
        flat_or_none(mask),
        activation,
        fused,
    )
    dgate = dgate.view(rows_shape + (dgate.shape[-1],))
    dup = None if fused else dup.view(up.shape)
    return dgate, dup, _no_probs_grad(gate) if probs is None else dprobs.view(probs.shape)


# ---- gate and up as two tensors ------------------------------------------------------------------------------


@kernel_op("glu", (FWD_KERNEL,))
def glu(
    gate: Tensor, up: Tensor, probs: Optional[Tensor], mask: Optional[Tensor], activation: str, impl: str = "auto"
) -> Tensor:
    check_glu("glu", gate, up, probs, mask, activation)
    return _forward(gate, up, probs, mask, activation, impl)


@glu.register_fake
def _(gate, up, probs, mask, activation, impl="auto"):
    check_glu("glu", gate, up, probs, mask, activation)
    return gate.new_empty(gate.shape)


@kernel_op("glu_bwd", (BWD_KERNEL,))
def glu_bwd(
    dout: Tensor,
    gate: Tensor,
    up: Tensor,
    probs: Optional[Tensor],
    mask: Optional[Tensor],
    activation: str,
    impl: str = "auto",
) -> tuple[Tensor, Tensor, Tensor]:
    check_glu("glu_bwd", gate, up, probs, mask, activation)
    _check_dout(dout, gate.shape, gate.dtype)
    return _backward(dout, gate, up, probs, mask, activation, impl, fused=False)


@glu_bwd.register_fake
def _(dout, gate, up, probs, mask, activation, impl="auto"):
    check_glu("glu_bwd", gate, up, probs, mask, activation)
    _check_dout(dout, gate.shape, gate.dtype)
    dprobs = _no_probs_grad(gate) if probs is None else probs.new_empty(probs.shape)
    return gate.new_empty(gate.shape), up.new_empty(up.shape), dprobs


def _setup_glu(ctx, inputs, output):
    gate, up, probs, mask, activation, impl = inputs
    ctx.save_for_backward(gate, up, probs, mask)
    ctx.activation, ctx.impl = activation, impl


def _backward_glu(ctx, dout):
    gate, up, probs, mask = ctx.saved_tensors
    dgate, dup, dprobs = glu_bwd(dout, gate, up, probs, mask, ctx.activation, ctx.impl)
    return dgate, dup, None if probs is None else dprobs, None, None, None


glu.register_autograd(_backward_glu, setup_context=_setup_glu)


# ---- gate and up as the two halves of one tensor (a fused gate/up projection) ------------------------------


@kernel_op("glu_fused", (FWD_KERNEL,))
def glu_fused(
    x: Tensor, probs: Optional[Tensor], mask: Optional[Tensor], activation: str, impl: str = "auto"
) -> Tensor:
    check_glu_fused("glu_fused", x, probs, mask, activation)
    half = x.shape[-1] // 2
    x = x.contiguous()
    return _forward(x[..., :half], x[..., half:], probs, mask, activation, impl)


@glu_fused.register_fake
def _(x, probs, mask, activation, impl="auto"):
    check_glu_fused("glu_fused", x, probs, mask, activation)
    return x.new_empty(x.shape[:-1] + (x.shape[-1] // 2,))


@kernel_op("glu_fused_bwd", (BWD_KERNEL,))
def glu_fused_bwd(
    dout: Tensor, x: Tensor, probs: Optional[Tensor], mask: Optional[Tensor], activation: str, impl: str = "auto"
) -> tuple[Tensor, Tensor]:
    check_glu_fused("glu_fused_bwd", x, probs, mask, activation)
    half = x.shape[-1] // 2
    _check_dout(dout, x.shape[:-1] + (half,), x.dtype)
    x = x.contiguous()
    dx, _, dprobs = _backward(dout, x[..., :half], x[..., half:], probs, mask, activation, impl, fused=True)
    return dx, dprobs


@glu_fused_bwd.register_fake
def _(dout, x, probs, mask, activation, impl="auto"):
    check_glu_fused("glu_fused_bwd", x, probs, mask, activation)
    _check_dout(dout, x.shape[:-1] + (x.shape[-1] // 2,), x.dtype)
    return x.new_empty(x.shape), _no_probs_grad(x) if probs is None else probs.new_empty(probs.shape)


def _setup_glu_fused(ctx, inputs, output):
    x, probs, mask, activation, impl = inputs
    ctx.save_for_backward(x, probs, mask)
    ctx.activation, ctx.impl = activation, impl


def _backward_glu_fused(ctx, dout):
    x, probs, mask = ctx.saved_tensors
    dx, dprobs = glu_fused_bwd(dout, x, probs, mask, ctx.activation, ctx.impl)
    return dx, None if probs is None else dprobs, None, None, None


glu_fused.register_autograd(_backward_glu_fused, setup_context=_setup_glu_fused)


def _check_dout(dout: Tensor, shape, dtype) -> None:
    check(
        dout.shape == shape and dout.dtype == dtype,
        "glu_bwd",
        lambda: f"dout ({list(dout.shape)}, {dout.dtype}) must be {list(shape)}, {dtype}",
    )


@composite_op("swiglu")
def swiglu(gate: Tensor, up: Tensor, impl: str = "auto") -> Tensor:
    return glu(gate, up, None, None, "silu", impl)


def can_rewrite(gate: Tensor) -> bool:
    """Whether our ops can run this GLU (fake ``gate``), forward and backward."""
    return (
        gate.dtype in SUPPORTED_FLOAT_DTYPES
        and gate.dim() >= 1
        and all(registry.available_on(kernel, gate.device) for kernel in (FWD_KERNEL, BWD_KERNEL))
    )


class GLUNode(OpNode):
    op = torch.ops.turbo_inductor.glu.default
    kernels = (FWD_KERNEL, BWD_KERNEL)


class GLUFusedNode(OpNode):
    op = torch.ops.turbo_inductor.glu_fused.default
    kernels = (FWD_KERNEL, BWD_KERNEL)
