"""FP8 quantization through the native kernels of ``csrc/fp8_quant.cu``. Semantics: ``..reference.fp8_quant``.
They take blocks of the whole tensor, of rows or of columns. Other blocks go to the next implementation."""

from __future__ import annotations

import torch

from ..reference.fp8_quant import FP8_DTYPES, check_args, device_formats
from ..registry import implementation
from . import ops, unavailable_reason

# Above Triton (20). On the H200 they tie on tensorwise blocks.
# The native kernels are twice as fast on column blocks.
PRIORITY = 30
# Longer rows in one layout go to Triton. It is 1.6x faster at 8192x14336 on the H200.
# Native wins at 8192x4096. Both layouts stay native: one call, two reads.
LONGEST_ONE_LAYOUT_ROW = 4096


def supports(
    x: torch.Tensor,
    fp8_dtype: torch.dtype,
    block_rows: int,
    block_cols: int,
    transpose: bool,
    power_of_two: bool = False,
    both_layouts: bool = False,
    block_cols_t: int = 0,
    scale: torch.Tensor | None = None,
) -> str | None:
    if x.dim() != 2 or block_rows < 1 or block_cols < 1 or fp8_dtype not in FP8_DTYPES:
        return None  # invalid for every implementation: the call raises the error
    if scale is not None:
        return "no given scale: the kernels take their blocks' maxima themselves"
    M, K = x.shape
    blocks = _blocks_of(M, K, block_rows, block_cols)
    if blocks is None:
        return f"blocks of the whole tensor, of rows or of columns only, got {block_rows} x {block_cols}"
    if both_layouts and (reason := _both_layouts_decline(M, K, block_rows, block_cols, block_cols_t)):
        return reason
    if blocks == "rows" and not both_layouts and K > LONGEST_ONE_LAYOUT_ROW:
        return f"row blocks in one layout on rows longer than {LONGEST_ONE_LAYOUT_ROW}: Triton's kernel is faster"
    if not x.is_contiguous():
        return "contiguous input only"
    if fp8_dtype not in device_formats(x.device):  # the kernels are compiled for the GPU's encoding only
        return f"{fp8_dtype} is not this GPU's FP8 encoding"
    return None


@implementation("fp8_quantize", "native", priority=PRIORITY, unavailable_reason=unavailable_reason, supports=supports)
def fp8_quantize(
    x: torch.Tensor,
    fp8_dtype: torch.dtype,
    block_rows: int,
    block_cols: int,
    transpose: bool,
    power_of_two: bool = False,
    both_layouts: bool = False,
    block_cols_t: int = 0,
    scale: torch.Tensor | None = None,
):
    """``(q, scale)``, or ``(q, scale, q_t, scale_t)`` with ``both_layouts``; see
    ``..reference.fp8_quant.fp8_quantize``."""
    check_args(x, fp8_dtype, block_rows, block_cols, transpose, both_layouts, block_cols_t, scale)
    if scale is not None:
        raise ValueError("turbo_inductor: the native fp8_quantize takes no given scale (the Triton one does)")
    if both_layouts and block_cols_t:
        if reason := _both_layouts_decline(*x.shape, block_rows, block_cols, block_cols_t):
            raise ValueError(f"turbo_inductor: the native fp8_quantize cannot take these blocks: {reason}")
        # The kernels cut x^T with block_cols. Both layouts' blocks span their rows here: the larger spans either's.
        block_cols = max(block_cols, block_cols_t)
    outputs = ops().fp8_quantize(x, fp8_dtype, block_rows, block_cols, transpose, power_of_two, both_layouts)
    return tuple(outputs) if both_layouts else tuple(outputs[:2])


def _both_layouts_decline(M: int, K: int, block_rows: int, block_cols: int, block_cols_t: int) -> str | None:
    """Why the kernels cannot write both layouts in these blocks, or None: x's and x^T's must be the whole tensor
    or whole rows of each."""
    blocks = _blocks_of(M, K, block_rows, block_cols)
    if blocks != "columns" and _blocks_of(K, M, block_rows, block_cols_t or block_cols) == blocks:
        return None
    shape_t = f"{block_rows} x {block_cols_t or block_cols}"
    return (
        f"both layouts in blocks of the whole tensor or of whole rows (of x and of x^T) only, got {block_rows} x "
        f"{block_cols} on {M} x {K} and {shape_t} on x^T"
    )


def _blocks_of(rows: int, cols: int, block_rows: int, block_cols: int) -> str | None:
    """The kernels' name for the blocks of a [rows, cols] tensor, or None. Mirrors ``blocks_of`` in the kernels."""
    br, bc = min(block_rows, rows), min(block_cols, cols)
    if br == rows and bc == cols:
        return "tensor"
    if br == 1 and bc == cols:
        return "rows"
    return "columns" if br == rows and bc == 1 else None
