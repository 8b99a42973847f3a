"""FP8 quantization through the native kernels (``csrc/fp8_quant.cu``): blocks of the whole tensor, of rows or of
columns (tensorwise, rowwise and transposed-rowwise operands), and both layouts of a tensorwise or rowwise operand
from two reads of x; other blocks go to the next implementation. Semantics: ``..reference.fp8_quant``."""

from __future__ import annotations

import torch

from ..reference.fp8_quant import FP8_DTYPES, check_args, device_formats
from ..registry import implementation
from . import ops, unavailable_reason

# Above Triton's (20): on the H200 they tie on tensorwise blocks and the native kernels are twice as fast on column
# blocks (``benchmarks/bench_fp8_quant.py``); other blocks go to Triton.
PRIORITY = 30
# Row blocks in one layout on rows longer than this go to Triton, whose kernel was 1.6x faster there on the H200
# (8192x14336: 0.094 against 0.149 ms; native faster at 8192x4096). Both layouts stay native: one call, two reads.
LONGEST_ONE_LAYOUT_ROW = 4096


def supports(
    x: torch.Tensor,
    fp8_dtype: torch.dtype,
    block_rows: int,
    block_cols: int,
    transpose: bool,
    power_of_two: bool = False,
    both_layouts: bool = False,
) -> str | None:
    if x.dim() != 2 or block_rows < 1 or block_cols < 1 or fp8_dtype not in FP8_DTYPES:
        return None  # invalid for every implementation: the call raises the error that names it
    M, K = x.shape
    blocks = _blocks_of(M, K, block_rows, block_cols)
    if blocks is None:
        return f"blocks of the whole tensor, of rows or of columns only, got {block_rows} x {block_cols}"
    if both_layouts and (blocks == "columns" or _blocks_of(K, M, block_rows, block_cols) != blocks):
        return (
            f"both layouts in blocks of the whole tensor or of whole rows (of x and of x^T) only, got "
            f"{block_rows} x {block_cols} on {M} x {K}"
        )
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
):
    """``(q, scale)``, or ``(q, scale, q_t, scale_t)`` with ``both_layouts``; see
    ``..reference.fp8_quant.fp8_quantize``."""
    check_args(x, fp8_dtype, block_rows, block_cols, transpose, both_layouts)
    outputs = ops().fp8_quantize(x, fp8_dtype, block_rows, block_cols, transpose, power_of_two, both_layouts)
    return tuple(outputs) if both_layouts else tuple(outputs[:2])


def _blocks_of(rows: int, cols: int, block_rows: int, block_cols: int) -> str | None:
    """The kernels' name for the blocks of a [rows, cols] tensor (``blocks_of`` in csrc/fp8_quant.cu), if any."""
    br, bc = min(block_rows, rows), min(block_cols, cols)
    if br == rows and bc == cols:
        return "tensor"
    if br == 1 and bc == cols:
        return "rows"
    return "columns" if br == rows and bc == 1 else None
