"""MoE token routing in plain PyTorch. It defines the semantics of the routing kernels.
Choices sort by expert, stably; experts outside [0, E) are sentinels and sort last.
``moe_dispatch_fp8`` quantizes each token once and moves its FP8 row and scales, for FP8 experts.
See docs/kernels.md, MoE routing.
"""

from __future__ import annotations

import torch

from ..registry import implementation
from . import traced_off_cpu, unavailable_reason
from .fp8_quant import fp8_quantize


@implementation("moe_route", "reference", priority=0, unavailable_reason=unavailable_reason, traceable=traced_off_cpu)
def moe_route(indices: torch.Tensor, num_experts: int):
    """Returns ``(offs, order, positions)``. ``offs`` [E] int32 holds each expert's end row.
    ``order`` [T * k] holds each row's choice ``t * k + j``; ``positions`` [T, k] each choice's row.
    A stable sort and a binary search: no atomics, no host sync."""
    flat = indices.reshape(-1)
    expert = torch.where((flat >= 0) & (flat < num_experts), flat, num_experts)  # sentinels: one bucket past the end
    sorted_experts, order = torch.sort(expert, stable=True)
    bounds = torch.arange(num_experts, device=flat.device, dtype=sorted_experts.dtype)
    offs = torch.searchsorted(sorted_experts, bounds, right=True).to(torch.int32)
    positions = torch.empty_like(order)
    positions[order] = torch.arange(order.shape[0], device=order.device)
    return offs, order, positions.view(indices.shape)


def _scaled(rows: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    rows = rows.float()
    return rows if weights is None else rows * weights.float().unsqueeze(-1)


@implementation(
    "moe_dispatch", "reference", priority=0, unavailable_reason=unavailable_reason, traceable=traced_off_cpu
)
def moe_dispatch(src, positions, weights=None, other=None):
    """``(out, dots)``: ``out[positions[t, j]] = src[t] * weights[t, j]`` in src's dtype.
    ``dots[t, j]`` (fp32) is the dot of ``src[t]`` with ``other[positions[t, j]]``; None without ``other``."""
    tokens, k = positions.shape
    rows = _scaled(src.unsqueeze(1).expand(tokens, k, src.shape[1]), weights)  # [T, k, H]: src[t] per choice
    out = torch.empty((tokens * k, src.shape[1]), dtype=src.dtype, device=src.device)
    out[positions.reshape(-1)] = rows.reshape(tokens * k, src.shape[1]).to(src.dtype)
    dots = None
    if other is not None:
        dots = (src.float().unsqueeze(1) * other[positions].float()).sum(-1)
    return out, dots


@implementation(
    "moe_gather_sum", "reference", priority=0, unavailable_reason=unavailable_reason, traceable=traced_off_cpu
)
def moe_gather_sum(src, positions, weights, out_dtype):
    """``out[t] = sum_j src[positions[t, j]] * weights[t, j]`` in fp32, rounded once to ``out_dtype``."""
    return _scaled(src[positions], weights).sum(1).to(out_dtype)


@implementation(
    "moe_dispatch_fp8", "reference", priority=0, unavailable_reason=unavailable_reason, traceable=traced_off_cpu
)
def moe_dispatch_fp8(x, positions, fp8_dtype, block_cols, power_of_two=False):
    """``(q [T * k, H], scale [T * k, cdiv(H, block_cols)])``: x [T, H] quantized per token in blocks of 1 x
    ``block_cols`` (``fp8_quantize``'s numerics), token t's FP8 row and scales copied to rows ``positions[t, :]``.
    A scale within a row is the same whichever expert the row goes to: this equals quantizing the moved rows."""
    q, scale = fp8_quantize(x, fp8_dtype, 1, block_cols, False, power_of_two=power_of_two)
    q_sorted = moe_dispatch(q.view(torch.uint8), positions)[0].view(fp8_dtype)  # the FP8 bytes, copied exactly
    return q_sorted, moe_dispatch(scale, positions)[0]


__all__ = ["moe_route", "moe_dispatch", "moe_gather_sum", "moe_dispatch_fp8"]
