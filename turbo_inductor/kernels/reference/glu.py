"""Gated linear units (SwiGLU, GeGLU) in plain PyTorch. They define the semantics.
``out = act(gate) * up * probs[:, None]`` in fp32, rounded once. Masked rows are exact zeros in every output.
Activations: silu, gelu (erf) and gelu_tanh. See docs/kernels.md, GLU.
"""

from __future__ import annotations

import math

import torch

from ..registry import implementation
from . import traced_off_cpu, unavailable_reason
from .fp8_quant import fp8_quantize

ACTIVATIONS = ("silu", "gelu", "gelu_tanh")

_SQRT_1_2 = math.sqrt(0.5)  # gelu: erf(x / sqrt(2))
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)  # gelu': the normal density's constant
_TANH_K = math.sqrt(2.0 / math.pi)  # gelu_tanh: tanh(k * (x + c x^3))
_TANH_C = 0.044715


def _check_activation(activation: str) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"turbo_inductor: unknown GLU activation {activation!r}; choose from {ACTIVATIONS}")


def activation_and_grad(x: torch.Tensor, activation: str, need_grad: bool):
    """``(act(x), act'(x))`` of an fp32 tensor (the derivative is None unless ``need_grad``)."""
    _check_activation(activation)
    if activation == "silu":
        s = torch.sigmoid(x)
        act = x * s
        grad = s * (1.0 + x * (1.0 - s)) if need_grad else None
    elif activation == "gelu":
        cdf = 0.5 * (1.0 + torch.erf(x * _SQRT_1_2))
        act = x * cdf
        grad = cdf + x * (_INV_SQRT_2PI * torch.exp(-0.5 * x * x)) if need_grad else None
    else:  # gelu_tanh: 0.5 * (1 + tanh(u)) == sigmoid(2u), without the cancellation of 1 + tanh near -1
        u = _TANH_K * (x + _TANH_C * x * x * x)
        s = torch.sigmoid(2.0 * u)
        act = x * s
        grad = s + 2.0 * x * s * (1.0 - s) * (_TANH_K * (1.0 + 3.0 * _TANH_C * x * x)) if need_grad else None
    return act, grad


def _row_scale(probs: torch.Tensor | None) -> torch.Tensor | float:
    return probs.float().unsqueeze(-1) if probs is not None else 1.0


def _keep(mask: torch.Tensor | None) -> torch.Tensor | None:
    return mask.to(torch.bool).unsqueeze(-1) if mask is not None else None


@implementation("glu_fwd", "reference", priority=0, unavailable_reason=unavailable_reason, traceable=traced_off_cpu)
def glu_fwd(
    gate: torch.Tensor, up: torch.Tensor, probs: torch.Tensor | None, mask: torch.Tensor | None, activation: str
) -> torch.Tensor:
    """``out`` [rows, F] contiguous, gate.dtype: ``act(gate) * up * probs[:, None]``, masked rows zero."""
    act, _ = activation_and_grad(gate.float(), activation, need_grad=False)
    out = act * up.float() * _row_scale(probs)
    keep = _keep(mask)
    if keep is not None:
        # A select, not a multiply: a dropped row's NaN or inf must not leak.
        out = torch.where(keep, out, 0.0)
    # ``.to`` may return its input (fp32). Here that is a fresh temporary, never an alias of gate.
    return out.to(gate.dtype).contiguous()


@implementation("glu_fwd_fp8", "reference", priority=0, unavailable_reason=unavailable_reason, traceable=traced_off_cpu)
def glu_fwd_fp8(
    gate: torch.Tensor,
    up: torch.Tensor,
    probs: torch.Tensor | None,
    mask: torch.Tensor | None,
    activation: str,
    fp8_dtype: torch.dtype,
    block_cols: int,
    power_of_two: bool = False,
):
    """``(out, q, scale)``: :func:`glu_fwd`'s out and its FP8 copy.
    The copy uses blocks of 1 x ``block_cols``, as ``fp8_quantize`` makes them."""
    out = glu_fwd(gate, up, probs, mask, activation)
    return out, *fp8_quantize(out, fp8_dtype, 1, block_cols, False, power_of_two=power_of_two)


@implementation("glu_bwd", "reference", priority=0, unavailable_reason=unavailable_reason, traceable=traced_off_cpu)
def glu_bwd(
    dout: torch.Tensor,
    gate: torch.Tensor,
    up: torch.Tensor,
    probs: torch.Tensor | None,
    mask: torch.Tensor | None,
    activation: str,
    fused: bool,
):
    """``(dgate, dup, dprobs)``: ``dout * up * p * act'(gate)`` and ``dout * act(gate) * p`` in gate's dtype.
    ``dprobs`` is fp32, one per row; None without probs.
    ``fused``: dgate is one [rows, 2F] tensor (dgate | dup), and dup is None."""
    g32 = gate.float()
    u32 = up.float()
    do32 = dout.float()
    act, act_grad = activation_and_grad(g32, activation, need_grad=True)
    scale = _row_scale(probs)
    dg = do32 * u32 * scale * act_grad
    du = do32 * act * scale
    keep = _keep(mask)
    if keep is not None:
        dg = torch.where(keep, dg, 0.0)
        du = torch.where(keep, du, 0.0)
    grads = (torch.cat([dg, du], dim=-1).to(gate.dtype), None) if fused else (dg.to(gate.dtype), du.to(gate.dtype))
    if probs is None:
        return (*grads, None)
    dprobs = (do32 * act * u32).sum(dim=-1)
    if keep is not None:
        dprobs = torch.where(keep.squeeze(-1), dprobs, 0.0)
    return (*grads, dprobs)
