"""FP8 grouped GEMMs for MoE layers: ``grouped_mm`` with x and each expert's weight quantized by a recipe.

Ops in ``torch.ops.turbo_inductor``:
  fp8_grouped_mm(x, weight, offs, recipe, impl, x_q, x_scale, positions, save_weight_t) -> y
                                                          public op: fp8_grouped_mm_fwd(...)[0] where a gradient is
                                                          wanted, else fp8_grouped_mm_inference
  fp8_grouped_mm_inference(x, weight, offs, recipe, impl, x_q, x_scale, positions) -> y
  fp8_grouped_mm_fwd(x, weight, offs, recipe, impl, weight_grad, x_q, x_scale, positions, save_weight_t)
                                                          -> (y, x_t, x_t_scale, w_t, w_t_scale)
                                                          custom op; backward: fp8_grouped_mm_bwd
  fp8_grouped_mm_bwd(dy, x, weight, offs, x_t, x_t_scale, w_t, w_t_scale, recipe, impl, positions)
                                                          -> (dx, dweight)

Shapes and semantics: ``grouped_mm``'s. FP8 recipes quantize as in ``fp8_linear``; tensorwise is per expert for W.
The tensorwise and rowwise recipes' wgrad takes x^T and dy^T as ``fp8_quantize_grouped`` writes them: [C, S_pad],
each group padded, with a scale per group and column. Tensorwise saves x^T so, with x_t_scale [E, K, 1]. The rowwise
recipes transpose one operand's rowwise FP8 copy (``fp8_transpose_grouped``) and fold its row scales into the
other's rows (:func:`_folds_row_scales`): x_t is x_q transposed and x_t_scale x_q's row scales [S, 1], or, where
:func:`saves_x` (dy wider, x the permute's tokens), x itself is saved (x_t empty) and the backward transposes dy's.
``x_q``, ``x_scale``: x already quantized by its producer (``glu_fp8``, ``moe_permute_fp8``).
``positions`` [T, k] (``moe_permute_fp8``'s): x [T, K] is an MoE layer's tokens, and the GEMM's rows are their
choices in expert order, row positions[t, j] holding x[t], given quantized as x_q. No copy of x in that order is
written: x^T is quantized from x's rows where they lie, dx is ``moe_combine`` of the rows' gradients, and
rowwise_with_gw_hp's wgrad gathers x's rows again in the backward.
``save_weight_t=False``: the backward quantizes the experts' W for dx again instead of holding it from the forward, as
``fp8_linear``'s does.
FP8 blocks and why: ``docs/ops.md``, "Grouped GEMMs", "FP8".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor

from ..kernels import registry
from ..kernels.reference.fp8_quant import transposed_scale
from ..kernels.reference.fp8_quant_grouped import padded_columns
from ..recipes import RECIPES
from .fp8_operands import (
    ALIGNMENT,
    QUANTIZE_KERNEL,
    TRANSPOSE_KERNEL,
    check_quantized,
    check_recipe,
    contracts_weight_scales,
    fold_contracted_weight_scales,
    fp8_formats,
    keeps_x,
    kernel_block,
    quantize_outputs,
    quantizer,
    recipe_formats,
    unsaved_operand,
    weight_operands,
)
from .grouped_mm import (
    WGRAD_KERNEL,
    can_rewrite,
    check_grouped,
    empty_weight_gradient,
    in_weight_layout,
    transposed_layout,
)
from .library import check, composite_op, kernel_op
from .moe import DISPATCH_KERNEL, GATHER_SUM_KERNEL, moe_combine, moe_combine_bwd
from .node import OpNode

FP8_GROUPED_KERNEL, FP8_WGRAD_KERNEL = "fp8_grouped_gemm", "fp8_grouped_gemm_wgrad"
GROUPED_QUANTIZE_KERNEL, GROUPED_ROWS_QUANTIZE_KERNEL = "fp8_quantize_grouped", "fp8_quantize_grouped_rows"
GROUPED_TRANSPOSE_KERNEL = "fp8_transpose_grouped"
QUANTIZE_KERNELS = (
    QUANTIZE_KERNEL,
    TRANSPOSE_KERNEL,
    GROUPED_QUANTIZE_KERNEL,
    GROUPED_ROWS_QUANTIZE_KERNEL,
    GROUPED_TRANSPOSE_KERNEL,
)
FP8_KERNELS = (*QUANTIZE_KERNELS, FP8_GROUPED_KERNEL, FP8_WGRAD_KERNEL, WGRAD_KERNEL)
# The experts' FP8 backward GEMMs sum in the tensor cores' fast mode: torch's wgrad then takes half as many tiles,
# 0.86 ms less per Mixtral layer on an H100, and the Triton dgrad twice as wide ones, 0.8 ms less, with the loss and
# gradients as accurate (docs/fp8.md, "The rows-grouped GEMM").
FAST_ACCUM_DGRAD = True
FAST_ACCUM_WGRAD = True


def _check(
    op: str,
    x: Tensor,
    weight: Tensor,
    offs: Tensor,
    recipe: str,
    x_q: Optional[Tensor] = None,
    x_scale: Optional[Tensor] = None,
    positions: Optional[Tensor] = None,
) -> None:
    check_recipe(op, recipe)
    rows = x.shape[0]
    if positions is not None:
        rows = _check_positions(op, x, positions)
        check(
            x_q is not None,
            op,
            lambda: "positions needs x_q and x_scale: x's rows in expert order, quantized (moe_permute_fp8)",
        )
    check_grouped(op, x, weight, offs, rows)
    k, n = weight.shape[1:]
    check(
        k % ALIGNMENT == 0 and n % ALIGNMENT == 0,
        op,
        lambda: f"weight's K and N must be multiples of {ALIGNMENT} for the FP8 GEMM, got {[k, n]}",
    )
    check((x_q is None) == (x_scale is None), op, lambda: "x_q and x_scale must be given together")
    if x_q is not None:
        check_quantized(op, "x", x_q, x_scale, rows, k, x.device, RECIPES[recipe].activation_block, recipe)


def _check_positions(op: str, x: Tensor, positions: Tensor) -> int:
    """The GEMM's rows, T * k, for x [T, K] read through ``positions`` [T, k]."""
    check(
        isinstance(positions, Tensor)
        and positions.dim() == 2
        and positions.dtype == torch.int64
        and positions.shape[0] == x.shape[0]
        and positions.device == x.device,
        op,
        lambda: (
            f"positions must be moe_permute_fp8's [T, k] int64 with T = {x.shape[0]} (x's tokens) on {x.device}, got "
            f"{list(positions.shape)} {positions.dtype} on {positions.device}"
        ),
    )
    return positions.shape[0] * positions.shape[1]


def _token_rows(positions: Tensor) -> Tensor:
    """The token each row of the expert order holds: row positions[t, j] holds t."""
    tokens, k = positions.shape
    flat = positions.reshape(-1)
    return torch.empty_like(flat).scatter_(0, flat, torch.arange(tokens * k, device=flat.device) // k)


def _activations(
    t: Tensor, recipe: str, fp8_dtype: torch.dtype, quantize: Callable, both: bool
) -> tuple[tuple[Tensor, Tensor], Optional[tuple[Tensor, Tensor]]]:
    """(q, scale) of t [S, C] and, with ``both``, of t^T [C, S] (else None), from one call.

    Both in the recipe's activation blocks."""
    r = RECIPES[recipe]
    blocks = kernel_block(r.activation_block, *t.shape)
    if not both:
        return quantize(t, fp8_dtype, *blocks, False, power_of_two=r.power_of_two), None
    q, scale, q_t, scale_t = quantize(t, fp8_dtype, *blocks, False, power_of_two=r.power_of_two, both_layouts=True)
    return (q, scale), (q_t, scale_t)


def _transposed_activations(
    t: Tensor, recipe: str, fp8_dtype: torch.dtype, quantize: Callable
) -> tuple[Tensor, Tensor]:
    """(q, scale) of t^T [C, S] alone, in the layout :func:`_activations` gives it."""
    r = RECIPES[recipe]
    block_rows, block_cols = kernel_block(r.activation_block, *t.shape)
    q_t, scale_t = quantize(t, fp8_dtype, block_cols, block_rows, True, power_of_two=r.power_of_two)
    return q_t, transposed_scale(scale_t)


def _pads_wgrad_operands(recipe: str) -> bool:
    """Whether the FP8 wgrad takes x^T and dy^T as ``fp8_quantize_grouped`` writes them: each group's columns padded
    to a non-zero multiple of 16, a scale per group and column. For the recipes whose activation scales span the
    contracted S (tensorwise, rowwise); blockwise and MXFP8 keep S's own blocks, which may straddle groups."""
    r = RECIPES[recipe]
    return not r.high_precision_wgrad and r.activation_block[1] == 0


def _folds_row_scales(recipe: str) -> bool:
    """Whether the FP8 wgrad takes one operand as its rowwise FP8 copy transposed, bytes moved rather than read twice
    to be quantized again, and the other quantized per group and column with those rows' scales folded into its rows:
    dW_g = sum_t x[t]^T dy[t], and with dy[t] = s_t q[t] that is sum_t (s_t x[t])^T q[t]. For the recipes scaling x
    and dy per row; which operand: :func:`saves_x`. Why: ``docs/kernels.md``, "Row scales folded"."""
    return _pads_wgrad_operands(recipe) and RECIPES[recipe].quantizes_x_in_rows


def saves_x(recipe: str, x: Tensor, weight: Tensor, positions: Optional[Tensor] = None) -> bool:
    """Whether the forward saves x itself for the wgrad rather than x^T quantized: for a bf16 wgrad, and where
    :func:`_folds_row_scales` transposes dy's bytes rather than x's. That is where dy is the wider operand (N > K) and
    x, the T tokens a permute sends to k experts each, holds no more bytes in its own dtype than x^T in FP8 (k at
    least x's element size); otherwise x's bytes are moved even where dy is wider, holding no more than before."""
    if keeps_x(recipe):
        return True
    if not _folds_row_scales(recipe) or weight.shape[1] >= weight.shape[2] or positions is None:
        return False
    return x.element_size() <= positions.shape[1]


def _grouped_transposer(q: Tensor, impl: str) -> Callable:
    """The grouped FP8 transpose. On fake tensors, one that only allocates its outputs."""
    if isinstance(q, FakeTensor):
        return lambda q, offs: (
            q.new_empty((q.shape[1], padded_columns(q.shape[0], offs.shape[0]))),
            offs.new_empty(offs.shape[0]),
        )
    return registry.select(GROUPED_TRANSPOSE_KERNEL, q.device, impl)


def _grouped_quantizer(t: Tensor, impl: str) -> Callable:
    """The grouped quantization kernel. On fake tensors, one that only allocates its outputs."""
    if isinstance(t, FakeTensor):
        return _allocating_grouped_quantize
    return registry.select(GROUPED_QUANTIZE_KERNEL, t.device, impl)


def _allocating_grouped_quantize(t, offs, fp8_dtype, power_of_two=False, rowwise=False, rows=None, row_multiplier=None):
    """``fp8_quantize_grouped``'s outputs, allocated (the shapes the fakes return)."""
    (rows, cols), groups = (t.shape[0] if rows is None else rows.shape[0], t.shape[1]), offs.shape[0]
    transposed = (
        t.new_empty((cols, padded_columns(rows, groups)), dtype=fp8_dtype),
        t.new_empty((groups, cols), dtype=torch.float32),
        offs.new_empty(groups),
    )
    return (*quantize_outputs(t, fp8_dtype, 1, max(cols, 1), False), *transposed) if rowwise else transposed


def _wgrad_operands(
    t: Tensor,
    offs: Tensor,
    recipe: str,
    fp8_dtype: torch.dtype,
    impl: str,
    q: Optional[tuple[Tensor, Tensor]] = None,
    rows: Optional[Tensor] = None,
) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]:
    """((q, scale), (q_t, scale_t, offs_t)): t [S, C] quantized for the rows-grouped GEMM (``q``: already, or None)
    and t^T for the FP8 wgrad, with the group offsets of its columns. ``rows``: the operand is ``t[rows]``, q given.

    Where :func:`_pads_wgrad_operands`: q_t [C, S_pad] padded, scale_t [E, C, 1] (per group, one block along its
    columns), offs_t the padded offsets. Otherwise t^T in the recipe's blocks, with offs."""
    r = RECIPES[recipe]
    if not _pads_wgrad_operands(recipe):
        # These blocks run along the rows in expert order, across groups: the rows are gathered for them.
        t = t if rows is None else t[rows]
        quantize = quantizer(t, impl)
        if q is None:
            q, transposed = _activations(t, recipe, fp8_dtype, quantize, True)
        else:
            transposed = _transposed_activations(t, recipe, fp8_dtype, quantize)
        return q, (*transposed, offs)
    grouped = _grouped_quantizer(t, impl)
    if q is None and r.quantizes_x_in_rows:
        q_rows, scale, q_t, scale_t, offs_t = grouped(t, offs, fp8_dtype, r.power_of_two, True)
        q = (q_rows, scale)
    else:
        # t already quantized, or tensorwise: one scale over all of t, which no group's program sees
        q = q or _activations(t, recipe, fp8_dtype, quantizer(t, impl), False)[0]
        q_t, scale_t, offs_t = grouped(t, offs, fp8_dtype, r.power_of_two, rows=rows)
    return q, (q_t, scale_t.unsqueeze(-1), offs_t)


def _forward(
    x: Tensor,
    weight: Tensor,
    offs: Tensor,
    recipe: str,
    impl: str,
    for_backward: bool,
    weight_grad: bool = True,
    x_q: Optional[Tensor] = None,
    x_scale: Optional[Tensor] = None,
    positions: Optional[Tensor] = None,
    save_weight_t: bool = True,
) -> tuple[Tensor, ...]:
    """(y,), or with ``for_backward`` (y, x_t, x_t_scale, w_t, w_t_scale); w_t empty unless ``save_weight_t``.

    ``x_q``, ``x_scale``: x already quantized, or None; with ``positions``, x's rows in expert order.
    On fake tensors: the same views of allocated outputs."""
    r, e4m3 = RECIPES[recipe], fp8_formats(x.device)[0]
    quantize = quantizer(x, impl)
    given = None if x_q is None else (x_q, x_scale)
    x_t = None
    if for_backward and weight_grad and not saves_x(recipe, x, weight, positions):
        # The backward gets the offsets of x^T's columns again from dy^T's quantization: a function of offs and S.
        if _folds_row_scales(recipe):  # x_q's bytes transposed, its row scales for dy's rows
            x_q = given or _activations(x, recipe, e4m3, quantize, False)[0]
            # A given x_scale is an input, which a custom op's output may not be.
            x_t = (_grouped_transposer(x_q[0], impl)(x_q[0], offs)[0], x_q[1] if given is None else x_q[1].clone())
        else:
            rows = None if positions is None else _token_rows(positions)
            x_q, (*x_t, _) = _wgrad_operands(x, offs, recipe, e4m3, impl, given, rows)
    else:
        x_q = given or _activations(x, recipe, e4m3, quantize, False)[0]
    w_q, w_t = weight_operands(weight, recipe, quantize, True, for_backward and save_weight_t, impl)
    if isinstance(x, FakeTensor) or x_q[0].shape[0] == 0:
        y = x.new_zeros((x_q[0].shape[0], weight.shape[2]))
    else:
        gemm = registry.select(FP8_GROUPED_KERNEL, x.device, impl)
        y = gemm(*x_q, *w_q, offs, x.dtype, fast_accum=r.fast_accum_forward)
    if not for_backward:
        return (y,)
    return y, *(x_t or unsaved_operand(x, e4m3)), *(w_t or unsaved_operand(x, e4m3))


@kernel_op(
    "fp8_grouped_mm_fwd",
    (*QUANTIZE_KERNELS, FP8_GROUPED_KERNEL),
    symbolic_sizes=False,
    fake=True,
)
def fp8_grouped_mm_fwd(
    x: Tensor,
    weight: Tensor,
    offs: Tensor,
    recipe: str,
    impl: str = "auto",
    weight_grad: bool = True,
    x_q: Optional[Tensor] = None,
    x_scale: Optional[Tensor] = None,
    positions: Optional[Tensor] = None,
    save_weight_t: bool = True,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    _check("fp8_grouped_mm", x, weight, offs, recipe, x_q, x_scale, positions)
    return _forward(x, weight, offs, recipe, impl, True, weight_grad, x_q, x_scale, positions, save_weight_t)


@kernel_op("fp8_grouped_mm_inference", (QUANTIZE_KERNEL, FP8_GROUPED_KERNEL), symbolic_sizes=False, fake=True)
def fp8_grouped_mm_inference(
    x: Tensor,
    weight: Tensor,
    offs: Tensor,
    recipe: str,
    impl: str = "auto",
    x_q: Optional[Tensor] = None,
    x_scale: Optional[Tensor] = None,
    positions: Optional[Tensor] = None,
) -> Tensor:
    """The forward alone, quantizing no operands for a backward."""
    _check("fp8_grouped_mm", x, weight, offs, recipe, x_q, x_scale, positions)
    return _forward(x, weight, offs, recipe, impl, False, x_q=x_q, x_scale=x_scale)[0]


@kernel_op(
    "fp8_grouped_mm_bwd",
    FP8_KERNELS,  # the bf16 wgrad's too (rowwise_with_gw_hp)
    symbolic_sizes=False,
    fake=True,
)
def fp8_grouped_mm_bwd(
    dy: Tensor,
    x: Optional[Tensor],
    weight: Tensor,
    offs: Tensor,
    x_t: Tensor,
    x_t_scale: Tensor,
    w_t: Tensor,
    w_t_scale: Tensor,
    recipe: str,
    impl: str = "auto",
    positions: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """(dx, dweight). dweight is empty where the forward saved nothing for a wgrad (a frozen weight). ``positions``:
    the forward's, where x is the tokens it read through them (x's rows in expert order are gathered as quantized)."""
    _check_backward(dy, x, weight, offs, x_t, x_t_scale, recipe, positions)
    return _backward(dy, x, weight, offs, x_t, x_t_scale, w_t, w_t_scale, recipe, impl, positions)


def _backward(dy, x, weight, offs, x_t, x_t_scale, w_t, w_t_scale, recipe, impl, positions) -> tuple[Tensor, Tensor]:
    """(dx, dweight) of the FP8 backward. On fake tensors: allocated outputs of the same layouts."""
    gradient_format = recipe_formats(recipe, dy.device)[1]
    # The folded wgrad transposes dy's bytes where the forward saved x, else x's (saves_x).
    wgrad = x is not None or (not keeps_x(recipe) and x_t.dim() == 2)
    transposed = transposed_layout(weight)
    if isinstance(dy, FakeTensor) or dy.shape[0] == 0:
        dx = dy.new_zeros((dy.shape[0], weight.shape[1]))
        dweight = empty_weight_gradient(weight, weight.shape, transposed).zero_() if wgrad else weight.new_empty(0)
        return dx, dweight
    fp8_wgrad = wgrad and not keeps_x(recipe)
    if w_t.dim() != 3:  # no W^T saved (save_weight_t=False): quantized from W again
        w_t, w_t_scale = weight_operands(weight, recipe, quantizer(dy, impl), False, True, impl)[1]
    dy_q = multiplier = None
    if contracts_weight_scales(recipe):  # W^T's row scales move onto dy's columns
        w_t_scale, multiplier = fold_contracted_weight_scales(w_t_scale, weight.shape[1])
        quantize_rows = registry.select(GROUPED_ROWS_QUANTIZE_KERNEL, dy.device, impl)
        dy_q = quantize_rows(dy, offs, multiplier, gradient_format, RECIPES[recipe].power_of_two)
    if fp8_wgrad and _folds_row_scales(recipe):
        dy_q = dy_q or _activations(dy, recipe, gradient_format, quantizer(dy, impl), False)[0]
        (x_t, x_t_scale), dy_t, wgrad_offs = _folded_wgrad_operands(
            dy, dy_q, multiplier, x, x_t, x_t_scale, weight, offs, recipe, impl, positions
        )
    elif fp8_wgrad:  # dy for dx, where not yet, and dy^T for the wgrad
        dy_q, (*dy_t, wgrad_offs) = _wgrad_operands(dy, offs, recipe, gradient_format, impl, dy_q)
    elif dy_q is None:
        dy_q = _activations(dy, recipe, gradient_format, quantizer(dy, impl), False)[0]
    dgrad = registry.select(FP8_GROUPED_KERNEL, dy.device, impl)
    dx = dgrad(*dy_q, w_t, w_t_scale, offs, dy.dtype, fast_accum=FAST_ACCUM_DGRAD)
    if not wgrad:
        return dx, weight.new_empty(0)
    if not fp8_wgrad:
        wgrad_kernel = registry.select(WGRAD_KERNEL, dy.device, impl)
        return dx, in_weight_layout(lambda a, b: wgrad_kernel(a, b, offs, weight.dtype), x, dy, transposed)
    gemm = registry.select(FP8_WGRAD_KERNEL, dy.device, impl)
    return dx, in_weight_layout(
        lambda a, b: gemm(*a, *b, wgrad_offs, weight.dtype, fast_accum=FAST_ACCUM_WGRAD),
        (x_t, x_t_scale),
        dy_t,
        transposed,
    )


def _folded_wgrad_operands(dy, dy_q, multiplier, x, x_t, x_t_scale, weight, offs, recipe, impl, positions):
    """((x^T, scale), (dy^T, scale), offsets of their columns) for the FP8 wgrad where :func:`_folds_row_scales`:
    the transposed operand's scale per group and column is what its rows' quantization left out (1, or dy's 1 /
    multiplier), the other's rows take the transposed one's row scales."""
    r, (e4m3, gradient_format) = RECIPES[recipe], recipe_formats(recipe, dy.device)
    experts, k, n = weight.shape
    if x is None:  # x's bytes transposed in the forward (saves_x)
        dy_t, dy_t_scale, offs_t = _grouped_quantizer(dy, impl)(
            dy, offs, gradient_format, r.power_of_two, row_multiplier=x_t_scale.squeeze(1)
        )
        return (x_t, x_t.new_ones((experts, k, 1), dtype=torch.float32)), (dy_t, dy_t_scale.unsqueeze(-1)), offs_t
    dy_t, offs_t = _grouped_transposer(dy_q[0], impl)(dy_q[0], offs)
    dy_t_scale = dy.new_ones((experts, n), dtype=torch.float32) if multiplier is None else 1 / multiplier.float()
    rows = None if positions is None else _token_rows(positions)
    x_t, x_t_scale, _ = _grouped_quantizer(x, impl)(
        x, offs, e4m3, r.power_of_two, rows=rows, row_multiplier=dy_q[1].squeeze(1)
    )
    return (x_t, x_t_scale.unsqueeze(-1)), (dy_t, dy_t_scale.unsqueeze(-1)), offs_t


def _check_backward(
    dy: Tensor,
    x: Optional[Tensor],
    weight: Tensor,
    offs: Tensor,
    x_t: Tensor,
    x_t_scale: Tensor,
    recipe: str,
    positions: Optional[Tensor],
) -> None:
    op = "fp8_grouped_mm_bwd"
    check_recipe(op, recipe)
    check(
        dy.dim() == 2 and dy.shape[1] == weight.shape[2] and dy.dtype == weight.dtype,
        op,
        lambda: f"dy must be [S, {weight.shape[2]}] in {weight.dtype}, got {list(dy.shape)} {dy.dtype}",
    )
    check(
        x is None or keeps_x(recipe) or _folds_row_scales(recipe),
        op,
        lambda: f"x must be None for recipe {recipe!r}: its wgrad takes x^T quantized",
    )
    check(x is None or x_t.dim() != 2, op, lambda: "give x or x_t for the wgrad, not both")
    check(
        positions is None or (x is not None and not keeps_x(recipe)),
        op,
        lambda: "positions is for x saved as the forward's tokens, quantized for an FP8 wgrad",
    )
    if x is not None:
        rows = dy.shape[0] if positions is None else _check_positions(op, x, positions)
        check(rows == dy.shape[0], op, lambda: f"positions must hold dy's {dy.shape[0]} rows, got {rows}")
        check_grouped(op, x, weight, offs, rows)
    if x_t.dim() == 2 and _pads_wgrad_operands(recipe):
        k, s_pad, groups = weight.shape[1], padded_columns(dy.shape[0], offs.shape[0]), offs.shape[0]
        # x_q's row scales where its bytes were transposed, else a scale per group and column
        scale_shape = (dy.shape[0], 1) if _folds_row_scales(recipe) else (groups, k, 1)
        check(
            x_t.shape == (k, s_pad) and x_t_scale.shape == scale_shape,
            op,
            lambda: (
                f"x_t and x_t_scale must be x^T in fp8_quantize_grouped's padded layout for recipe {recipe!r}, "
                f"[{k}, {s_pad}] and {list(scale_shape)}, got {list(x_t.shape)} and {list(x_t_scale.shape)}"
            ),
        )


def _fp8_setup(ctx, inputs, output):
    x, weight, offs, recipe, impl, weight_grad, _x_q, _x_scale, positions, _save_weight_t = inputs
    saved = output[1:]
    kept = x if weight_grad and saves_x(recipe, x, weight, positions) else None
    ctx.save_for_backward(kept, weight, offs, positions, *saved)
    ctx.mark_non_differentiable(*saved)
    # Eager autograd would otherwise hand the backward a zero-filled gradient of each saved FP8 operand, W^T too.
    ctx.set_materialize_grads(False)
    ctx.recipe, ctx.impl = recipe, impl


def _fp8_backward(ctx, dy, *_saved_grads):
    x, weight, offs, positions, *saved = ctx.saved_tensors
    gathered = positions if x is not None else None  # x, the forward's tokens: its rows read through positions
    if gathered is not None and keeps_x(ctx.recipe):
        # rowwise_with_gw_hp's wgrad reads x's rows in expert order: gathered again here rather than kept from the
        # forward, which holds T rows instead of T * k until the backward.
        x, gathered = moe_combine_bwd(x, None, None, positions, ctx.impl)[0], None
    dx, dweight = fp8_grouped_mm_bwd(dy, x, weight, offs, *saved, ctx.recipe, ctx.impl, gathered)
    wants_dx, wants_dweight = ctx.needs_input_grad[:2]
    if wants_dx and positions is not None:  # each token's gradient: its rows' summed, as moe_permute's backward does
        dx = moe_combine(dx, None, positions, ctx.impl)
    return dx if wants_dx else None, dweight if wants_dweight else None, *([None] * 8)


fp8_grouped_mm_fwd.register_autograd(_fp8_backward, setup_context=_fp8_setup)


@composite_op("fp8_grouped_mm")
def fp8_grouped_mm(
    x: Tensor,
    weight: Tensor,
    offs: Tensor,
    recipe: str,
    impl: str = "auto",
    x_q: Optional[Tensor] = None,
    x_scale: Optional[Tensor] = None,
    positions: Optional[Tensor] = None,
    save_weight_t: bool = True,
) -> Tensor:
    # Decided at decomposition, under autograd: AOTAutograd traces training and inference graphs apart.
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return fp8_grouped_mm_fwd(
            x,
            weight,
            offs,
            recipe,
            impl,
            weight_grad=weight.requires_grad,
            x_q=x_q,
            x_scale=x_scale,
            positions=positions,
            save_weight_t=save_weight_t,
        )[0]
    return fp8_grouped_mm_inference(x, weight, offs, recipe, impl, x_q=x_q, x_scale=x_scale, positions=positions)


def can_rewrite_fp8(x: Tensor, weight: Tensor, offs: Tensor) -> bool:
    """Whether that grouped GEMM can run as :func:`fp8_grouped_mm` (any recipe), forward and backward.

    K and N must be static multiples of 16."""
    k, n = weight.shape[1:] if weight.dim() == 3 else (None, None)
    return (
        can_rewrite(x, weight, offs)
        and isinstance(k, int)
        and isinstance(n, int)
        and k % ALIGNMENT == 0
        and n % ALIGNMENT == 0
        and all(registry.available_on(kernel, x.device) for kernel in FP8_KERNELS)
    )


def reads_permuted_x_in_place(recipe: str, weight_grad: bool) -> bool:
    """Whether the GEMM, given x with ``positions``, writes no copy of x's rows in expert order: its x^T is the padded
    per-group layout, which ``fp8_quantize_grouped`` gathers as it quantizes, or its wgrad takes x (gathered in the
    backward), or it has no wgrad. Blockwise and MXFP8 x^T blocks run across groups: their rows are gathered first."""
    return not weight_grad or keeps_x(recipe) or _pads_wgrad_operands(recipe)


class FP8GroupedMMNode(OpNode):
    op = fp8_grouped_mm
    # With positions, the backward gathers dx per token and, for a bf16 wgrad, x's rows: moe_permute_fp8 takes a
    # permute only where those kernels are available too, so the plain GEMM's rewrite asks for FP8_KERNELS alone.
    kernels = (*FP8_KERNELS, GATHER_SUM_KERNEL, DISPATCH_KERNEL)
