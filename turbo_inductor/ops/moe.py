"""MoE routing: the router's choices ordered by expert for the grouped GEMMs, and the experts' rows summed per token.

Ops in ``torch.ops.turbo_inductor``:
  moe_permute(x, indices, weights, num_experts, impl) -> (x_sorted, weights_sorted, offs, order, positions)
                                                     custom op; backward: moe_combine (dx), a gather (dweights)
  moe_permute_fp8(x, indices, weights, num_experts, recipe, impl) -> (q, scale, weights_sorted, offs, order, positions)
                                                     custom op; backward: a gather (dweights)
  moe_combine(y, weights, positions, impl) -> out    custom op; backward: moe_combine_bwd
  moe_combine_bwd(dout, y, weights, positions, impl) -> (dy, dweights)

``indices`` [T, k]: each token's top-k experts; choice t * k + j is indices[t, j].
moe_permute orders the choices by expert, stably. Indices outside [0, E) go last, uncounted in offs
(expert-parallel sentinels). Its outputs:
  x_sorted [T * k, H]          x's rows in that order
  weights_sorted [T * k]       the router weights in that order; empty without weights
  offs [E] int32               each expert's cumulative end row, for grouped_mm
  order [T * k] int64          the choice of each row
  positions [T, k] int64       the row of each choice

moe_permute_fp8: moe_permute for FP8 experts. x is quantized once per token as ``recipe`` quantizes a grouped GEMM's x
(blocks within a row), and the FP8 rows and their scales move in place of x_sorted: q [T * k, H], scale [T * k, blocks].
x's gradient flows through the FP8 grouped GEMMs, which take x and positions (``fp8_grouped_mm``).

moe_combine: out[t] = sum_j weights[t, j] * y[positions[t, j]], unweighted without weights.
It accumulates in fp32 and returns y's dtype. Nothing is read on the host.
Reference semantics: ``kernels/reference/moe.py``. Backward and why: ``docs/ops.md``, "MoE routing".
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..kernels import registry
from ..recipes import ROW_RECIPES, Recipe
from .fp8_operands import check_row_recipe, producer_quantization, scale_shape
from .library import SUPPORTED_FLOAT_DTYPES, check, check_float, check_same_device, kernel_op
from .node import OpNode

ROUTE_KERNEL, DISPATCH_KERNEL, GATHER_SUM_KERNEL = "moe_route", "moe_dispatch", "moe_gather_sum"
DISPATCH_FP8_KERNEL = "moe_dispatch_fp8"
INDEX_DTYPES = (torch.int32, torch.int64)


def _check_choices(op: str, tokens, indices_name: str, indices: Tensor, weights: Optional[Tensor]) -> None:
    """``indices`` [T, k] of an index dtype; ``weights`` None or [T, k] float."""
    check(
        isinstance(indices, Tensor) and indices.dim() == 2 and indices.shape[0] == tokens and indices.shape[1] >= 1,
        op,
        lambda: f"{indices_name} must be [T, k] with T = {tokens} and k >= 1, got {list(indices.shape)}",
    )
    check(
        indices.dtype in INDEX_DTYPES,
        op,
        lambda: f"{indices_name} must be int32 or int64, got {indices.dtype}",
    )
    if weights is not None:
        check(
            isinstance(weights, Tensor) and weights.shape == indices.shape and weights.dtype in SUPPORTED_FLOAT_DTYPES,
            op,
            lambda: (
                f"weights must be [T, k] = {list(indices.shape)} of a float dtype, got {list(weights.shape)} "
                f"{weights.dtype}"
            ),
        )


def _check_permute(
    x: Tensor, indices: Tensor, weights: Optional[Tensor], num_experts: int, op: str = "moe_permute"
) -> None:
    check_float(op, "x", x)
    check(x.dim() == 2, op, lambda: f"x must be 2-D [T, H] (one row per token), got shape {list(x.shape)}")
    _check_choices(op, x.shape[0], "indices", indices, weights)
    check(num_experts >= 1, op, lambda: f"num_experts must be at least 1, got {num_experts}")
    check_same_device(op, x=x, indices=indices, weights=weights)


def _check_rows(op: str, name: str, t: Tensor, rows) -> None:
    check_float(op, name, t)
    check(
        t.dim() == 2 and t.shape[0] == rows,
        op,
        lambda: f"{name} must be 2-D with {rows} rows, got shape {list(t.shape)}",
    )


def _check_positions(op: str, positions: Tensor, weights: Optional[Tensor]) -> None:
    check(
        isinstance(positions, Tensor) and positions.dim() == 2 and positions.dtype == torch.int64,
        op,
        lambda: f"positions must be moe_permute's [T, k] int64, got {list(positions.shape)} {positions.dtype}",
    )
    _check_choices(op, positions.shape[0], "positions", positions, weights)


def _check_combine(y: Tensor, weights: Optional[Tensor], positions: Tensor) -> None:
    op = "moe_combine"
    _check_positions(op, positions, weights)
    _check_rows(op, "y", y, positions.shape[0] * positions.shape[1])  # one row per choice, in expert order
    check_same_device(op, y=y, weights=weights, positions=positions)


def _check_combine_backward(dout: Tensor, y: Optional[Tensor], weights: Optional[Tensor], positions: Tensor) -> None:
    op = "moe_combine_bwd"
    _check_positions(op, positions, weights)
    _check_rows(op, "dout", dout, positions.shape[0])
    if y is not None:
        _check_rows(op, "y", y, positions.shape[0] * positions.shape[1])
        check(
            y.shape[1] == dout.shape[1] and y.dtype == dout.dtype,
            op,
            lambda: f"y ({list(y.shape)}, {y.dtype}) must have dout's width and dtype ({dout.shape[1]}, {dout.dtype})",
        )
    check_same_device(op, dout=dout, y=y, weights=weights, positions=positions)


# ---- permute --------------------------------------------------------------------------------------------------


def _no_weights(like: Tensor) -> Tensor:
    return like.new_empty(0, dtype=torch.float32)


@kernel_op("moe_permute", (ROUTE_KERNEL, DISPATCH_KERNEL))
def moe_permute(
    x: Tensor, indices: Tensor, weights: Optional[Tensor], num_experts: int, impl: str = "auto"
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    _check_permute(x, indices, weights, num_experts)
    offs, order, positions = registry.select(ROUTE_KERNEL, x.device, impl)(indices, num_experts)
    x_sorted = registry.select(DISPATCH_KERNEL, x.device, impl)(x, positions)[0]
    weights_sorted = _no_weights(x) if weights is None else weights.reshape(-1)[order]
    return x_sorted, weights_sorted, offs, order, positions


@moe_permute.register_fake
def _(x, indices, weights, num_experts, impl="auto"):
    _check_permute(x, indices, weights, num_experts)
    rows = indices.shape[0] * indices.shape[1]
    return (
        x.new_empty((rows, x.shape[1])),
        _no_weights(x) if weights is None else weights.new_empty(rows),
        x.new_empty(num_experts, dtype=torch.int32),
        x.new_empty(rows, dtype=torch.int64),
        x.new_empty(indices.shape, dtype=torch.int64),
    )


def _permute_setup(ctx, inputs, output):
    _x, _indices, weights, _num_experts, impl = inputs
    ctx.save_for_backward(output[4])
    ctx.mark_non_differentiable(*output[2:])
    ctx.impl, ctx.has_weights = impl, weights is not None


def _permute_backward(ctx, dx_sorted, dweights_sorted, *_index_grads):
    (positions,) = ctx.saved_tensors
    wants_dx, _, wants_dweights = ctx.needs_input_grad[:3]
    dx = moe_combine(dx_sorted, None, positions, ctx.impl) if wants_dx else None
    dweights = dweights_sorted[positions] if wants_dweights and ctx.has_weights else None
    return dx, None, dweights, None, None


# ---- permute in FP8 -------------------------------------------------------------------------------------------


def _check_permute_fp8(x: Tensor, indices: Tensor, weights: Optional[Tensor], num_experts: int, recipe: str) -> None:
    _check_permute(x, indices, weights, num_experts, "moe_permute_fp8")
    check_row_recipe("moe_permute_fp8", recipe)


def _fp8_rows(x: Tensor, rows, recipe: str) -> tuple[Tensor, Tensor]:
    """(q, scale) of ``rows`` rows of x's width, allocated."""
    dtype, block_cols = producer_quantization(recipe, x)
    return (
        x.new_empty((rows, x.shape[1]), dtype=dtype),
        x.new_empty(scale_shape(rows, x.shape[1], 1, block_cols), dtype=torch.float32),
    )


@kernel_op("moe_permute_fp8", (ROUTE_KERNEL, DISPATCH_FP8_KERNEL))
def moe_permute_fp8(
    x: Tensor, indices: Tensor, weights: Optional[Tensor], num_experts: int, recipe: str, impl: str = "auto"
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    _check_permute_fp8(x, indices, weights, num_experts, recipe)
    offs, order, positions = registry.select(ROUTE_KERNEL, x.device, impl)(indices, num_experts)
    if x.shape[0] == 0:
        q, scale = _fp8_rows(x, 0, recipe)
    else:
        dtype, block_cols = producer_quantization(recipe, x)
        dispatch = registry.select(DISPATCH_FP8_KERNEL, x.device, impl)
        q, scale = dispatch(x, positions, dtype, block_cols, Recipe.from_name(recipe).power_of_two)
    weights_sorted = _no_weights(x) if weights is None else weights.reshape(-1)[order]
    return q, scale, weights_sorted, offs, order, positions


@moe_permute_fp8.register_fake
def _(x, indices, weights, num_experts, recipe, impl="auto"):
    _check_permute_fp8(x, indices, weights, num_experts, recipe)
    rows = indices.shape[0] * indices.shape[1]
    return (
        *_fp8_rows(x, rows, recipe),
        _no_weights(x) if weights is None else weights.new_empty(rows),
        x.new_empty(num_experts, dtype=torch.int32),
        x.new_empty(rows, dtype=torch.int64),
        x.new_empty(indices.shape, dtype=torch.int64),
    )


def _permute_fp8_setup(ctx, inputs, output):
    ctx.save_for_backward(output[5])
    ctx.mark_non_differentiable(*output[:2], *output[3:])
    ctx.set_materialize_grads(False)  # weights_sorted is the one output with a gradient: no zero-filled q
    ctx.has_weights = inputs[2] is not None


def _permute_fp8_backward(ctx, _dq, _dscale, dweights_sorted, *_index_grads):
    """x gets no gradient here: it flows through the FP8 grouped GEMMs reading x with positions."""
    (positions,) = ctx.saved_tensors
    wants_dweights = ctx.needs_input_grad[2] and ctx.has_weights
    return None, None, dweights_sorted[positions] if wants_dweights else None, None, None, None


# ---- combine --------------------------------------------------------------------------------------------------


@kernel_op("moe_combine", (GATHER_SUM_KERNEL,))
def moe_combine(y: Tensor, weights: Optional[Tensor], positions: Tensor, impl: str = "auto") -> Tensor:
    _check_combine(y, weights, positions)
    return registry.select(GATHER_SUM_KERNEL, y.device, impl)(y, positions, weights, y.dtype)


@moe_combine.register_fake
def _(y, weights, positions, impl="auto"):
    _check_combine(y, weights, positions)
    return y.new_empty((positions.shape[0], y.shape[1]))


@kernel_op("moe_combine_bwd", (DISPATCH_KERNEL,))
def moe_combine_bwd(
    dout: Tensor, y: Optional[Tensor], weights: Optional[Tensor], positions: Tensor, impl: str = "auto"
) -> tuple[Tensor, Tensor]:
    """(dy, dweights): dweights in weights' dtype, empty unless both y and weights are given."""
    _check_combine_backward(dout, y, weights, positions)
    dy, dots = registry.select(DISPATCH_KERNEL, dout.device, impl)(
        dout, positions, weights, y if weights is not None else None
    )
    return dy, _no_weights(dout) if dots is None else dots.to(weights.dtype)


@moe_combine_bwd.register_fake
def _(dout, y, weights, positions, impl="auto"):
    _check_combine_backward(dout, y, weights, positions)
    tokens, k = positions.shape
    dweights = _no_weights(dout) if y is None or weights is None else weights.new_empty((tokens, k))
    return dout.new_empty((tokens * k, dout.shape[1])), dweights


def _combine_setup(ctx, inputs, output):
    y, weights, positions, impl = inputs
    ctx.save_for_backward(y if weights is not None else None, weights, positions)
    ctx.impl = impl


def _combine_backward(ctx, dout):
    y, weights, positions = ctx.saved_tensors
    wants_dy, wants_dweights = ctx.needs_input_grad[:2]
    dy, dweights = moe_combine_bwd(dout, y if wants_dweights else None, weights, positions, ctx.impl)
    return dy if wants_dy else None, dweights if wants_dweights else None, None, None


moe_permute.register_autograd(_permute_backward, setup_context=_permute_setup)
moe_permute_fp8.register_autograd(_permute_fp8_backward, setup_context=_permute_fp8_setup)
moe_combine.register_autograd(_combine_backward, setup_context=_combine_setup)


# ---- for the passes -------------------------------------------------------------------------------------------


def _available(device: torch.device, kernels: tuple[str, ...]) -> bool:
    return all(registry.available_on(kernel, device) for kernel in kernels)


def can_permute(x: Tensor, indices: Tensor, weights: Optional[Tensor]) -> bool:
    """Whether :func:`moe_permute` can order fake ``x`` [T, H] by ``indices`` [T, k], forward and backward.

    ``weights``: [T, k] or None."""
    return (
        x.dim() == 2
        and x.dtype in SUPPORTED_FLOAT_DTYPES
        and indices.dim() == 2
        and indices.dtype in INDEX_DTYPES
        and indices.shape[0] == x.shape[0]
        and (weights is None or (weights.shape == indices.shape and weights.dtype in SUPPORTED_FLOAT_DTYPES))
        and all(t.device == x.device for t in (indices, weights) if t is not None)
        and _available(x.device, (ROUTE_KERNEL, DISPATCH_KERNEL, GATHER_SUM_KERNEL))
    )


def can_combine(y: Tensor, weights: Optional[Tensor]) -> bool:
    """Whether :func:`moe_combine` can sum fake ``y`` [T * k, H] per token, forward and backward.

    ``weights``: [T, k] or None."""
    return (
        y.dim() == 2
        and y.dtype in SUPPORTED_FLOAT_DTYPES
        and (weights is None or (weights.dtype in SUPPORTED_FLOAT_DTYPES and weights.device == y.device))
        and _available(y.device, (GATHER_SUM_KERNEL, DISPATCH_KERNEL))
    )


def can_permute_fp8(x: Tensor, recipe: str, impl: str) -> bool:
    """Whether :func:`moe_permute_fp8` can quantize fake ``x`` [T, H] by ``recipe`` (a row recipe) as it moves it."""
    if recipe not in ROW_RECIPES or not _available(x.device, MoEPermuteFP8Node.kernels):
        return False
    block = producer_quantization(recipe, x)[1]
    return registry.has_capability(
        DISPATCH_FP8_KERNEL, x.device, impl, registry.FP8_IN_ITS_PASS, x.shape[-1], x.element_size(), block
    )


class MoEPermuteNode(OpNode):
    op = torch.ops.turbo_inductor.moe_permute.default
    kernels = (ROUTE_KERNEL, DISPATCH_KERNEL, GATHER_SUM_KERNEL)  # the backward combines
    outputs = ("x_sorted", "weights_sorted", "offs", "order", "positions")


class MoEPermuteFP8Node(OpNode):
    op = torch.ops.turbo_inductor.moe_permute_fp8.default
    # The backward of the grouped GEMMs reading its positions: dx gather-summed, and x gathered for a bf16 wgrad.
    kernels = (ROUTE_KERNEL, DISPATCH_FP8_KERNEL, GATHER_SUM_KERNEL, DISPATCH_KERNEL)
    outputs = ("q", "scale", "weights_sorted", "offs", "order", "positions")


class MoECombineNode(OpNode):
    op = torch.ops.turbo_inductor.moe_combine.default
    kernels = (GATHER_SUM_KERNEL, DISPATCH_KERNEL)
