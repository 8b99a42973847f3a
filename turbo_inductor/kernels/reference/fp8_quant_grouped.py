"""Grouped transposed FP8 quantization in plain PyTorch: t [S, C] (rows sorted by group) to the operand of the FP8
weight gradient, t^T [C, S_pad] with a scale per group and column, each group padded. It defines the semantics.

Groups are ``offs`` [E] int32, each group's end row, bounded as the grouped GEMMs bound them (each from the end of
the previous one, within [0, S]). Group g's rows become q_t's columns from its padded start, a multiple of
``PAD_ALIGN``, followed by zeros up to the next group's padded start: every group, an empty one included, holds a
non-zero multiple of ``PAD_ALIGN`` columns, as torch's contraction-grouped FP8 GEMM asserts on the device. The
columns after the last group's padded end, up to the static ``S_pad`` (:func:`padded_columns`), are zeros; rows
past the last group appear nowhere. Per group and column, ``scale = max(amax, 1e-12) / fmax`` and ``q = sat(t *
(1 / scale))``, as ``fp8_quant`` quantizes a block. ``offs`` is never read on the host. See docs/kernels.md,
"Grouped FP8 quantization".

With ``rows`` [S] int64, the operand is t's rows gathered, ``t[rows]``: an MoE layer's tokens in expert order, read
where they lie, so that no copy of them in that order is written. With ``row_multiplier`` [S] fp32, each row of the
operand is multiplied by its entry (in fp32) before it is quantized: the other wgrad operand's row scales, folded in
where that operand's FP8 rows are transposed rather than quantized again (docs/kernels.md, "Grouped FP8 quantization").
"""

from __future__ import annotations

import torch

from ..registry import implementation
from . import traced_off_cpu, unavailable_reason
from .fp8_quant import AMAX_FLOOR, FP8_DTYPES, INPUT_DTYPES, fp8_quantize, power_of_two_ceil, saturating_cast

# Each group starts at a multiple of this many columns of q_t: 16 bytes of FP8, the alignment TMA and torch's
# grouped GEMMs want of each group's start.
PAD_ALIGN = 16


def padded_columns(rows: int, groups: int) -> int:
    """S_pad, a static bound on the padded layout's columns: each group's padding adds at most PAD_ALIGN columns to
    the whole multiples of PAD_ALIGN among its rows."""
    return PAD_ALIGN * (rows // PAD_ALIGN + groups)


def _check_grouped(kernel: str, t: torch.Tensor, offs: torch.Tensor, fp8_dtype: torch.dtype) -> None:
    """What the grouped quantization kernels check of t, offs and the format; raises ValueError naming ``kernel``."""
    if t.dim() != 2 or t.dtype not in INPUT_DTYPES:
        raise ValueError(f"turbo_inductor: {kernel} expects a 2-D fp32/bf16/fp16 t, got {tuple(t.shape)} {t.dtype}")
    if offs.dim() != 1 or offs.dtype != torch.int32 or offs.shape[0] < 1:
        raise ValueError(
            f"turbo_inductor: {kernel} expects offs of at least one group, 1-D int32, got {tuple(offs.shape)} "
            f"{offs.dtype}"
        )
    if fp8_dtype not in FP8_DTYPES:
        raise ValueError(f"turbo_inductor: {kernel} fp8_dtype must be one of {FP8_DTYPES}, got {fp8_dtype}")


def check_args(
    t: torch.Tensor,
    offs: torch.Tensor,
    fp8_dtype: torch.dtype,
    rows: torch.Tensor | None = None,
    rowwise: bool = False,
    row_multiplier: torch.Tensor | None = None,
) -> None:
    """The argument checks every implementation makes; raises ValueError."""
    _check_grouped("fp8_quantize_grouped", t, offs, fp8_dtype)
    operand_rows = t.shape[0] if rows is None else rows.shape[0]
    if row_multiplier is not None and (
        row_multiplier.shape != (operand_rows,)
        or row_multiplier.dtype != torch.float32
        or row_multiplier.device != t.device
    ):
        raise ValueError(
            f"turbo_inductor: fp8_quantize_grouped expects row_multiplier [{operand_rows}] (one per operand row) fp32 "
            f"on t's device, got {tuple(row_multiplier.shape)} {row_multiplier.dtype} on {row_multiplier.device}"
        )
    if rows is not None and (rows.dim() != 1 or rows.dtype != torch.int64 or rows.device != t.device):
        raise ValueError(
            f"turbo_inductor: fp8_quantize_grouped expects rows 1-D int64 on t's device, got {tuple(rows.shape)} "
            f"{rows.dtype} on {rows.device}"
        )
    if rowwise and (rows is not None or row_multiplier is not None):
        # Gathered rows are an MoE layer's tokens, whose rowwise copy the permute moves in FP8 (moe_permute_fp8); a
        # multiplied operand is the wgrad's alone.
        raise ValueError("turbo_inductor: fp8_quantize_grouped writes no rowwise copy of gathered or multiplied rows")


def group_layout(offs: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(start, end, padded start, padded end) of each group, int64 [E] on offs' device, computed there."""
    ends = offs.long().clamp(0, rows).cummax(0).values
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    padded = ((ends - starts + PAD_ALIGN - 1) // PAD_ALIGN).clamp_min(1) * PAD_ALIGN
    padded_ends = padded.cumsum(0)
    return starts, ends, padded_ends - padded, padded_ends


def _group_of_rows(ends: torch.Tensor, rows: int) -> torch.Tensor:
    """Each row's group, from the groups' bounded ends; E for the rows past the last group."""
    return torch.searchsorted(ends, torch.arange(rows, device=ends.device), right=True)


@implementation(
    "fp8_quantize_grouped", "reference", priority=0, unavailable_reason=unavailable_reason, traceable=traced_off_cpu
)
def fp8_quantize_grouped(
    t: torch.Tensor,
    offs: torch.Tensor,
    fp8_dtype: torch.dtype,
    power_of_two: bool = False,
    rowwise: bool = False,
    rows: torch.Tensor | None = None,
    row_multiplier: torch.Tensor | None = None,
):
    """``(q_t [C, S_pad], scale_t [E, C] fp32, padded_offs [E] int32)``, each contiguous; with ``rowwise``, first
    ``(q [S, C], scale [S, 1])``, ``fp8_quantize`` of t per row over all of C (the rows-grouped GEMM's operand).
    ``power_of_two``: scales rounded up to powers of two. ``rows``: the operand is ``t[rows]`` (no rowwise copy).
    ``row_multiplier``: the operand's rows times it (no rowwise copy)."""
    check_args(t, offs, fp8_dtype, rows, rowwise, row_multiplier)
    if rows is not None:
        t = t[rows]
    if row_multiplier is not None:
        t = t.float() * row_multiplier[:, None]
    (rows, cols), groups = t.shape, offs.shape[0]
    s_pad = padded_columns(rows, groups)
    starts, ends, padded_starts, padded_ends = group_layout(offs, rows)
    # Per group and column: the maximum of |t|'s fp32 bits (non-negative floats order as their bits, NaN above inf),
    # an exact maximum that keeps NaN on every device. Rows past the last group go to group E, never read.
    group_of_row = _group_of_rows(ends, rows)
    abs_bits = t.float().abs().view(torch.int32)
    amax_bits = torch.zeros((groups + 1, cols), dtype=torch.int32, device=t.device)
    amax_bits.scatter_reduce_(0, group_of_row[:, None].expand(rows, cols), abs_bits, "amax")
    amax = amax_bits[:groups].view(torch.float32)
    scale = amax.clamp_min(AMAX_FLOOR) / torch.full_like(amax, torch.finfo(fp8_dtype).max)
    if power_of_two:
        scale = power_of_two_ceil(scale)
    # Each column of q_t: its group and the row of t it holds, where it holds one.
    column = torch.arange(s_pad, device=t.device)
    group = torch.searchsorted(padded_ends, column, right=True).clamp_max(groups - 1)
    row = starts[group] + column - padded_starts[group]
    holds = row < ends[group]
    if rows:
        scaled = t.float()[row.clamp(0, rows - 1)] * (torch.ones_like(scale) / scale)[group]
        scaled = torch.where(holds[:, None], scaled, torch.zeros_like(scaled))
    else:
        scaled = torch.zeros((s_pad, cols), device=t.device)
    transposed = (saturating_cast(scaled, fp8_dtype).t().contiguous(), scale, padded_ends.to(torch.int32))
    if not rowwise:
        return transposed
    return (*fp8_quantize(t, fp8_dtype, 1, max(cols, 1), False, power_of_two=power_of_two), *transposed)


def check_rows_args(t: torch.Tensor, offs: torch.Tensor, multiplier: torch.Tensor, fp8_dtype: torch.dtype) -> None:
    """``fp8_quantize_grouped_rows``'s argument checks, every implementation's; raises ValueError."""
    _check_grouped("fp8_quantize_grouped_rows", t, offs, fp8_dtype)
    expected = (offs.shape[0], t.shape[1])
    if (
        offs.device != t.device
        or multiplier.shape != expected
        or multiplier.dtype not in INPUT_DTYPES
        or multiplier.device != t.device
    ):
        raise ValueError(
            f"turbo_inductor: fp8_quantize_grouped_rows expects offs and a multiplier per group and column, "
            f"{list(expected)} fp32/bf16/fp16, on t's device {t.device}, got offs on {offs.device}, multiplier "
            f"{list(multiplier.shape)} {multiplier.dtype} on {multiplier.device}"
        )


@implementation(
    "fp8_quantize_grouped_rows",
    "reference",
    priority=0,
    unavailable_reason=unavailable_reason,
    traceable=traced_off_cpu,
)
def fp8_quantize_grouped_rows(
    t: torch.Tensor, offs: torch.Tensor, multiplier: torch.Tensor, fp8_dtype: torch.dtype, power_of_two: bool = False
):
    """``(q [S, C], scale [S, 1] fp32)``: each row of t, in group g, times ``multiplier[g]`` (in fp32), quantized
    over its whole row as ``fp8_quantize`` quantizes a row; rows past the last group times 1. Groups as
    :func:`fp8_quantize_grouped` bounds them.

    The FP8 dgrad's dy where W's forward copy is scaled per row of W^T, along the dgrad's contracted dimension: that
    scale moves onto dy's columns (``docs/kernels.md``, "Grouped FP8 quantization")."""
    check_rows_args(t, offs, multiplier, fp8_dtype)
    rows, groups = t.shape[0], offs.shape[0]
    ends = group_layout(offs, rows)[1]
    group_of_row = _group_of_rows(ends, rows)
    padded = torch.cat([multiplier.float(), multiplier.new_ones((1, t.shape[1]), dtype=torch.float32)])
    scaled = t.float() * padded[group_of_row.clamp_max(groups)]
    return fp8_quantize(scaled, fp8_dtype, 1, max(t.shape[1], 1), False, power_of_two=power_of_two)


__all__ = [
    "fp8_quantize_grouped",
    "fp8_quantize_grouped_rows",
    "padded_columns",
    "group_layout",
    "check_args",
    "check_rows_args",
    "PAD_ALIGN",
]
