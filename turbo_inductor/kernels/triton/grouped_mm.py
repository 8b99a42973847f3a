"""Grouped GEMMs in Triton, bf16/fp16/fp32 and FP8: the kernels of ``..reference.grouped_mm`` (semantics and
signatures there).

Rows grouped (``grouped_gemm``, ``fp8_grouped_gemm``): a persistent kernel. A fixed number of programs (one per SM on
a GPU) walks the flattened list of work items, (group, row tile, column tile), group after group: each program reads
the offsets on the device, so that no host sync and no launch size depends on the group sizes. Every group gets
cdiv(rows, BLOCK_M) row tiles starting at its own first row (groups of any size, none padded); after the last group
comes one more, the rows past offs[E-1], whose tiles are written as zeros. Within a group, tiles run GROUP_M row tiles
at a time across the columns, so that concurrent programs share operand tiles in L2.

Contraction grouped (``grouped_gemm_wgrad``, ``fp8_grouped_gemm_wgrad``, the weight gradients): one program per
(group, row tile, column tile) of the [E, M, N] output, summing over its group's rows in chunks aligned to
multiples of BLOCK_K in S's coordinates, so that a chunk never straddles a scaling block of the FP8 operands. The
chunks inside the group load whole tiles; only the group's first and last chunks, where partial, zero the other
groups' rows in registers: a mask along the contiguous rows of x^T and dy^T at bounds that are data would split
every load into single bytes, which Triton neither vectorizes nor pipelines.

FP8: operands travel as raw bytes (``.fp8_formats``), loaded through pointers cast to their format, and go into
``tl.dot`` as FP8 (Hopper's FP8 MMA), both with the contracted dimension contiguous. Scales constant along the
contracted dimension (tensorwise, rowwise, and a weight gradient's scales per group) multiply the tile once, in the
epilogue; finer ones (1x128, 128x128, 1x32) multiply each chunk's product in the main loop, as ``.fp8_gemm`` does,
the chunk never straddling a scaling block.
Unless ``fast_accum``, each chunk's product is added to an fp32 accumulator apart (two-level accumulation: Hopper's
FP8 MMA keeps fewer bits as it sums). Loads go through pointers with strides (any layout, AMD as well, and the
interpreter, where the tiles are converted to fp32 before ``tl.dot``); the ``triton_tma`` implementations of the
FP8 kernels load whole tiles through tensor descriptors instead (``.tma``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..reference.fp8_gemm import block_size
from ..reference.grouped_mm import wgrad_scales_reason
from ..registry import implementation, never
from . import device_limits, interpreting, launch, on_device, traceable, unavailable_reason
from .access_analysis import writes
from .fp8_formats import format_id, fp8_pointer
from .fp8_gemm import block_k_for
from .tma import descriptor, tma_reason, tma_unavailable_reason

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) on an NVIDIA GPU by operand element size: the persistent matmul
# of Triton's tutorials on Hopper for 16-bit and FP8 operands; fp32 operands are twice as large per element.
GPU_CONFIGS = {1: (128, 256, 128, 8, 3), 2: (128, 256, 64, 8, 3), 4: (128, 128, 32, 8, 3)}
# FP8 whose chunk products are added to the accumulator apart (promotion, scales per chunk): the product tile is live
# beside the accumulator, so the tile is half as wide (or registers spill), and a fourth stage of loads stays in
# flight while each chunk's product is awaited.
PROMOTED_CONFIG = (128, 128, 128, 8, 4)
# AMD's LDS (64 KiB on MI300) holds smaller tiles.
ROCM_CONFIG = (128, 128, 64, 8, 2)
INTERPRETER_CONFIG = (32, 32, 32, 4, 1)
# Row tiles a group's programs take side by side before moving across the columns (L2 reuse).
GROUP_M = 8
# Persistent programs in the interpreter: few, so that each walks several tiles (the tests exercise that).
INTERPRETER_PROGRAMS = 3
# The zeroing kernel's tile (rows past the last group).
ZERO_TILE = (32, 128)


def persistent_programs(device: torch.device, per_sm: int = 1) -> int:
    """Programs of a persistent launch: ``per_sm`` per SM (a constant of the device, so the launch never depends on
    S); in the interpreter, INTERPRETER_PROGRAMS."""
    return INTERPRETER_PROGRAMS if interpreting() else per_sm * device_limits(device).sms


def _launch_options(element_size: int, promoted: bool, block_k: int | None) -> dict:
    """The tile and launch configuration for operands of ``element_size`` bytes; ``promoted``: each chunk's FP8
    product is added to the accumulator apart (promotion or scaling per chunk); ``block_k``: the chunk the scaling
    blocks impose, if any."""
    if interpreting():
        config = INTERPRETER_CONFIG
    elif torch.version.hip is not None:
        config = ROCM_CONFIG
    else:
        config = PROMOTED_CONFIG if promoted else GPU_CONFIGS[element_size]
    block_m, block_n, default_k, warps, stages = config
    return dict(
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k or default_k,
        GROUP_M=GROUP_M,
        num_warps=warps,
        num_stages=stages,
    )


@writes("OUT")
@triton.jit
def _grouped_gemm_kernel(
    A,
    B,
    OUT,
    A_SCALE,
    B_SCALE,
    OFFS,
    S,
    N,
    K,
    E,
    stride_am,
    stride_ak,
    stride_be,
    stride_bk,
    stride_bn,
    stride_as_m,
    stride_as_k,
    stride_bs_e,
    stride_bs_n,
    stride_bs_k,
    a_block_rows,
    a_block_cols,
    b_block_rows,
    b_block_cols,
    SCALED: tl.constexpr,
    SCALE_PER_CHUNK: tl.constexpr,
    B_SCALE_PER_TILE: tl.constexpr,
    FAST_ACCUM: tl.constexpr,
    A_FORMAT: tl.constexpr,
    B_FORMAT: tl.constexpr,
    UPCAST: tl.constexpr,
    IEEE: tl.constexpr,
    EVEN_K: tl.constexpr,
    TMA: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """OUT [S, N] (contiguous) = A [S, K] rows of group g times B[g] [K, N] (strides given; for FP8, B[g] is the
    [N, K] operand read transposed), for g < E; the rows past the last group (g = E) are written as zeros. With
    SCALED, A and B are FP8 bytes with block scales A_SCALE [S blocks, K blocks], B_SCALE [E, N blocks, K blocks];
    B_SCALE_PER_TILE: one scale of B per chunk spans the column tile. EVEN_K: BLOCK_K divides K. With TMA, A and B
    are tensor descriptors of A [S, K] and B [E, N, K] ([BLOCK_M, BLOCK_K] and [1, BLOCK_N, BLOCK_K] blocks)."""
    if SCALED and not TMA:
        A = fp8_pointer(A, A_FORMAT)
        B = fp8_pointer(B, B_FORMAT)
    n_tiles_n = tl.cdiv(N, BLOCK_N)
    tile = tl.program_id(0)
    num_programs = tl.num_programs(0)
    first_tile = 0  # the first work item of group g
    for g in range(0, E + 1):
        start = tl.where(g > 0, tl.load(OFFS + tl.maximum(g - 1, 0)), 0)
        end = tl.where(g < E, tl.load(OFFS + tl.minimum(g, E - 1)), S)
        start = tl.minimum(tl.maximum(start, 0), S)
        end = tl.minimum(tl.maximum(end, start), S)
        n_tiles_m = tl.cdiv(end - start, BLOCK_M)
        group_tiles = n_tiles_m * n_tiles_n
        while tile < first_tile + group_tiles:
            # GROUP_M row tiles at a time across the columns (inline: see _grouped_wgrad_kernel)
            local = tile - first_tile
            first_m = (local // (GROUP_M * n_tiles_n)) * GROUP_M
            rows_here = tl.minimum(n_tiles_m - first_m, GROUP_M)
            pid_m = first_m + (local % (GROUP_M * n_tiles_n)) % rows_here
            pid_n = (local % (GROUP_M * n_tiles_n)) // rows_here
            rows = start + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            row_in = rows < end
            col_in = cols < N
            rows64 = rows.to(tl.int64)
            cols64 = cols.to(tl.int64)
            if not TMA:
                b_group = B + tl.cast(g, tl.int64) * stride_be
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            k_stop = tl.where(g < E, K, 0)  # the rows past the last group multiply nothing
            for k0 in range(0, k_stop, BLOCK_K):
                if TMA:
                    # Past S, N and K the loads are +0.0. Rows of the next group are multiplied too, into rows
                    # never stored.
                    a = A.load([start + pid_m * BLOCK_M, k0])
                    b = tl.trans(tl.reshape(B.load([g, pid_n * BLOCK_N, k0]), [BLOCK_N, BLOCK_K]))
                else:
                    ks = k0 + tl.arange(0, BLOCK_K)
                    # Outside the operands the loads are +0.0: no term is added.
                    a_mask = row_in[:, None]
                    b_mask = col_in[None, :]
                    if not EVEN_K:
                        a_mask = a_mask & (ks < K)[None, :]
                        b_mask = b_mask & (ks < K)[:, None]
                    a = tl.load(A + rows64[:, None] * stride_am + ks[None, :] * stride_ak, mask=a_mask, other=0.0)
                    b = tl.load(b_group + ks[:, None] * stride_bk + cols64[None, :] * stride_bn, mask=b_mask, other=0.0)
                if UPCAST:
                    a = a.to(tl.float32)
                    b = b.to(tl.float32)
                if SCALE_PER_CHUNK:
                    a_scale = tl.load(
                        A_SCALE
                        + (rows // a_block_rows).to(tl.int64) * stride_as_m
                        + (k0 // a_block_cols) * stride_as_k,
                        mask=row_in,
                        other=0.0,
                    )
                    b_scales = B_SCALE + g * stride_bs_e + (k0 // b_block_cols) * stride_bs_k
                    if B_SCALE_PER_TILE:
                        # one multiply-add per element: B's scale folded into A's
                        row_scale = a_scale * tl.load(b_scales + (pid_n * BLOCK_N // b_block_rows) * stride_bs_n)
                        acc += tl.dot(a, b, out_dtype=tl.float32) * row_scale[:, None]
                    else:
                        b_scale = tl.load(b_scales + (cols // b_block_rows) * stride_bs_n, mask=col_in, other=0.0)
                        acc += tl.dot(a, b, out_dtype=tl.float32) * (a_scale[:, None] * b_scale[None, :])
                elif IEEE:
                    acc = tl.dot(a, b, acc, input_precision="ieee")
                elif FAST_ACCUM:
                    acc = tl.dot(a, b, acc)
                else:
                    # Each chunk's sum is promoted to the fp32 accumulator: Hopper's FP8 dot accumulates in fewer bits.
                    acc += tl.dot(a, b, out_dtype=tl.float32)
            if SCALED and not SCALE_PER_CHUNK:
                in_group = g < E
                a_scale = tl.load(
                    A_SCALE + (rows // a_block_rows).to(tl.int64) * stride_as_m, mask=row_in & in_group, other=0.0
                )
                b_scale = tl.load(
                    B_SCALE + g * stride_bs_e + (cols // b_block_rows) * stride_bs_n, mask=col_in & in_group, other=0.0
                )
                acc = acc * a_scale[:, None] * b_scale[None, :]
            tl.store(
                OUT + rows64[:, None] * N + cols64[None, :],
                acc.to(OUT.dtype.element_ty),
                mask=row_in[:, None] & col_in[None, :],
            )
            tile += num_programs
        first_tile += group_tiles


@triton.jit
def _wgrad_chunk(
    acc,
    A,
    B,
    A_SCALE,
    B_SCALE,
    t0,
    start,
    end,
    S,
    row0,
    col0,
    stride_am,
    stride_at,
    stride_bn,
    stride_bt,
    stride_as_m,
    stride_as_t,
    stride_bs_n,
    stride_bs_t,
    a_block_rows,
    a_block_cols,
    b_block_rows,
    b_block_cols,
    M,
    N,
    EDGE: tl.constexpr,
    SCALED: tl.constexpr,
    SCALE_PER_CHUNK: tl.constexpr,
    FAST_ACCUM: tl.constexpr,
    UPCAST: tl.constexpr,
    IEEE: tl.constexpr,
    TMA: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """acc plus the product over rows [t0, t0 + BLOCK_K) of S: all of them in the group, or with EDGE those in
    [start, end) (a chunk holding a group bound), for the output tile at (row0, col0). With TMA, A and B are tensor
    descriptors."""
    ts = t0 + tl.arange(0, BLOCK_K)
    rows = row0 + tl.arange(0, BLOCK_M)
    cols = col0 + tl.arange(0, BLOCK_N)
    row_in = rows < M
    col_in = cols < N
    if TMA:
        # Whole tiles; past M, N and S the loads are +0.0.
        a = A.load([row0, t0])
        b = tl.trans(B.load([col0, t0]))
    else:
        ts64 = ts.to(tl.int64)
        a_ptrs = A + rows.to(tl.int64)[:, None] * stride_am + ts64[None, :] * stride_at
        b_ptrs = B + ts64[:, None] * stride_bt + cols.to(tl.int64)[None, :] * stride_bn
        if EDGE:
            # Whole tiles loaded (within S).
            t_all = ts < S
            a = tl.load(a_ptrs, mask=row_in[:, None] & t_all[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=t_all[:, None] & col_in[None, :], other=0.0)
        else:
            a = tl.load(a_ptrs, mask=row_in[:, None], other=0.0)
            b = tl.load(b_ptrs, mask=col_in[None, :], other=0.0)
    if EDGE:
        # The other groups' rows zeroed in registers.
        t_in = (ts >= start) & (ts < end)
        a = tl.where(t_in[None, :], a, tl.zeros_like(a))
        b = tl.where(t_in[:, None], b, tl.zeros_like(b))
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    if SCALE_PER_CHUNK:
        a_scale = tl.load(
            A_SCALE + (rows // a_block_rows) * stride_as_m + (t0 // a_block_cols) * stride_as_t, mask=row_in, other=0.0
        )
        b_scale = tl.load(
            B_SCALE + (cols // b_block_rows) * stride_bs_n + (t0 // b_block_cols) * stride_bs_t, mask=col_in, other=0.0
        )
        acc += tl.dot(a, b, out_dtype=tl.float32) * (a_scale[:, None] * b_scale[None, :])
    elif IEEE:
        acc = tl.dot(a, b, acc, input_precision="ieee")
    elif SCALED and not FAST_ACCUM:
        acc += tl.dot(a, b, out_dtype=tl.float32)  # promoted per chunk, as in the kernel above
    else:
        acc = tl.dot(a, b, acc)
    return acc


@writes("OUT")
@triton.jit
def _grouped_wgrad_kernel(
    A,
    B,
    OUT,
    A_SCALE,
    B_SCALE,
    OFFS,
    S,
    M,
    N,
    E,
    stride_am,
    stride_at,
    stride_bn,
    stride_bt,
    stride_as_g,
    stride_as_m,
    stride_as_t,
    stride_bs_g,
    stride_bs_n,
    stride_bs_t,
    a_block_rows,
    a_block_cols,
    b_block_rows,
    b_block_cols,
    SCALED: tl.constexpr,
    SCALE_PER_CHUNK: tl.constexpr,
    FAST_ACCUM: tl.constexpr,
    A_FORMAT: tl.constexpr,
    B_FORMAT: tl.constexpr,
    UPCAST: tl.constexpr,
    IEEE: tl.constexpr,
    TMA: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """OUT [E, M, N] (contiguous): OUT[g] = A [M, S] times B [N, S]^T over the rows t of group g (strides given).
    With SCALED, A and B are FP8 bytes with block scales A_SCALE [E, M blocks, S blocks], B_SCALE [E, N blocks,
    S blocks]: each group's own, or with stride_as_g = stride_bs_g = 0 one set shared by the groups. With TMA, A and
    B are tensor descriptors of [M, S] and [N, S] ([BLOCK_M, BLOCK_K] and [BLOCK_N, BLOCK_K] blocks)."""
    if SCALED and not TMA:
        A = fp8_pointer(A, A_FORMAT)
        B = fp8_pointer(B, B_FORMAT)
    n_tiles_m = tl.cdiv(M, BLOCK_M)
    n_tiles_n = tl.cdiv(N, BLOCK_N)
    pid = tl.program_id(0)
    g = pid // (n_tiles_m * n_tiles_n)
    # GROUP_M row tiles at a time across the columns. Inline: torch's analysis of which arguments a kernel writes
    # gave up on a helper returning several values (see .fp8_quant), and Inductor then copied the operands.
    local = pid % (n_tiles_m * n_tiles_n)
    first_m = (local // (GROUP_M * n_tiles_n)) * GROUP_M
    rows_here = tl.minimum(n_tiles_m - first_m, GROUP_M)
    pid_m = first_m + (local % (GROUP_M * n_tiles_n)) % rows_here
    pid_n = (local % (GROUP_M * n_tiles_n)) // rows_here
    start = tl.where(g > 0, tl.load(OFFS + tl.maximum(g - 1, 0)), 0)
    start = tl.minimum(tl.maximum(start, 0), S)
    end = tl.minimum(tl.maximum(tl.load(OFFS + g), start), S)
    A_SCALE = A_SCALE + g.to(tl.int64) * stride_as_g
    B_SCALE = B_SCALE + g.to(tl.int64) * stride_bs_g
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    # Chunks start at multiples of BLOCK_K (which divides every scaling block narrower than S): none straddles one.
    # [first_whole, body_end): chunks inside the group; the chunks before and after it hold a group bound.
    first_whole = tl.cdiv(start, BLOCK_K) * BLOCK_K
    body_end = tl.maximum(first_whole, (end // BLOCK_K) * BLOCK_K)
    for t0 in range(first_whole, body_end, BLOCK_K):
        acc = _wgrad_chunk(
            acc, A, B, A_SCALE, B_SCALE, t0, start, end, S, pid_m * BLOCK_M, pid_n * BLOCK_N,
            stride_am, stride_at, stride_bn, stride_bt, stride_as_m, stride_as_t, stride_bs_n, stride_bs_t,
            a_block_rows, a_block_cols, b_block_rows, b_block_cols, M, N,
            False, SCALED, SCALE_PER_CHUNK, FAST_ACCUM, UPCAST, IEEE, TMA, BLOCK_M, BLOCK_N, BLOCK_K,
        )  # fmt: skip
    # The chunks holding the group's bounds where partial: before the whole ones (none for an empty group), after them.
    for edge in tl.static_range(2):
        if edge == 0:
            t0 = (start // BLOCK_K) * BLOCK_K
            partial = (t0 < start) & (start < end)
        else:
            t0 = body_end
            partial = body_end < end
        if partial:
            acc = _wgrad_chunk(
                acc, A, B, A_SCALE, B_SCALE, t0, start, end, S, pid_m * BLOCK_M, pid_n * BLOCK_N,
                stride_am, stride_at, stride_bn, stride_bt, stride_as_m, stride_as_t, stride_bs_n, stride_bs_t,
                a_block_rows, a_block_cols, b_block_rows, b_block_cols, M, N,
                True, SCALED, SCALE_PER_CHUNK, FAST_ACCUM, UPCAST, IEEE, TMA, BLOCK_M, BLOCK_N, BLOCK_K,
            )  # fmt: skip
    if SCALED and not SCALE_PER_CHUNK:
        row_in = rows < M
        col_in = cols < N
        a_scale = tl.load(A_SCALE + (rows // a_block_rows) * stride_as_m, mask=row_in, other=0.0)
        b_scale = tl.load(B_SCALE + (cols // b_block_rows) * stride_bs_n, mask=col_in, other=0.0)
        acc = acc * a_scale[:, None] * b_scale[None, :]
    out = OUT + g.to(tl.int64) * M * N + rows.to(tl.int64)[:, None] * N + cols.to(tl.int64)[None, :]
    tl.store(out, acc.to(OUT.dtype.element_ty), mask=(rows < M)[:, None] & (cols < N)[None, :])


@writes("OUT")
@triton.jit
def _zero_rows_past_groups_kernel(OUT, OFFS, S, N, E, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    """Zeros in OUT [S, N] (contiguous) from row offs[E-1] on, the programs taking row blocks in turn."""
    first = tl.minimum(tl.maximum(tl.load(OFFS + E - 1), 0), S)
    for r0 in range(first + tl.program_id(0) * BLOCK_R, S, tl.num_programs(0) * BLOCK_R):
        rows = (r0 + tl.arange(0, BLOCK_R)).to(tl.int64)
        for c0 in range(0, N, BLOCK_N):
            cols = c0 + tl.arange(0, BLOCK_N)
            zeros = tl.zeros([BLOCK_R, BLOCK_N], dtype=OUT.dtype.element_ty)
            tl.store(OUT + rows[:, None] * N + cols[None, :], zeros, mask=(rows < S)[:, None] & (cols < N)[None, :])


def zero_rows_past_groups(out: torch.Tensor, offs: torch.Tensor) -> None:
    """Writes zeros in the rows of ``out`` [S, N] (contiguous) past the last group, read from ``offs`` on the device:
    for kernels that leave those rows unwritten (torch's grouped GEMMs). The launch depends on no size."""
    if out.numel() == 0:
        return
    with on_device(out.device):
        launch(_zero_rows_past_groups_kernel)[(persistent_programs(out.device),)](
            out, offs, out.shape[0], out.shape[1], offs.shape[0], BLOCK_R=ZERO_TILE[0], BLOCK_N=ZERO_TILE[1]
        )


def priority(device: torch.device) -> int:
    """Below the vendor kernels and above the reference on a GPU; below the reference in the CPU interpreter."""
    return -10 if device.type == "cpu" else 10


# Above torch's CUTLASS kernel (the vendor's 30) on NVIDIA GPUs: on an H100 the rows kernel's forward and dgrad tie
# CUTLASS's at Mixtral's expert shapes and take half their time at Qwen3-MoE's (docs/fp8.md, "The rows-grouped GEMM").
# Its wgrad kernel is slower at Mixtral's: not moved.
FP8_ROWS_PRIORITY_NVIDIA = 40


def fp8_rows_priority(device: torch.device) -> int:
    return FP8_ROWS_PRIORITY_NVIDIA if device.type == "cuda" and torch.version.hip is None else priority(device)


def tma_priority(device: torch.device) -> int:
    """Just below the pointer kernels: loading by TMA was measured no faster (``docs/fp8.md``); ``autotune`` or
    ``impl=`` picks it."""
    return priority(device) - 1


def _blocks(a, a_scale, b_rows: int, b_scale, contracted: int) -> tuple[int, int, int, int]:
    """(a_block_rows, a_block_cols, b_block_rows, b_block_cols): the scaling blocks of a [rows, contracted] and of
    b [b_rows, contracted] (per group where a scale is 3-D), resolved from the scales' shapes."""
    return (
        block_size(int(a.shape[0]), a_scale.shape[-2]),
        block_size(contracted, a_scale.shape[-1]),
        block_size(b_rows, b_scale.shape[-2]),
        block_size(contracted, b_scale.shape[-1]),
    )


def _chunking(blocks: tuple[int, int, int, int], contracted: int) -> tuple[bool, int | None]:
    """(whether the scales vary along the contracted dimension, the chunk that then never straddles a block: None
    where the blocks are too narrow for a Triton dot)."""
    per_chunk = blocks[1] < contracted or blocks[3] < contracted
    return per_chunk, block_k_for(contracted, blocks[1], blocks[3]) if per_chunk else None


def _fp8_supports(blocks: tuple[int, int, int, int], contracted: int) -> str | None:
    per_chunk, block_k = _chunking(blocks, contracted)
    if per_chunk and block_k is None:
        return (
            f"scaling blocks {blocks[1]} and {blocks[3]} wide along the contracted dimension are narrower than the "
            f"16 elements a Triton dot needs"
        )
    return None


_UNSCALED = dict(SCALED=False, SCALE_PER_CHUNK=False, A_FORMAT=0, B_FORMAT=0)


def _scaled(a, b, scales, blocks, contracted: int) -> tuple[tuple, dict, int | None]:
    """(the launch arguments of the scales, the FP8 constexprs, the chunk) of FP8 operands a and b."""
    a_scale, b_scale = (s.float() for s in scales)
    per_chunk, block_k = _chunking(blocks, contracted)
    constexprs = dict(
        SCALED=True,
        SCALE_PER_CHUNK=per_chunk,
        A_FORMAT=format_id(a.dtype, a.device),
        B_FORMAT=format_id(b.dtype, b.device),
    )
    return (a_scale, b_scale, *a_scale.stride(), *b_scale.stride(), *blocks), constexprs, block_k


@implementation("grouped_gemm", "triton", priority=priority, unavailable_reason=unavailable_reason, traceable=traceable)
def grouped_gemm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    S, N = a.shape[0], b.shape[2]
    out = torch.empty((S, N), dtype=out_dtype, device=a.device)
    if out.numel() > 0:
        scales = (a, a, 0, 0, 0, 0, 0, 1, 1, 1, 1)  # unread: SCALED is off
        _launch_rows(a, b, b.stride(), out, offs, scales, _UNSCALED, None, a.element_size(), False)
    return out


def _fp8_rows_supports(a, a_scale, b, b_scale, *rest, **kwargs) -> str | None:
    return _fp8_supports(_blocks(a, a_scale, b.shape[1], b_scale, int(a.shape[1])), int(a.shape[1]))


def _fp8_grouped_gemm(a, a_scale, b, b_scale, offs, out_dtype, fast_accum, tma) -> torch.Tensor:
    """b [E, N, K] is read as [E, K, N] (through its strides, or transposed tiles with ``tma``); sums are promoted
    to fp32 per chunk unless ``fast_accum``."""
    (S, K), N = a.shape, b.shape[1]
    K = int(K)  # sets the chunk: a compiled graph specializes on it
    out = torch.empty((S, N), dtype=out_dtype, device=a.device)
    if out.numel() > 0:
        blocks = _blocks(a, a_scale, N, b_scale, K)
        scales, constexprs, block_k = _scaled(a, b, (a_scale, b_scale), blocks, K)
        b_strides = (b.stride(0), b.stride(2), b.stride(1))
        if not tma:  # raw bytes through pointers cast to their format
            a, b = a.view(torch.uint8), b.view(torch.uint8)
        _launch_rows(a, b, b_strides, out, offs, scales, constexprs, block_k, 1, fast_accum, tma)
    return out


@implementation(
    "fp8_grouped_gemm",
    "triton",
    priority=fp8_rows_priority,
    unavailable_reason=unavailable_reason,
    traceable=traceable,
    supports=_fp8_rows_supports,
)
def fp8_grouped_gemm(a, a_scale, b, b_scale, offs, out_dtype, fast_accum=False) -> torch.Tensor:
    return _fp8_grouped_gemm(a, a_scale, b, b_scale, offs, out_dtype, fast_accum, False)


@implementation(
    "fp8_grouped_gemm",
    "triton_tma",
    priority=tma_priority,
    unavailable_reason=tma_unavailable_reason,
    traceable=never,
    supports=lambda a, a_scale, b, b_scale, *rest, **kwargs: (
        _fp8_rows_supports(a, a_scale, b, b_scale) or tma_reason(("x", a), ("the weight", b))
    ),
)
def fp8_grouped_gemm_tma(a, a_scale, b, b_scale, offs, out_dtype, fast_accum=False) -> torch.Tensor:
    return _fp8_grouped_gemm(a, a_scale, b, b_scale, offs, out_dtype, fast_accum, True)


def _launch_rows(a, b, b_strides, out, offs, scales, constexprs, block_k, element_size, fast_accum, tma=False):
    """The persistent kernel over rows: out [S, N] = a [S, K] by groups times b ([E, K, N] by ``b_strides``); with
    ``tma``, a and b ([E, N, K]) are loaded through tensor descriptors."""
    (S, K), N = a.shape, out.shape[1]
    promoted = constexprs["SCALED"] and (constexprs["SCALE_PER_CHUNK"] or not fast_accum)
    options = _launch_options(element_size, promoted, block_k)
    a_strides, device = a.stride(), a.device
    if tma:
        a = descriptor(a, [options["BLOCK_M"], options["BLOCK_K"]])
        b = descriptor(b, [1, options["BLOCK_N"], options["BLOCK_K"]])
    a_scale, b_scale, *scale_arguments = scales
    b_block_rows = scale_arguments[-2]
    # B's scaling block spans the column tile (128x128 weight blocks): one scale per chunk
    b_scale_per_tile = constexprs["SCALE_PER_CHUNK"] and (b_block_rows % options["BLOCK_N"] == 0 or b_block_rows >= N)
    with on_device(device):
        launch(_grouped_gemm_kernel)[(persistent_programs(device),)](
            a,
            b,
            out,
            a_scale,
            b_scale,
            offs,
            S,
            N,
            K,
            offs.shape[0],
            *a_strides,
            *b_strides,
            *scale_arguments,
            B_SCALE_PER_TILE=b_scale_per_tile,
            FAST_ACCUM=fast_accum,
            UPCAST=interpreting(),
            IEEE=element_size == 4,
            EVEN_K=isinstance(K, int) and K % options["BLOCK_K"] == 0,  # a symbolic K: masked
            TMA=tma,
            **constexprs,
            **options,
        )


@implementation(
    "grouped_gemm_wgrad", "triton", priority=priority, unavailable_reason=unavailable_reason, traceable=traceable
)
def grouped_gemm_wgrad(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    (S, M), N = a.shape, b.shape[1]
    out = torch.empty((offs.shape[0], M, N), dtype=out_dtype, device=a.device)
    if out.numel() > 0:
        scales = (a, a, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1)  # unread: SCALED is off
        a_t, b_t = a.t(), b.t()  # [M, S], [N, S]: the contracted dimension last
        _launch_wgrad(a_t, b_t, S, out, offs, scales, _UNSCALED, None, a.element_size())
    return out


def _fp8_wgrad_supports(a, a_scale, b, b_scale, offs, *rest, **kwargs) -> str | None:
    return wgrad_scales_reason(a, a_scale, b, b_scale, offs) or _fp8_supports(
        _blocks(a, a_scale, b.shape[0], b_scale, int(a.shape[1])), int(a.shape[1])
    )


def _fp8_grouped_gemm_wgrad(a, a_scale, b, b_scale, offs, out_dtype, fast_accum, tma) -> torch.Tensor:
    """Scales shared by the groups or each group's own (``..reference.grouped_mm.fp8_grouped_gemm_wgrad``); sums
    are promoted to fp32 per chunk unless ``fast_accum`` (with scales constant along the rows)."""
    (M, S), N = a.shape, b.shape[0]
    S = int(S)  # sets the chunk: a compiled graph specializes on it
    out = torch.empty((offs.shape[0], M, N), dtype=out_dtype, device=a.device)
    if out.numel() > 0:
        blocks = _blocks(a, a_scale, N, b_scale, S)
        # Shared scales as every group's: stride 0 along the groups.
        per_group = [s if s.dim() == 3 else s.expand(offs.shape[0], -1, -1) for s in (a_scale, b_scale)]
        scales, constexprs, block_k = _scaled(a, b, per_group, blocks, S)
        if not tma:
            a, b = a.view(torch.uint8), b.view(torch.uint8)
        _launch_wgrad(a, b, S, out, offs, scales, constexprs, block_k, 1, fast_accum, tma)
    return out


@implementation(
    "fp8_grouped_gemm_wgrad",
    "triton",
    priority=priority,
    unavailable_reason=unavailable_reason,
    traceable=traceable,
    supports=_fp8_wgrad_supports,
)
def fp8_grouped_gemm_wgrad(a, a_scale, b, b_scale, offs, out_dtype, fast_accum=False) -> torch.Tensor:
    return _fp8_grouped_gemm_wgrad(a, a_scale, b, b_scale, offs, out_dtype, fast_accum, False)


@implementation(
    "fp8_grouped_gemm_wgrad",
    "triton_tma",
    priority=tma_priority,
    unavailable_reason=tma_unavailable_reason,
    traceable=never,
    supports=lambda a, a_scale, b, b_scale, offs, *rest, **kwargs: (
        _fp8_wgrad_supports(a, a_scale, b, b_scale, offs) or tma_reason(("x^T", a), ("dy^T", b))
    ),
)
def fp8_grouped_gemm_wgrad_tma(a, a_scale, b, b_scale, offs, out_dtype, fast_accum=False) -> torch.Tensor:
    return _fp8_grouped_gemm_wgrad(a, a_scale, b, b_scale, offs, out_dtype, fast_accum, True)


def _launch_wgrad(a, b, S, out, offs, scales, constexprs, block_k, element_size, fast_accum=False, tma=False) -> None:
    """The wgrad kernel: out [E, M, N] = per group, a [M, S] times b [N, S]^T over the group's rows; with ``tma``
    loaded through tensor descriptors; ``fast_accum``: FP8 sums in the MMA's accumulator where the scales allow."""
    E, M, N = out.shape
    fast_accum = fast_accum and not constexprs["SCALE_PER_CHUNK"]
    options = _launch_options(element_size, constexprs["SCALED"] and not fast_accum, block_k)
    strides, device = (*a.stride(), *b.stride()), a.device
    if tma:
        a = descriptor(a, [options["BLOCK_M"], options["BLOCK_K"]])
        b = descriptor(b, [options["BLOCK_N"], options["BLOCK_K"]])
    grid = (E * triton.cdiv(M, options["BLOCK_M"]) * triton.cdiv(N, options["BLOCK_N"]),)
    a_scale, b_scale, *scale_arguments = scales
    with on_device(device):
        launch(_grouped_wgrad_kernel)[grid](
            a,
            b,
            out,
            a_scale,
            b_scale,
            offs,
            S,
            M,
            N,
            E,
            *strides,
            *scale_arguments,
            FAST_ACCUM=fast_accum,
            UPCAST=interpreting(),
            IEEE=element_size == 4,
            TMA=tma,
            **constexprs,
            **options,
        )


__all__ = [
    "grouped_gemm",
    "grouped_gemm_wgrad",
    "fp8_grouped_gemm",
    "fp8_grouped_gemm_tma",
    "fp8_grouped_gemm_wgrad",
    "fp8_grouped_gemm_wgrad_tma",
    "zero_rows_past_groups",
    "persistent_programs",
]
