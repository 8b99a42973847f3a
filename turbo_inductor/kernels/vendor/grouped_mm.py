"""Grouped GEMMs through torch's CUTLASS kernels: ``torch._grouped_mm`` (bf16) and ``torch._scaled_grouped_mm``
(FP8 e4m3 with a scale per row of x and per expert and column of W, bf16 out). Semantics: ``..reference.grouped_mm``.

What torch takes, and what declines (the Triton kernels run instead):
* Devices: sm_90 and sm_100 only. Elsewhere torch._grouped_mm loops over the groups after copying offs to the host
  (a sync), and torch._scaled_grouped_mm refuses. ROCm's grouped kernels depend on how torch was built: declined.
* Operands: 16-byte-aligned leading strides and storage offsets; bf16 operands row-major or column-major; FP8 x
  row-major and W "column-major" ([E, N, K] with K contiguous); K and N multiples of 16 for FP8; N a multiple of 8
  for bf16 (the output rows are padded to 16 bytes otherwise, unlike our contiguous outputs); fewer than 1024
  groups.
* Groups: any size, zero included, where the grouped dimension is the rows (x, y); torch leaves the output rows past
  offs[-1] unwritten, and they are zeroed here by a small kernel that reads offs on the device. The bf16 weight
  gradient (the contracted dimension grouped) runs with x^T column-major and dy row-major, the layout torch's own
  autograd uses, for which CUTLASS takes empty groups; on sm_90 only (on sm_100 empty groups got non-zero gradients,
  pytorch#172439).
* The FP8 weight gradient (both operands grouped along the contracted rows) runs on sm_90 only, on operands in the
  padded layout with scales per group that ``fp8_quantize_grouped`` writes. torch._scaled_grouped_mm asserts on the
  device (killing the process) that every group there is non-empty and, but the last, a multiple of 16 rows; group
  sizes are data, not checkable without a sync. In that layout each group starts at a multiple of 16 and holds a
  non-zero multiple of 16, zeros past its rows, and the offsets are the padded ones, computed on the device: the sizes
  torch asserts on hold by construction, whatever offs holds. Scales shared by the groups come with unpadded operands
  and are declined.
"""

from __future__ import annotations

import functools

import torch

from ..reference.grouped_mm import group_bounds, wgrad_scales_reason
from ..registry import LAUNCHES_AHEAD, implementation, never
from ..triton.grouped_mm import zero_rows_past_groups
from . import unavailable_reason as vendor_unavailable_reason

# 16-byte alignment of leading strides and of each operand's start (TMA).
ALIGN_BYTES = 16
# CUTLASS's grouped kernels in torch take fewer groups than this.
MAX_GROUPS = 1024


def unavailable_reason(device: torch.device) -> str | None:
    reason = vendor_unavailable_reason(device)
    if reason is None and not hasattr(torch, "_grouped_mm"):
        reason = "this torch has no torch._grouped_mm"
    return reason


@functools.cache
def device_unsupported(device: torch.device, weight_gradient: bool = False) -> str | None:
    """None where torch's grouped GEMMs run on this GPU without a host sync, else why not."""
    if device.type != "cuda":
        return f"torch's grouped GEMMs run on NVIDIA GPUs only, not on {device.type}"
    if torch.version.hip is not None:
        return "torch's grouped GEMMs on ROCm depend on the build (composable kernel or a loop with a host sync)"
    capability = torch.cuda.get_device_capability(device)
    if weight_gradient and capability != (9, 0):
        return "torch's grouped weight gradients are taken on sm_90 only (empty groups, pytorch#172439)"
    if capability not in ((9, 0), (10, 0)):
        return (
            f"torch's grouped GEMMs run on sm_90 and sm_100 (elsewhere a loop after a host sync); this GPU is "
            f"sm_{capability[0]}{capability[1]}"
        )
    return None


def _aligned(t: torch.Tensor) -> bool:
    return t.storage_offset() * t.element_size() % ALIGN_BYTES == 0


def _leading_stride(t: torch.Tensor) -> int | None:
    """The leading stride of the last two dimensions when the matrix is row- or column-major, else None."""
    rows, cols = t.shape[-2:]
    if t.stride(-1) == 1 and t.stride(-2) >= max(1, cols):
        return t.stride(-2)
    if t.stride(-2) == 1 and t.stride(-1) >= max(1, rows):
        return t.stride(-1)
    return None


def _layout_reason(name: str, t: torch.Tensor, major: str = "") -> str | None:
    """Why torch's grouped GEMMs cannot read ``t`` (``major``: "row" or "column" where only that one is taken)."""
    align = ALIGN_BYTES // t.element_size()
    stride = _leading_stride(t)
    row_major = t.stride(-1) == 1
    if stride is None or (major == "row" and not row_major) or (major == "column" and row_major):
        return f"{name} must be {major or 'row- or column'}-major in its last two dimensions, got strides {t.stride()}"
    if stride % align or not _aligned(t):
        return f"{name} needs {ALIGN_BYTES}-byte-aligned rows and start, got strides {t.stride()}"
    return None


def _first_reason(*reasons: str | None) -> str | None:
    return next((r for r in reasons if r is not None), None)


def grouped_gemm_supports(a, b, offs, out_dtype) -> str | None:
    (_, k), (groups, _, n) = a.shape, b.shape
    if not (a.dtype == b.dtype == out_dtype == torch.bfloat16):
        return f"torch._grouped_mm's fast path takes bfloat16 only, got {a.dtype} x {b.dtype} -> {out_dtype}"
    if k == 0 or n % 8 or groups >= MAX_GROUPS:
        return f"torch._grouped_mm needs K > 0, N a multiple of 8 and fewer than {MAX_GROUPS} groups, got {[k, n]}"
    return _first_reason(_layout_reason("x", a, "row"), _layout_reason("weight", b), device_unsupported(a.device))


@implementation(
    "grouped_gemm",
    "vendor",
    priority=30,
    unavailable_reason=unavailable_reason,
    supports=grouped_gemm_supports,
)
def grouped_gemm(a, b, offs, out_dtype):
    out = torch._grouped_mm(a, b, offs=offs)
    zero_rows_past_groups(out, offs)
    return out


def grouped_gemm_wgrad_supports(a, b, offs, out_dtype) -> str | None:
    (_, m), n = a.shape, b.shape[1]
    if not (a.dtype == b.dtype == out_dtype == torch.bfloat16):
        return f"torch._grouped_mm's fast path takes bfloat16 only, got {a.dtype} x {b.dtype} -> {out_dtype}"
    if n % 8 or offs.shape[0] >= MAX_GROUPS:
        return f"torch._grouped_mm needs N a multiple of 8 and fewer than {MAX_GROUPS} groups, got {[m, n]}"
    # a^T column-major and b row-major: the layout in which CUTLASS takes empty groups (see the module docstring).
    return _first_reason(
        _layout_reason("a", a, "row"), _layout_reason("b", b, "row"), device_unsupported(a.device, True)
    )


@implementation(
    "grouped_gemm_wgrad",
    "vendor",
    priority=30,
    unavailable_reason=unavailable_reason,
    supports=grouped_gemm_wgrad_supports,
)
def grouped_gemm_wgrad(a, b, offs, out_dtype):
    return torch._grouped_mm(a.t(), b, offs=offs)


# One cuBLAS GEMM per group after reading offs on the host (a sync), as TransformerEngine's GroupedLinear runs: at
# Mixtral's expert shapes in bf16 its passes ran 0.98-1.12x torch's grouped kernels on an H100, at Qwen3-MoE's 128
# groups 0.1-0.2x (``bench_grouped_per_group``, docs/kernels.md, "Grouped GEMM"). Below the grouped kernels: the
# cost table prefers it per shape (passes/grouped_mm_impl.py). Never traced: it stays one call in a compiled graph.
PER_GROUP_PRIORITY = 5


def per_group_supports(a, b, offs, out_dtype) -> str | None:
    if not (a.dtype == b.dtype == out_dtype):
        return f"torch.mm writes its operands' dtype, got {a.dtype} x {b.dtype} -> {out_dtype}"
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return "one GEMM per group reads offs on the host, which a CUDA graph capture forbids"
    return None


@implementation(
    "grouped_gemm",
    "vendor_per_group",
    priority=PER_GROUP_PRIORITY,
    unavailable_reason=vendor_unavailable_reason,
    traceable=never,
    supports=per_group_supports,
    capabilities={LAUNCHES_AHEAD: lambda: False},  # reads offs on the host
)
def grouped_gemm_per_group(a, b, offs, out_dtype):
    """``out[rows of g] = a[rows of g] @ b[g]``, one ``torch.mm`` per non-empty group; rows of no group are zero."""
    out = torch.empty((a.shape[0], b.shape[2]), dtype=out_dtype, device=a.device)
    end = 0
    for g, (start, end) in enumerate(group_bounds(offs, a.shape[0])):
        if end > start:
            torch.mm(a[start:end], b[g], out=out[start:end])
    out[end:].zero_()
    return out


@implementation(
    "grouped_gemm_wgrad",
    "vendor_per_group",
    priority=PER_GROUP_PRIORITY,
    unavailable_reason=vendor_unavailable_reason,
    traceable=never,
    supports=per_group_supports,
    capabilities={LAUNCHES_AHEAD: lambda: False},  # reads offs on the host
)
def grouped_gemm_wgrad_per_group(a, b, offs, out_dtype):
    """``out[g] = a[rows of g]^T @ b[rows of g]``, one ``torch.mm`` per non-empty group; empty groups give zeros."""
    out = torch.empty((offs.shape[0], a.shape[1], b.shape[1]), dtype=out_dtype, device=a.device)
    for g, (start, end) in enumerate(group_bounds(offs, a.shape[0])):
        if end > start:
            torch.mm(a[start:end].t(), b[start:end], out=out[g])
        else:
            out[g].zero_()
    return out


def _scale_granularity(a, a_scale, b, b_scale) -> str | None:
    """The granularity, rowwise or tensorwise, of scales torch._scaled_grouped_mm takes (broadcast), else None."""
    (s, _), (groups, n, _) = a.shape, b.shape
    if a_scale.shape == (s, 1) and b_scale.shape == (groups, n, 1):
        return "rowwise"
    if a_scale.numel() == 1 and b_scale.shape == (groups, 1, 1):
        return "tensorwise"
    return None


def fp8_grouped_gemm_supports(a, a_scale, b, b_scale, offs, out_dtype, fast_accum=False) -> str | None:
    (_, k), (groups, n, _) = a.shape, b.shape
    if _scale_granularity(a, a_scale, b, b_scale) is None:
        return "torch._scaled_grouped_mm takes a scale per row of x and per expert and column of W (or per tensor)"
    if not (a.dtype == b.dtype == torch.float8_e4m3fn) or out_dtype != torch.bfloat16:
        return f"torch._scaled_grouped_mm takes float8_e4m3fn to bfloat16, got {a.dtype} x {b.dtype} -> {out_dtype}"
    if k % 16 or n % 16 or k == 0 or groups >= MAX_GROUPS:
        return f"torch._scaled_grouped_mm needs K and N multiples of 16 and fewer than {MAX_GROUPS} groups"
    return _first_reason(
        _layout_reason("x", a, "row"), _layout_reason("weight", b, "row"), device_unsupported(a.device)
    )


@implementation(
    "fp8_grouped_gemm",
    "vendor",
    priority=30,
    unavailable_reason=unavailable_reason,
    supports=fp8_grouped_gemm_supports,
)
def fp8_grouped_gemm(a, a_scale, b, b_scale, offs, out_dtype, fast_accum=False):
    """b [E, N, K] with K contiguous is the "column-major" [E, K, N] operand torch takes, transposed as a view."""
    (s, _), (groups, n, _) = a.shape, b.shape
    # torch reads a 1-D scale per row of x and a [E, N] scale per expert and column (contiguous).
    scale_a = a_scale.reshape(-1).expand(s).contiguous()
    scale_b = b_scale.reshape(groups, -1).expand(groups, n).contiguous()
    out = torch._scaled_grouped_mm(
        a, b.transpose(-2, -1), scale_a, scale_b, offs=offs, out_dtype=out_dtype, use_fast_accum=fast_accum
    )
    zero_rows_past_groups(out, offs)
    return out


def fp8_grouped_gemm_wgrad_supports(a, a_scale, b, b_scale, offs, out_dtype, fast_accum=False) -> str | None:
    (m, s), n = a.shape, b.shape[0]
    reason = wgrad_scales_reason(a, a_scale, b, b_scale, offs)
    if reason is not None or a_scale.dim() == 2:
        return reason or "torch._scaled_grouped_mm's weight gradient takes scales per group and row of x^T and dy^T"
    if a_scale.shape[1] != m or b_scale.shape[1] != n:
        return f"torch._scaled_grouped_mm takes one scale per group and row, got {list(a_scale.shape)} for {[m, s]}"
    if not (a.dtype == b.dtype == torch.float8_e4m3fn) or out_dtype != torch.bfloat16:
        return f"torch._scaled_grouped_mm takes float8_e4m3fn to bfloat16, got {a.dtype} x {b.dtype} -> {out_dtype}"
    if m % 16 or n % 16 or s % 16 or offs.shape[0] >= MAX_GROUPS:
        return (
            f"torch._scaled_grouped_mm needs M, N and the padded S multiples of 16 and fewer than {MAX_GROUPS} groups, "
            f"got {[m, n, s]}"
        )
    return _first_reason(
        _layout_reason("x^T", a, "row"), _layout_reason("dy^T", b, "row"), device_unsupported(a.device, True)
    )


@implementation(
    "fp8_grouped_gemm_wgrad",
    "vendor",
    priority=30,
    unavailable_reason=unavailable_reason,
    supports=fp8_grouped_gemm_wgrad_supports,
)
def fp8_grouped_gemm_wgrad(a, a_scale, b, b_scale, offs, out_dtype, fast_accum=False):
    """a [M, S_pad] and b [N, S_pad] in the padded layout, scales [E, M, 1] and [E, N, 1], offs the padded offsets
    (see the module docstring)."""
    # torch reads a 1-D scale per group and row of each operand: ours flattened (contiguous, a view)
    return torch._scaled_grouped_mm(
        a,
        b.t(),
        a_scale.reshape(-1),
        b_scale.reshape(-1),
        offs=offs,
        out_dtype=out_dtype,
        use_fast_accum=fast_accum,
    )


__all__ = [
    "grouped_gemm",
    "grouped_gemm_wgrad",
    "grouped_gemm_per_group",
    "grouped_gemm_wgrad_per_group",
    "per_group_supports",
    "fp8_grouped_gemm",
    "fp8_grouped_gemm_wgrad",
    "device_unsupported",
    "grouped_gemm_supports",
    "grouped_gemm_wgrad_supports",
    "fp8_grouped_gemm_supports",
    "fp8_grouped_gemm_wgrad_supports",
]
