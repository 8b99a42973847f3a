"""FP8 GEMM operands, for every op family that quantizes one: formats, blocks, scale layouts, quantization, checks.

An operand [R, C] (C contracted) is quantized with dynamic scaling in blocks of its recipe (``turbo_inductor.recipes``)
and role: activation or gradient, or weight. A recipe's block (rows, cols), 0 for the whole dimension, is the
quantization kernel's block by :func:`kernel_block`. Its scale is fp32 [cdiv(R, block rows), cdiv(C, block cols)]
(:func:`scale_shape`). The kernel (``fp8_quantize``) writes q in the operand's layout, its transpose's, or both.
A grouped GEMM's experts' weights [E, K, N] are quantized by :func:`weight_operands`: once, the dgrad's copy the
forward's transposed, where the recipe's blocks allow (:func:`dgrad_weight_is_forward_transposed`).
Formats follow the device (:func:`fp8_formats`). Why: ``docs/ops.md``, "FP8 linear".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor

from ..kernels import registry
from ..kernels.reference.fp8_quant import device_formats, scale_shape, transposed_scale
from ..kernels.reference.fp8_transpose import fp8_transpose
from ..recipes import RECIPES, ROW_RECIPES, Recipe
from .library import check

QUANTIZE_KERNEL = "fp8_quantize"
TRANSPOSE_KERNEL = "fp8_transpose"

# cuBLASLt's FP8 GEMMs want N and K in multiples of 16.
ALIGNMENT = 16

fp8_formats = device_formats  # (e4m3, e5m2) for a device, as the kernels choose them


# ---- formats and blocks ---------------------------------------------------------------------------------------


def recipe_formats(recipe: str, device: torch.device) -> tuple[torch.dtype, torch.dtype]:
    """(operand format, gradient format) of ``recipe`` on ``device``: e4m3fn/e5m2, or the fnuz pair on MI300."""
    e4m3, e5m2 = fp8_formats(device)
    return e4m3, e5m2 if RECIPES[recipe].gradient_format == "e5m2" else e4m3


def kernel_block(block: tuple[int, int], rows: int, cols: int) -> tuple[int, int]:
    """A recipe's block as the quantization kernels take it. 0 becomes rows + cols + 1.

    That spans the dimension in either layout, with no guard on rows <= cols under dynamic shapes."""
    whole = rows + cols + 1
    return block[0] or whole, block[1] or whole


def producer_quantization(recipe: str, x: Tensor) -> tuple[torch.dtype, int]:
    """(format, block width) for a producer quantizing x [..., K] row by row, as ``recipe``'s linear would."""
    return fp8_formats(x.device)[0], Recipe.from_name(recipe).activation_block[1] or max(x.shape[-1], 1)


def keeps_x(recipe: str) -> bool:
    """Whether the wgrad takes x in its own dtype rather than x^T quantized."""
    return RECIPES[recipe].high_precision_wgrad


def check_saved_x(op: str, x, recipe: str) -> None:
    """A backward's x: given only for a recipe whose wgrad takes x itself."""
    check(
        x is None or keeps_x(recipe),
        op,
        lambda: f"x must be None for recipe {recipe!r}: its wgrad takes x^T quantized",
    )


def saves_x_t(recipe: str, weight_grad: bool) -> bool:
    """Whether the forward saves x^T quantized, for the wgrad.

    Not for a weight wanting no gradient, nor for a wgrad taking x itself."""
    return weight_grad and not keeps_x(recipe)


# ---- quantization ---------------------------------------------------------------------------------------------


def quantize_operand(
    t: Tensor,
    block: tuple[int, int],
    dtype: torch.dtype,
    recipe: Recipe,
    impl: str,
    transposed: bool = False,
    scale_t: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """(q, scale): the GEMM operand ``t`` [R, C] quantized in ``block``-shaped blocks.

    With ``transposed``: t^T [C, R] in such blocks, read from t; cast by ``scale_t`` (t^T's), where an earlier
    quantization of t gave them: no maxima then."""
    quantize = registry.select(QUANTIZE_KERNEL, t.device, impl)
    block_rows, block_cols = kernel_block(block, *t.shape)
    if not transposed:
        return quantize(t, dtype, block_rows, block_cols, False, power_of_two=recipe.power_of_two)
    if scale_t is not None:
        return quantize(t, dtype, block_cols, block_rows, True, scale=transposed_scale(scale_t)), scale_t
    q_t, scale = quantize(t, dtype, block_cols, block_rows, True, power_of_two=recipe.power_of_two)
    return q_t, transposed_scale(scale)


def quantize_operand_both(
    t: Tensor, block: tuple[int, int], dtype: torch.dtype, recipe: Recipe, impl: str
) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """``t`` [R, C] and ``t^T`` [C, R] quantized in ``block``-shaped blocks, by one call."""
    quantize = registry.select(QUANTIZE_KERNEL, t.device, impl)
    q, scale, q_t, scale_t = quantize(
        t, dtype, *kernel_block(block, *t.shape), False, power_of_two=recipe.power_of_two, both_layouts=True
    )
    return (q, scale), (q_t, scale_t)


def quantize_outputs(
    x: Tensor, fp8_dtype: torch.dtype, block_rows: int, block_cols: int, transpose: bool
) -> tuple[Tensor, Tensor]:
    """``fp8_quantize``'s (q, scale) for x [M, K], allocated: q uninitialized, every scale 1."""
    m, k = x.shape
    q = x.new_empty((k, m) if transpose else (m, k), dtype=fp8_dtype)
    scale = x.new_ones(scale_shape(m, k, block_rows, block_cols), dtype=torch.float32)
    return q, scale


def allocating_quantize(
    x, fp8_dtype, block_rows, block_cols, transpose, power_of_two=False, both_layouts=False, block_cols_t=0
):
    """The quantization kernel's outputs, allocated (the shapes the fakes return)."""
    q, scale = quantize_outputs(x, fp8_dtype, block_rows, block_cols, transpose)
    if not both_layouts:
        return q, scale
    q_t, scale_t = quantize_outputs(x, fp8_dtype, block_cols_t or block_cols, block_rows, True)
    return q, scale, q_t, transposed_scale(scale_t)


def quantizer(x: Tensor, impl: str) -> Callable:
    """The quantization kernel. On fake tensors and without rows, one that only allocates its outputs."""
    if isinstance(x, FakeTensor) or x.shape[0] == 0:
        return allocating_quantize
    return registry.select(QUANTIZE_KERNEL, x.device, impl)


def unsaved_operand(t: Tensor, fp8_dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Empty (q^T, scale): what the forward returns for a transpose it does not save."""
    return t.new_empty(0, dtype=fp8_dtype), t.new_empty(0, dtype=torch.float32)


def weight_operands(
    weight: Tensor, recipe: str, quantize: Callable, forward: bool, backward: bool, impl: str = registry.AUTO
) -> tuple[Optional[tuple[Tensor, Tensor]], Optional[tuple[Tensor, Tensor]]]:
    """W's per-expert FP8 operands in the recipe's weight blocks: (q, scale) each, or None where not wanted.

    Forward: W[g]^T [N, K] as [E, N, K], scales [E, N blocks, K blocks]. Backward (dx): W[g] [K, N] as
    [E, K, N], scales [E, K blocks, N blocks]. Strided views; the contracted dimension is contiguous.
    Where :func:`dgrad_weight_is_forward_transposed`, the backward's is the forward's q transposed (``fp8_transpose``,
    by ``impl``), its scales the forward's transposed: rowwise recipes' then lie along the dgrad's contracted N,
    [E, 1, N], for :func:`fold_contracted_weight_scales`."""
    if not (backward and dgrad_weight_is_forward_transposed(recipe)):
        return _weight_operands_apart(weight, recipe, quantize, forward, backward)
    q, scale = _weight_operands_apart(weight, recipe, quantize, True, False)[0]
    transpose = fp8_transpose if isinstance(q, FakeTensor) else registry.select(TRANSPOSE_KERNEL, q.device, impl)
    return ((q, scale) if forward else None), (transpose(q), scale.transpose(1, 2))


def dgrad_weight_is_forward_transposed(recipe: str) -> bool:
    """Whether the experts' dgrad operand is their forward copy transposed, W quantized once: where both layouts'
    blocks cut the same elements (whole experts, square blocks), and where the forward scales W^T per row (rowwise),
    a scale along the dgrad's contracted dimension that :func:`fold_contracted_weight_scales` moves onto dy."""
    rows, cols = RECIPES[recipe].weight_block
    return rows == cols or contracts_weight_scales(recipe)


def contracts_weight_scales(recipe: str) -> bool:
    """Whether the experts' dgrad operand is scaled along its contracted N (the rowwise recipes' W^T rows), which no
    GEMM epilogue can apply: dy's columns take it (:func:`fold_contracted_weight_scales`)."""
    return RECIPES[recipe].weight_block == (1, 0)


def fold_contracted_weight_scales(scale: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """(GEMM scale [E, K, 1], multiplier [E, N] bf16) for the dgrad operand's scales along N, ``scale`` [E, 1, N]:
    dx = dy diag(s_g) q_g = (dy diag(s_g / t_g)) q_g t_g, with t_g the expert's largest scale. dy's rows, times
    their expert's multiplier s_g / t_g in (0, 1], are quantized per row, and t_g is the GEMM's scale of every column
    of dx. bf16 keeps the multiplier within 2^-9, far inside FP8's rounding; dividing by t_g keeps dy's amax floor
    where it was. Why: ``docs/fp8.md``, "MoE experts: where the FP8 time goes"."""
    top = scale.amax(dim=2, keepdim=True)
    multiplier = (scale / top).squeeze(1).to(torch.bfloat16)
    return top.expand(-1, k, -1).contiguous(), multiplier


def _weight_operands_apart(
    weight: Tensor, recipe: str, quantize: Callable, forward: bool, backward: bool
) -> tuple[Optional[tuple[Tensor, Tensor]], Optional[tuple[Tensor, Tensor]]]:
    """:func:`weight_operands`, each layout quantized from W in its own blocks."""
    r, e4m3 = RECIPES[recipe], fp8_formats(weight.device)[0]
    experts = weight.shape[0]
    w_t = weight.transpose(-2, -1)
    # base [E, R, C]: the layout that flattens to [E * R, C] as a view. A copy where neither does.
    if _flattens(w_t) or not _flattens(weight):
        base, base_is_forward = w_t, True
    else:
        base, base_is_forward = weight, False
    rows_block, cols_block = r.weight_block  # an operand's rows, its contracted dimension; 0: the whole
    R, C = base.shape[1:]
    # A block must not straddle two experts, so R is padded to whole blocks: rows_block for base's layout,
    # cols_block for its transpose. A block of the whole dimension is one expert's R.
    pad = -R % max(rows_block, cols_block, 1)
    rows = R + pad
    flat = (F.pad(base, (0, 0, 0, pad)) if pad else base).reshape(experts * rows, C)
    wants_own, wants_transposed = (forward, backward) if base_is_forward else (backward, forward)
    # The transposed operand [C, R] per expert, R contracted: rows_block along C, cols_block along R.
    own_block, transposed_block = (rows_block or rows, cols_block or C), (cols_block or rows, rows_block or C)
    own = transposed = None
    if wants_own and wants_transposed and rows_block:
        # One call: x^T's blocks, rows_block x (cols_block or rows) over flat^T, are per expert.
        q, scale, q_t, scale_t = quantize(
            flat,
            e4m3,
            *own_block,
            False,
            power_of_two=r.power_of_two,
            both_layouts=True,
            block_cols_t=transposed_block[0],
        )
        own, transposed = (q, scale), (q_t, transposed_scale(scale_t))
    else:
        if wants_own:
            own = quantize(flat, e4m3, *own_block, False, power_of_two=r.power_of_two)
        if wants_transposed:
            transposed = quantize(flat, e4m3, *transposed_block, True, power_of_two=r.power_of_two)
    if own is not None:
        q, scale = own
        own = q.view(experts, rows, C)[:, :R], scale.view(experts, -1, scale.shape[1])[:, : -(-R // own_block[0])]
    if transposed is not None:
        q, scale = transposed  # scale in flat's layout of blocks
        transposed = (
            q.view(C, experts, rows)[:, :, :R].permute(1, 0, 2),
            scale.view(experts, -1, scale.shape[1])[:, : -(-R // transposed_block[0])].transpose(1, 2),
        )
    return (own, transposed) if base_is_forward else (transposed, own)


def _flattens(t: Tensor) -> bool:
    """Whether [E, R, C] reshapes to [E * R, C] as a view."""
    return t.shape[1] <= 1 or t.stride(0) == t.shape[1] * t.stride(1)


# ---- checks ---------------------------------------------------------------------------------------------------


def check_recipe(op: str, recipe: str) -> None:
    check(recipe in RECIPES, op, lambda: f"recipe must be one of {sorted(RECIPES)}, got {recipe!r}")


def check_row_recipe(op: str, recipe: str) -> None:
    """Check that ``recipe``'s blocks of x lie within a row, as FP8 producers need."""
    check(
        recipe in ROW_RECIPES,
        op,
        lambda: f"recipe must quantize x in blocks within a row {ROW_RECIPES}, got {recipe!r}",
    )


def check_quantized(
    op: str,
    name: str,
    q: Tensor,
    scale: Tensor,
    rows: int,
    cols: int,
    device: torch.device,
    block: tuple[int, int],
    recipe: str,
) -> None:
    """Check that ``q``, ``scale`` are the operand ``name`` [rows, cols] quantized in ``recipe``'s ``block``."""
    dtype, (block_rows, block_cols) = fp8_formats(device)[0], kernel_block(block, rows, cols)
    expected = scale_shape(rows, cols, block_rows, block_cols)
    check(
        q.shape == (rows, cols) and q.dtype == dtype and q.device == device,
        op,
        lambda: (
            f"{name}_q must be {name} quantized as [{rows}, {cols}] {dtype} on {device}, got {list(q.shape)} "
            f"{q.dtype} on {q.device}"
        ),
    )
    check(
        scale.shape == expected and scale.dtype == torch.float32 and scale.device == device,
        op,
        lambda: (
            f"{name}_scale must be the {recipe} scales of {name}, float32 {list(expected)}, got {scale.dtype} "
            f"{list(scale.shape)}"
        ),
    )
