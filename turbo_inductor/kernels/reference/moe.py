"""MoE token routing in plain PyTorch: the order of the (token, choice) pairs by expert, and the rows moved between
token order and that order. Sets the semantics.

A router picks k experts per token: ``indices`` [T, k]. Its T * k choices, flattened as t * k + j, are ordered by
expert, stably (ties in token order); choices of an index outside [0, E) (expert-parallel sentinels) come last, in
the same stable order. ``positions`` [T, k] says where each choice lands in that order; it is a permutation of
[0, T * k), so every row of the ordered layout belongs to exactly one choice, and no kernel needs atomics.

Kernels (the signatures every implementation shares):
  moe_route(indices [T, k] int, num_experts) -> (offs [E] int32, order [T * k] int64, positions [T, k] int64)
      offs: each expert's cumulative end row (sentinels not counted); order: the choice t * k + j of each row;
      positions: the row of each choice (order's inverse). No value is read on the host.
  moe_dispatch(src [T, H], positions, weights [T, k] or None, other [T * k, H] or None)
      -> (out [T * k, H] in src's dtype, dots [T, k] fp32 or None)
      out[positions[t, j]] = src[t] (* weights[t, j]); dots[t, j] = sum_h src[t, h] * other[positions[t, j], h].
  moe_gather_sum(src [T * k, H], positions, weights [T, k] or None, out_dtype) -> out [T, H]
      out[t] = sum_j src[positions[t, j]] (* weights[t, j]), in fp32, rounded once to out_dtype.
Products and sums in fp32; weights of any float dtype.
"""

from __future__ import annotations

import torch

from ..registry import implementation
from . import unavailable_reason


def traced_off_cpu(device: torch.device) -> bool:
    """Traced into compiled graphs on GPUs. On CPU each call stays one node: Inductor would build C++ kernels for a
    sort and scatters that gain nothing at the sizes a CPU runs."""
    return device.type != "cpu"


@implementation("moe_route", "reference", priority=0, unavailable_reason=unavailable_reason, traceable=traced_off_cpu)
def moe_route(indices: torch.Tensor, num_experts: int):
    """A stable sort of the choices by expert; the offsets by a binary search in the sorted experts (no histogram
    with atomics, no host sync)."""
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
    return _scaled(src[positions], weights).sum(1).to(out_dtype)


__all__ = ["moe_route", "moe_dispatch", "moe_gather_sum"]
