"""Rotary position embedding: ``x * cos + rotate_half(x) * sin`` (Hugging Face's ``apply_rotary_pos_emb``).

Ops in ``torch.ops.turbo_inductor``:
  rotary(x, cos, sin, transposed, impl) -> x rotated     custom op; backward: rotary of the gradient, transposed

x is 4-D with its rotated dimension last, any strides: [B, H, S, D] as attention takes it (transformers'
``unsqueeze_dim=1``) or [B, S, H, D] (``unsqueeze_dim=2``). cos and sin are one shape that broadcasts to x along its
first three dimensions (each 1 or x's). The result has x's layout, computed in fp32 and rounded once. Why a kernel:
``docs/ops.md``, "Rotary embedding".
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels import registry
from .library import OpInputError, check, check_float, check_same_device, kernel_op
from .node import OpNode

KERNEL = "rotary"


def _check_inputs(x: Tensor, cos: Tensor, sin: Tensor) -> None:
    for name, t in (("x", x), ("cos", cos), ("sin", sin)):
        check_float("rotary", name, t)
    check(x.dim() == 4, "rotary", lambda: f"x must be 4-D (e.g. [B, H, S, D]), got shape {list(x.shape)}")
    check(x.shape[-1] % 2 == 0, "rotary", lambda: f"x's last dimension must be even, got {x.shape[-1]}")
    check(
        cos.shape == sin.shape and broadcasts_to(cos.shape, x.shape),
        "rotary",
        lambda: (
            f"cos {list(cos.shape)} and sin {list(sin.shape)} must be one 4-D shape that broadcasts to x "
            f"{list(x.shape)} along its first three dimensions"
        ),
    )
    check_same_device("rotary", x=x, cos=cos, sin=sin)


def broadcasts_to(table: torch.Size, shape: torch.Size) -> bool:
    """Whether a cos/sin table of shape ``table`` broadcasts to x's ``shape``, its last dimension x's."""
    return len(table) == 4 and table[3] == shape[3] and all(t in (1, n) for t, n in zip(table[:3], shape[:3]))


@kernel_op("rotary", (KERNEL,))
def rotary(x: Tensor, cos: Tensor, sin: Tensor, transposed: bool = False, impl: str = "auto") -> Tensor:
    _check_inputs(x, cos, sin)
    return registry.select(KERNEL, x.device, impl)(x, cos, sin, transposed)


@rotary.register_fake
def _(x, cos, sin, transposed=False, impl="auto"):
    _check_inputs(x, cos, sin)
    return torch.empty_like(x)


def _setup(ctx, inputs, output):
    x, cos, sin, transposed, impl = inputs
    ctx.save_for_backward(x if ctx.needs_input_grad[1] or ctx.needs_input_grad[2] else None, cos, sin)
    ctx.transposed, ctx.impl = transposed, impl


def _backward(ctx, grad):
    x, cos, sin = ctx.saved_tensors
    dx = rotary(grad, cos, sin, not ctx.transposed, ctx.impl) if ctx.needs_input_grad[0] else None
    dcos = dsin = None
    if x is not None:  # a table that wants a gradient: plain tensor math, summed over what it broadcast along
        g, xf, half = grad.float(), x.float(), x.shape[-1] // 2
        g1, g2, x1, x2 = g[..., :half], g[..., half:], xf[..., :half], xf[..., half:]
        dcos = (g * xf).sum_to_size(cos.shape).to(cos.dtype)
        rotated = torch.cat((-x1 * g2, x2 * g1) if ctx.transposed else (-x2 * g1, x1 * g2), dim=-1)
        dsin = rotated.sum_to_size(sin.shape).to(sin.dtype)
    return dx, dcos, dsin, None, None


rotary.register_autograd(_backward, setup_context=_setup)


def can_rewrite(x: Tensor, cos: Tensor, sin: Tensor) -> bool:
    """Whether our op can run this rotation (fake tensors), forward and backward: the op's own checks pass."""
    try:
        _check_inputs(x, cos, sin)
    except OpInputError:
        return False
    return registry.available_on(KERNEL, x.device)


class RotaryNode(OpNode):
    op = torch.ops.turbo_inductor.rotary.default
    kernels = (KERNEL,)
