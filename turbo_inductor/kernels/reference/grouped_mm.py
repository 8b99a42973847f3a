"""Grouped GEMMs in plain PyTorch: one GEMM per group of rows. They define the semantics.
``offs`` [E] int32 holds each group's end row. Outputs are contiguous, summed in fp32 and rounded once.
See docs/kernels.md, Grouped GEMM.
"""

from __future__ import annotations

import torch

from .. import host_copy
from ..registry import implementation, never, timing_arguments
from . import unavailable_reason
from .fp8_gemm import dequantize


def group_bounds(offs: torch.Tensor, rows: int) -> list[tuple[int, int]]:
    """[start, end) of each group, clamped to [previous end, rows]. Reads offs on the host (a host copy given for
    them: ``host_copy.given_host_copy``)."""
    bounds, start = [], 0
    for end in host_copy.values(offs):
        end = min(max(end, start), rows)
        bounds.append((start, end))
        start = end
    return bounds


def balanced_offsets(groups: int, rows: int, device: torch.device) -> torch.Tensor:
    """Group ends splitting ``rows`` about evenly, each at a multiple of 16 (as the padded layouts' are), the last at
    ``rows``: what a balanced router gives, to time grouped kernels on."""
    ends = torch.arange(1, groups + 1, device=device) * rows // groups // 16 * 16
    ends[-1] = rows
    return ends.to(torch.int32)


def _offs_balanced(index: int, grouped: int, dim: int):
    """``timing_arguments`` for a kernel taking ``offs`` as argument ``index``, grouping dimension ``dim`` of argument
    ``grouped``."""

    def make(*args):
        offs, rows = args[index], args[grouped].shape[dim]
        return (*args[:index], balanced_offsets(offs.shape[0], rows, offs.device), *args[index + 1 :])

    return make


# Per grouped kernel: (offs' argument, the grouped argument, its grouped dimension). The FP8 wgrad's come transposed.
GROUPED_KERNELS = {
    "grouped_gemm": (2, 0, 0),
    "grouped_gemm_wgrad": (2, 0, 0),
    "fp8_grouped_gemm": (4, 0, 0),
    "fp8_grouped_gemm_wgrad": (4, 0, 1),
    "fp8_quantize_grouped": (1, 0, 0),
}
for kernel, where in GROUPED_KERNELS.items():
    timing_arguments(kernel, _offs_balanced(*where))


# Never traced: the loop reads offs on the host. The call stays one graph node.
@implementation("grouped_gemm", "reference", priority=0, unavailable_reason=unavailable_reason, traceable=never)
def grouped_gemm(a, b, offs, out_dtype):
    """``out [S, N]``, ``out[rows of g] = a[rows of g] @ b[g]`` for ``a [S, K]``, ``b [E, K, N]``, any strides.
    Rows of no group are zero."""
    out = torch.zeros((a.shape[0], b.shape[2]), dtype=out_dtype, device=a.device)
    for g, (start, end) in enumerate(group_bounds(offs, a.shape[0])):
        if end > start:
            out[start:end] = (a[start:end].float() @ b[g].float()).to(out_dtype)
    return out


@implementation("grouped_gemm_wgrad", "reference", priority=0, unavailable_reason=unavailable_reason, traceable=never)
def grouped_gemm_wgrad(a, b, offs, out_dtype):
    """``out [E, M, N]``, ``out[g] = a[rows of g]^T @ b[rows of g]`` for ``a [S, M]``, ``b [S, N]``.
    Empty groups give zeros."""
    out = torch.zeros((offs.shape[0], a.shape[1], b.shape[1]), dtype=out_dtype, device=a.device)
    for g, (start, end) in enumerate(group_bounds(offs, a.shape[0])):
        if end > start:
            out[g] = (a[start:end].float().t() @ b[start:end].float()).to(out_dtype)
    return out


@implementation("fp8_grouped_gemm", "reference", priority=0, unavailable_reason=unavailable_reason, traceable=never)
def fp8_grouped_gemm(a, a_scale, b, b_scale, offs, out_dtype, fast_accum=False):
    """``out [S, N]``, ``out[rows of g] = dequant(a)[rows of g] @ dequant(b[g])^T`` for ``b [E, N, K]``.
    Scales are blocks as for ``fp8_gemm``. Rows of no group are zero. Accumulates in fp32 regardless."""
    a32 = dequantize(a, a_scale)
    out = torch.zeros((a.shape[0], b.shape[1]), dtype=out_dtype, device=a.device)
    for g, (start, end) in enumerate(group_bounds(offs, a.shape[0])):
        if end > start:
            out[start:end] = (a32[start:end] @ dequantize(b[g], b_scale[g]).t()).to(out_dtype)
    return out


def wgrad_scales_reason(a, a_scale, b, b_scale, offs, *rest, **kwargs) -> str | None:
    """Why the FP8 weight gradient's scales (its arguments) are neither both shared by the groups ([rows blocks,
    S blocks]) nor both per group ([E, rows blocks, 1]), else None."""
    groups = offs.shape[0]
    if a_scale.dim() == b_scale.dim() == 2:
        return None
    if a_scale.dim() == b_scale.dim() == 3 and all(
        s.shape[0] == groups and s.shape[2] == 1 for s in (a_scale, b_scale)
    ):
        return None
    return (
        f"the weight gradient's scales must both be [rows blocks, S blocks] or both per group [{groups}, rows blocks, "
        f"1], got {list(a_scale.shape)} and {list(b_scale.shape)}"
    )


def _dequantized_columns(q: torch.Tensor, scale: torch.Tensor):
    """(g, start, end) -> columns [start, end) of ``q`` [rows, S] dequantized with group g's scales."""
    if scale.dim() == 3:
        return lambda g, start, end: dequantize(q[:, start:end], scale[g])
    q32 = dequantize(q, scale)
    return lambda g, start, end: q32[:, start:end]


@implementation(
    "fp8_grouped_gemm_wgrad",
    "reference",
    priority=0,
    unavailable_reason=unavailable_reason,
    traceable=never,
    supports=wgrad_scales_reason,
)
def fp8_grouped_gemm_wgrad(a, a_scale, b, b_scale, offs, out_dtype, fast_accum=False):
    """``out [E, M, N]``, ``out[g] = dequant(a)[:, rows of g] @ dequant(b)[:, rows of g]^T``, ``a [M, S]`` and
    ``b [N, S]``. Scales [rows blocks, S blocks] are shared by the groups, a block possibly straddling two; scales
    [E, rows blocks, 1] hold each group's own, over its rows (``fp8_quantize_grouped``'s padded layout).
    Always accumulates in fp32. ``fast_accum`` lets other implementations accumulate faster."""
    a_columns, b_columns = _dequantized_columns(a, a_scale), _dequantized_columns(b, b_scale)
    out = torch.zeros((offs.shape[0], a.shape[0], b.shape[0]), dtype=out_dtype, device=a.device)
    for g, (start, end) in enumerate(group_bounds(offs, a.shape[1])):
        if end > start:
            out[g] = (a_columns(g, start, end) @ b_columns(g, start, end).t()).to(out_dtype)
    return out


__all__ = [
    "grouped_gemm",
    "grouped_gemm_wgrad",
    "fp8_grouped_gemm",
    "fp8_grouped_gemm_wgrad",
    "group_bounds",
    "wgrad_scales_reason",
]
