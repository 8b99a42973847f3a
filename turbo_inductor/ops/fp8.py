"""The FP8 ops on their own: dynamic-scaling quantization and the scaled FP8 GEMM.

Ops in ``torch.ops.turbo_inductor``, not differentiable (``fp8_linear`` carries the autograd).
  fp8_quantize(x, fp8_dtype, block_rows, block_cols, transpose, power_of_two, impl) -> (q, scale)
      x [M, K] in blocks of block_rows x block_cols; scale [cdiv(M, br), cdiv(K, bc)].
      scale = max(amax, 1e-12) / fmax per block. power_of_two rounds it up to a power of two.
      q = saturate(x * (1 / scale)), in x^T's layout [K, M] with transpose.
  fp8_gemm(a, a_scale, b, b_scale, out_dtype, impl) -> a_deq @ b_deq^T
      a [M, K] and b [N, K] in FP8. Scales: [M or 1 or M/bm, K/bk] and [N or 1 or N/bn, K/bk].
``quantize_weight(weight, recipe)``: W for a recipe's forward GEMM as one fp8_quantize node (constant folding).

Formats follow the device. NVIDIA and MI350 (gfx950): e4m3fn and e5m2. MI300 (gfx942): the fnuz pair.
What an FP8 op family's operands are (formats, blocks, scale layouts): ``fp8_operands``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels import registry
from ..kernels.reference.fp8_gemm import block_size
from ..kernels.reference.fp8_quant import FP8_DTYPES
from ..recipes import RECIPES
from .fp8_operands import QUANTIZE_KERNEL, fp8_formats, kernel_block, quantize_outputs
from .library import check, check_float, kept_whole, kernel_op

GEMM_KERNEL = "fp8_gemm"


def _check_quantize(x: Tensor, fp8_dtype: torch.dtype, block_rows: int, block_cols: int) -> None:
    check_float("fp8_quantize", "x", x)
    check(x.dim() == 2, "fp8_quantize", lambda: f"x must be 2-D [M, K], got shape {list(x.shape)}")
    check(fp8_dtype in FP8_DTYPES, "fp8_quantize", lambda: f"fp8_dtype must be one of {FP8_DTYPES}, got {fp8_dtype}")
    check(
        block_rows >= 1 and block_cols >= 1,
        "fp8_quantize",
        lambda: f"blocks must be >= 1, got {block_rows} x {block_cols}",
    )


@kernel_op("fp8_quantize", (QUANTIZE_KERNEL,), symbolic_sizes=False)
def fp8_quantize(
    x: Tensor,
    fp8_dtype: torch.dtype,
    block_rows: int,
    block_cols: int,
    transpose: bool = False,
    power_of_two: bool = False,
    impl: str = "auto",
) -> tuple[Tensor, Tensor]:
    _check_quantize(x, fp8_dtype, block_rows, block_cols)
    if x.numel() == 0:
        return quantize_outputs(x, fp8_dtype, block_rows, block_cols, transpose)
    return registry.select(QUANTIZE_KERNEL, x.device, impl)(
        x, fp8_dtype, block_rows, block_cols, transpose, power_of_two=power_of_two
    )


@fp8_quantize.register_fake
def _(x, fp8_dtype, block_rows, block_cols, transpose=False, power_of_two=False, impl="auto"):
    _check_quantize(x, fp8_dtype, block_rows, block_cols)
    return quantize_outputs(x, fp8_dtype, block_rows, block_cols, transpose)


def _check_gemm(a: Tensor, a_scale: Tensor, b: Tensor, b_scale: Tensor) -> None:
    op = "fp8_gemm"
    check(
        a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[1],
        op,
        lambda: f"a [M, K] and b [N, K] must share K, got {list(a.shape)} and {list(b.shape)}",
    )
    check(a.dtype in FP8_DTYPES and b.dtype in FP8_DTYPES, op, lambda: f"a, b must be fp8, got {a.dtype}, {b.dtype}")
    for name, t, s in (("a", a, a_scale), ("b", b, b_scale)):
        check(
            s.dtype == torch.float32
            and s.dim() == 2
            and _resolves(t.shape[0], s.shape[0])
            and _resolves(t.shape[1], s.shape[1]),
            op,
            lambda: (
                f"{name}_scale must be fp32 [blocks of rows, blocks of K] with blocks of 1, 32, 128 or the "
                f"whole dimension; got {s.dtype} {list(s.shape)} for {name} {list(t.shape)}"
            ),
        )


def _resolves(size: int, n_blocks: int) -> bool:
    try:
        block_size(size, n_blocks)
    except ValueError:
        return False
    return True


def quantize_weight(weight: Tensor, recipe: str, impl: str = "auto") -> tuple[Tensor, Tensor]:
    """(w_q, w_scale): W quantized for ``recipe``'s forward GEMM.

    One ``fp8_quantize`` node, kept whole for constant folding (``docs/ops.md``, "Freezing")."""
    r = RECIPES[recipe]
    with kept_whole():
        return fp8_quantize(
            weight,
            fp8_formats(weight.device)[0],
            *kernel_block(r.weight_block, *weight.shape),
            False,
            r.power_of_two,
            impl,
        )


@kernel_op("fp8_gemm", (GEMM_KERNEL,), symbolic_sizes=False)
def fp8_gemm(
    a: Tensor, a_scale: Tensor, b: Tensor, b_scale: Tensor, out_dtype: torch.dtype, impl: str = "auto"
) -> Tensor:
    _check_gemm(a, a_scale, b, b_scale)
    return registry.select(GEMM_KERNEL, a.device, impl)(a, a_scale, b, b_scale, out_dtype)


@fp8_gemm.register_fake
def _(a, a_scale, b, b_scale, out_dtype, impl="auto"):
    _check_gemm(a, a_scale, b, b_scale)
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)
