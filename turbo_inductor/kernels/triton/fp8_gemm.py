"""Scaled FP8 GEMM in Triton for every block granularity the recipes use. Semantics: ``..reference.fp8_gemm``.
It runs where ``torch._scaled_mm`` declines the scales, such as MXFP8. See docs/kernels.md, FP8 GEMM.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..reference.fp8_gemm import block_size
from ..registry import implementation
from . import interpreting, launch, on_device, traceable, unavailable_reason
from .access_analysis import writes
from .fp8_formats import format_id, fp8_pointer

# Output tile per program. The interpreter gets a small one: it runs every element in numpy.
BLOCK_MN = 128
INTERPRETER_BLOCK_MN = 32
# The widest K chunk; narrower when a scaling block along K is (MXFP8: 32).
MAX_BLOCK_K = 128
# tl.dot needs K chunks of at least this many elements.
MIN_BLOCK_K = 16
NUM_WARPS = 8
NUM_STAGES = 3


def block_k_for(K: int, a_block_cols: int, b_block_cols: int) -> int | None:
    """The K chunk: the largest power of two <= MAX_BLOCK_K that divides each block narrower than K.
    None when that is below MIN_BLOCK_K. A block as wide as K allows any chunk."""
    block_k = MAX_BLOCK_K
    for width in (a_block_cols, b_block_cols):
        if width < K:
            block_k = min(block_k, width & -width)  # the largest power of two dividing width
    return block_k if block_k >= MIN_BLOCK_K else None


@writes("OUT")
@triton.jit
def _fp8_gemm_kernel(
    A,
    B,
    A_SCALE,
    B_SCALE,
    OUT,
    M,
    N,
    K,
    stride_as_m,
    stride_as_k,
    stride_bs_n,
    stride_bs_k,
    a_block_rows,
    a_block_cols,
    b_block_rows,
    b_block_cols,
    A_FORMAT: tl.constexpr,
    B_FORMAT: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    A = fp8_pointer(A, A_FORMAT)
    B = fp8_pointer(B, B_FORMAT)
    pid = tl.program_id(0)
    n_tiles_n = tl.cdiv(N, BLOCK_N)
    rows = (pid // n_tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = (pid % n_tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_in = rows < M
    col_in = cols < N
    rows64 = rows.to(tl.int64)
    cols64 = cols.to(tl.int64)
    a_scale_rows = (rows // a_block_rows).to(tl.int64) * stride_as_m
    b_scale_rows = (cols // b_block_rows).to(tl.int64) * stride_bs_n
    ks0 = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + ks0
        k_in = ks < K
        # Outside the matrices the loads are +0.0.
        a = tl.load(A + rows64[:, None] * K + ks[None, :], mask=row_in[:, None] & k_in[None, :], other=0.0)
        b = tl.load(B + cols64[None, :] * K + ks[:, None], mask=k_in[:, None] & col_in[None, :], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        product = tl.dot(a, b, out_dtype=tl.float32)
        a_scale = tl.load(A_SCALE + a_scale_rows + (k0 // a_block_cols) * stride_as_k, mask=row_in, other=0.0)
        b_scale = tl.load(B_SCALE + b_scale_rows + (k0 // b_block_cols) * stride_bs_k, mask=col_in, other=0.0)
        acc += product * a_scale[:, None] * b_scale[None, :]
    out_mask = row_in[:, None] & col_in[None, :]
    tl.store(OUT + rows64[:, None] * N + cols64[None, :], acc.to(OUT.dtype.element_ty), mask=out_mask)


def supports(a, a_scale, b, b_scale, out_dtype, fast_accum=False) -> str | None:
    K = int(a.shape[1])
    a_block_cols, b_block_cols = block_size(K, a_scale.shape[1]), block_size(K, b_scale.shape[1])
    if block_k_for(K, a_block_cols, b_block_cols) is None:
        return (
            f"scaling blocks {a_block_cols} and {b_block_cols} wide along K are narrower than the {MIN_BLOCK_K} "
            f"elements a Triton dot needs"
        )
    return None


def priority(device: torch.device) -> int:
    """Above the emulation (0) on a GPU. Below it in the CPU interpreter, where the emulation is exact and faster."""
    return -10 if device.type == "cpu" else 10


@implementation(
    "fp8_gemm",
    "triton",
    priority=priority,
    unavailable_reason=unavailable_reason,
    traceable=traceable,
    supports=supports,
)
def fp8_gemm(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    out_dtype: torch.dtype,
    fast_accum: bool = False,
) -> torch.Tensor:
    """As ``..reference.fp8_gemm.fp8_gemm``. Accumulates in fp32 whatever ``fast_accum`` says."""
    (M, K), N = a.shape, b.shape[0]
    K = int(K)  # sets the launch configuration: a compiled graph specializes on it
    a_block_rows, a_block_cols = block_size(M, a_scale.shape[0]), block_size(K, a_scale.shape[1])
    b_block_rows, b_block_cols = block_size(N, b_scale.shape[0]), block_size(K, b_scale.shape[1])
    block_k = block_k_for(K, a_block_cols, b_block_cols)
    out = torch.empty((M, N), dtype=out_dtype, device=a.device)
    if M == 0 or N == 0:
        return out
    if K == 0:
        return out.zero_()
    a_scale, b_scale = a_scale.float(), b_scale.float()
    block_mn = INTERPRETER_BLOCK_MN if interpreting() else BLOCK_MN
    grid = (triton.cdiv(M, block_mn) * triton.cdiv(N, block_mn),)
    with on_device(a.device):
        launch(_fp8_gemm_kernel)[grid](
            a.contiguous().view(torch.uint8),
            b.contiguous().view(torch.uint8),
            a_scale,
            b_scale,
            out,
            M,
            N,
            K,
            a_scale.stride(0),
            a_scale.stride(1),
            b_scale.stride(0),
            b_scale.stride(1),
            a_block_rows,
            a_block_cols,
            b_block_rows,
            b_block_cols,
            A_FORMAT=format_id(a.dtype, a.device),
            B_FORMAT=format_id(b.dtype, b.device),
            UPCAST=interpreting(),  # the interpreter's dot is unreliable below fp32
            BLOCK_M=block_mn,
            BLOCK_N=block_mn,
            BLOCK_K=block_k,
            num_warps=NUM_WARPS,
            num_stages=NUM_STAGES,
        )
    return out


__all__ = ["fp8_gemm", "block_k_for"]
