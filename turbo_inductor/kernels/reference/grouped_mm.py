"""Grouped GEMMs in plain PyTorch: one GEMM per group of rows (the tokens routed to one expert). Sets the semantics.

Groups come as ``offs`` [E] int32, the cumulative end row of each group (``torch._grouped_mm``'s ``offs``): group g
holds rows [offs[g-1], offs[g]) (from row 0 for g = 0), of any size, zero included. Rows from offs[E-1] on belong
to no group (expert-parallel padding). Every implementation bounds each group to [end of the previous one, S], so
that offsets out of order or past S address no memory outside the operands (the ops reject them where checking
costs no host sync).

Kernels (the signatures every implementation shares; outputs contiguous, sums in fp32, one rounding at the end):
  grouped_gemm(a [S, K], b [E, K, N], offs, out_dtype) -> out [S, N]
      out[rows of g] = a[rows of g] @ b[g]; rows of no group are zero. a and b of any strides.
  grouped_gemm_wgrad(a [S, M], b [S, N], offs, out_dtype) -> out [E, M, N]
      out[g] = a[rows of g]^T @ b[rows of g]: zero for an empty group; rows of no group take no part.
  fp8_grouped_gemm(a [S, K], a_scale, b [E, N, K], b_scale [E, N blocks, K blocks], offs, out_dtype, fast_accum)
      -> out [S, N]: dequant(a)[rows of g] @ dequant(b[g])^T; rows of no group are zero. b is [N, K] per group,
      contracted dimension last, as ``fp8_gemm`` takes it; scales in blocks as there (``..reference.fp8_gemm``).
  fp8_grouped_gemm_wgrad(a [M, S], a_scale, b [N, S], b_scale, offs, out_dtype) -> out [E, M, N]
      out[g] = dequant(a)[:, rows of g] @ dequant(b)[:, rows of g]^T. Scaling blocks along S lie in S's own
      coordinates and may straddle two groups: dequantization is per element, so each group takes its share.
"""

from __future__ import annotations

import torch

from ..registry import implementation, never
from . import unavailable_reason
from .fp8_gemm import dequantize


def group_bounds(offs: torch.Tensor, rows: int) -> list[tuple[int, int]]:
    """[start, end) of each group, each bounded to [end of the previous group, rows] (reads offs on the host)."""
    bounds, start = [], 0
    for end in offs.tolist():
        end = min(max(end, start), rows)
        bounds.append((start, end))
        start = end
    return bounds


# Never traced: the loop reads offs on the host, which a compiled graph must not do; the call stays one node.
@implementation("grouped_gemm", "reference", priority=0, unavailable_reason=unavailable_reason, traceable=never)
def grouped_gemm(a, b, offs, out_dtype):
    out = torch.zeros((a.shape[0], b.shape[2]), dtype=out_dtype, device=a.device)
    for g, (start, end) in enumerate(group_bounds(offs, a.shape[0])):
        if end > start:
            out[start:end] = (a[start:end].float() @ b[g].float()).to(out_dtype)
    return out


@implementation("grouped_gemm_wgrad", "reference", priority=0, unavailable_reason=unavailable_reason, traceable=never)
def grouped_gemm_wgrad(a, b, offs, out_dtype):
    out = torch.zeros((offs.shape[0], a.shape[1], b.shape[1]), dtype=out_dtype, device=a.device)
    for g, (start, end) in enumerate(group_bounds(offs, a.shape[0])):
        if end > start:
            out[g] = (a[start:end].float().t() @ b[start:end].float()).to(out_dtype)
    return out


@implementation("fp8_grouped_gemm", "reference", priority=0, unavailable_reason=unavailable_reason, traceable=never)
def fp8_grouped_gemm(a, a_scale, b, b_scale, offs, out_dtype, fast_accum=False):
    """Accumulates in fp32 whatever ``fast_accum`` says (it lets other implementations accumulate faster)."""
    a32 = dequantize(a, a_scale)
    out = torch.zeros((a.shape[0], b.shape[1]), dtype=out_dtype, device=a.device)
    for g, (start, end) in enumerate(group_bounds(offs, a.shape[0])):
        if end > start:
            out[start:end] = (a32[start:end] @ dequantize(b[g], b_scale[g]).t()).to(out_dtype)
    return out


@implementation(
    "fp8_grouped_gemm_wgrad", "reference", priority=0, unavailable_reason=unavailable_reason, traceable=never
)
def fp8_grouped_gemm_wgrad(a, a_scale, b, b_scale, offs, out_dtype):
    a32, b32 = dequantize(a, a_scale), dequantize(b, b_scale)
    out = torch.zeros((offs.shape[0], a.shape[0], b.shape[0]), dtype=out_dtype, device=a.device)
    for g, (start, end) in enumerate(group_bounds(offs, a.shape[1])):
        if end > start:
            out[g] = (a32[:, start:end] @ b32[:, start:end].t()).to(out_dtype)
    return out


__all__ = ["grouped_gemm", "grouped_gemm_wgrad", "fp8_grouped_gemm", "fp8_grouped_gemm_wgrad", "group_bounds"]
