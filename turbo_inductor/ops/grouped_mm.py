"""Grouped GEMMs for MoE layers: each group of x's rows (one expert's tokens) times its own weight.

In bf16, fp16, fp32 and FP8, forward and backward.

Ops in ``torch.ops.turbo_inductor``:
  grouped_mm(x, weight, offs, impl) -> y                  custom op; backward: grouped_mm (dx), grouped_mm_wgrad
  grouped_mm_wgrad(x, dy, offs, transposed, impl) -> dweight
  fp8_grouped_mm(x, weight, offs, recipe, impl, x_q, x_scale) -> y
                                                          public op: fp8_grouped_mm_fwd(...)[0] where a gradient is
                                                          wanted, else fp8_grouped_mm_inference
  fp8_grouped_mm_inference(x, weight, offs, recipe, impl, x_q, x_scale) -> y
  fp8_grouped_mm_fwd(x, weight, offs, recipe, impl, weight_grad, x_q, x_scale) -> (y, x_t, x_t_scale, w_t, w_t_scale)
                                                          custom op; backward: fp8_grouped_mm_bwd
  fp8_grouped_mm_bwd(dy, x, weight, offs, x_t, x_t_scale, w_t, w_t_scale, recipe, impl) -> (dx, dweight)

x [S, K], rows sorted by group; weight [E, K, N], any strides; offs [E] int32, each group's cumulative end row.
y [S, N], contiguous, in x's dtype: row r of group g is x[r] @ weight[g]. Groups may be empty.
Rows past offs[-1] are zero in y and get a zero gradient. offs values are checked only on CPU.
dW has weight's layout. FP8 recipes quantize as in ``fp8_linear``; tensorwise is per expert for W. The tensorwise
and rowwise recipes save x^T as ``fp8_quantize_grouped`` writes it: [K, S_pad], each group padded, with x_t_scale
[E, K, 1], per group.
Semantics, FP8 blocks and why: ``docs/ops.md``, "Grouped GEMMs".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor

from ..kernels import registry
from ..kernels.reference.fp8_quant_grouped import padded_columns
from ..recipes import ALIGNMENT, RECIPES, kernel_block
from .fp8 import QUANTIZE_KERNEL, _quantize_outputs, fp8_formats
from .fp8_linear import check_quantized, unsaved_operand
from .library import SUPPORTED_FLOAT_DTYPES, check, check_float, check_same_device, define_composite, kernel_op
from .node import OpNode

GROUPED_KERNEL, WGRAD_KERNEL = "grouped_gemm", "grouped_gemm_wgrad"
FP8_GROUPED_KERNEL, FP8_WGRAD_KERNEL = "fp8_grouped_gemm", "fp8_grouped_gemm_wgrad"
GROUPED_QUANTIZE_KERNEL = "fp8_quantize_grouped"
FP8_KERNELS = (QUANTIZE_KERNEL, GROUPED_QUANTIZE_KERNEL, FP8_GROUPED_KERNEL, FP8_WGRAD_KERNEL, WGRAD_KERNEL)


# ---- checks ---------------------------------------------------------------------------------------------------


def _check(op: str, x: Tensor, weight: Tensor, offs: Tensor) -> None:
    check_float(op, "x", x)
    check(x.dim() == 2, op, lambda: f"x must be 2-D [S, K] (rows sorted by group), got shape {list(x.shape)}")
    check(
        isinstance(weight, Tensor) and weight.dim() == 3 and weight.dtype == x.dtype,
        op,
        lambda: f"weight must be 3-D [E, K, N] in x's dtype {x.dtype}, got {list(weight.shape)} {weight.dtype}",
    )
    check(
        weight.shape[1] == x.shape[1],
        op,
        lambda: f"weight [E, K, N] must share K with x [S, K], got weight {list(weight.shape)}, x {list(x.shape)}",
    )
    check(weight.shape[0] >= 1, op, lambda: "weight must hold at least one group (expert)")
    _check_offs(op, offs, weight.shape[0], x.shape[0])
    check_same_device(op, x=x, weight=weight, offs=offs)


def _check_offs(op: str, offs: Tensor, groups: int, rows: int) -> None:
    check(
        isinstance(offs, Tensor) and offs.dtype == torch.int32 and offs.dim() == 1,
        op,
        lambda: (
            f"offs must be a 1-D int32 tensor, got {getattr(offs, 'dtype', type(offs).__name__)} "
            f"{list(getattr(offs, 'shape', []))}"
        ),
    )
    check(
        offs.shape[0] == groups,
        op,
        lambda: f"offs must hold one end row per group: {groups} values, got {offs.shape[0]}",
    )
    if offs.device.type == "cpu" and type(offs) is Tensor:  # real values on the host: reading them costs no sync
        ends = offs.tolist()
        check(
            all(0 <= a <= b for a, b in zip([0] + ends, ends)) and (not ends or ends[-1] <= rows),
            op,
            lambda: f"offs must be non-decreasing within [0, {rows}] (the rows of x), got {ends}",
        )


def _check_recipe(op: str, recipe: str) -> None:
    check(recipe in RECIPES, op, lambda: f"recipe must be one of {sorted(RECIPES)}, got {recipe!r}")


def _check_fp8(
    op: str,
    x: Tensor,
    weight: Tensor,
    offs: Tensor,
    recipe: str,
    x_q: Optional[Tensor] = None,
    x_scale: Optional[Tensor] = None,
) -> None:
    _check_recipe(op, recipe)
    _check(op, x, weight, offs)
    k, n = weight.shape[1:]
    check(
        k % ALIGNMENT == 0 and n % ALIGNMENT == 0,
        op,
        lambda: f"weight's K and N must be multiples of {ALIGNMENT} for the FP8 GEMM, got {[k, n]}",
    )
    check((x_q is None) == (x_scale is None), op, lambda: "x_q and x_scale must be given together")
    if x_q is not None:
        check_quantized(op, "x", x_q, x_scale, x.shape[0], k, x.device, RECIPES[recipe].activation_block, recipe)


def transposed_layout(weight: Tensor) -> bool:
    """Whether ``weight`` [E, K, N] is the transpose of a contiguous [E, N, K], not itself contiguous.

    Its gradient then takes that layout too."""
    return weight.transpose(-2, -1).is_contiguous() and not weight.is_contiguous()


def _in_layout(make: Callable[[Any, Any], Tensor], x: Any, dy: Any, transposed: bool) -> Tensor:
    """dW [E, K, N] = ``make(x, dy)``. With ``transposed``: ``make(dy, x)`` [E, N, K], seen as its transpose."""
    return make(dy, x).transpose(-2, -1) if transposed else make(x, dy)


def _new_weight_gradient(like: Tensor, shape: tuple, transposed: bool) -> Tensor:
    """An uninitialized dW of ``shape`` [E, K, N] in the layout :func:`_in_layout` gives."""
    experts, k, n = shape
    return like.new_empty((experts, n, k)).transpose(-2, -1) if transposed else like.new_empty((experts, k, n))


# ---- bf16 / fp16 / fp32 -------------------------------------------------------------------------------------


@kernel_op("grouped_mm", (GROUPED_KERNEL,))
def grouped_mm(x: Tensor, weight: Tensor, offs: Tensor, impl: str = "auto") -> Tensor:
    _check("grouped_mm", x, weight, offs)
    if x.shape[0] == 0:
        return x.new_zeros((0, weight.shape[2]))
    return registry.select(GROUPED_KERNEL, x.device, impl)(x, weight, offs, x.dtype)


@grouped_mm.register_fake
def _(x, weight, offs, impl="auto"):
    _check("grouped_mm", x, weight, offs)
    return x.new_empty((x.shape[0], weight.shape[2]))


@kernel_op("grouped_mm_wgrad", (WGRAD_KERNEL,))
def grouped_mm_wgrad(x: Tensor, dy: Tensor, offs: Tensor, transposed: bool = False, impl: str = "auto") -> Tensor:
    """dW [E, K, N]: dW[g] = x_g^T dy_g, zero for an empty group.

    Contiguous; with ``transposed``, the transpose of a contiguous [E, N, K] (:func:`transposed_layout`)."""
    _check_wgrad(x, dy, offs)
    shape = (offs.shape[0], x.shape[1], dy.shape[1])
    if x.shape[0] == 0:
        return _new_weight_gradient(x, shape, transposed).zero_()
    wgrad = registry.select(WGRAD_KERNEL, x.device, impl)
    return _in_layout(lambda a, b: wgrad(a, b, offs, x.dtype), x, dy, transposed)


def _check_wgrad(x: Tensor, dy: Tensor, offs: Tensor) -> None:
    op = "grouped_mm_wgrad"
    check_float(op, "x", x)
    check(x.dim() == 2, op, lambda: f"x must be 2-D [S, K], got shape {list(x.shape)}")
    check(
        isinstance(dy, Tensor) and dy.dim() == 2 and dy.shape[0] == x.shape[0] and dy.dtype == x.dtype,
        op,
        lambda: f"dy must be [{x.shape[0]}, N] in {x.dtype}, got {list(dy.shape)} {dy.dtype}",
    )
    check(isinstance(offs, Tensor) and offs.dim() == 1, op, lambda: "offs must be 1-D: one end row per group")
    _check_offs(op, offs, offs.shape[0], x.shape[0])
    check_same_device(op, x=x, dy=dy, offs=offs)


@grouped_mm_wgrad.register_fake
def _(x, dy, offs, transposed=False, impl="auto"):
    _check_wgrad(x, dy, offs)
    return _new_weight_gradient(x, (offs.shape[0], x.shape[1], dy.shape[1]), transposed)


def _grouped_mm_setup(ctx, inputs, output):
    x, weight, offs, impl = inputs
    ctx.save_for_backward(x, weight, offs)
    ctx.impl = impl


def _grouped_mm_backward(ctx, dy):
    x, weight, offs = ctx.saved_tensors
    wants_dx, wants_dweight = ctx.needs_input_grad[:2]
    dx = grouped_mm(dy, weight.transpose(-2, -1), offs, ctx.impl) if wants_dx else None
    dweight = grouped_mm_wgrad(x, dy, offs, transposed_layout(weight), ctx.impl) if wants_dweight else None
    return dx, dweight, None, None


grouped_mm.register_autograd(_grouped_mm_backward, setup_context=_grouped_mm_setup)


# ---- FP8 ----------------------------------------------------------------------------------------------------


def _quantizer(x: Tensor, impl: str) -> Callable:
    """The quantization kernel. On fake tensors and without rows, one that only allocates its outputs."""
    if isinstance(x, FakeTensor) or x.shape[0] == 0:
        return _allocating_quantize
    return registry.select(QUANTIZE_KERNEL, x.device, impl)


def _allocating_quantize(x, fp8_dtype, block_rows, block_cols, transpose, power_of_two=False, both_layouts=False):
    """``fp8_quantize``'s outputs, allocated (the shapes the fakes return)."""
    q, scale = _quantize_outputs(x, fp8_dtype, block_rows, block_cols, transpose)
    if not both_layouts:
        return q, scale
    q_t, scale_t = _quantize_outputs(x, fp8_dtype, block_cols, block_rows, True)
    return q, scale, q_t, scale_t.t().contiguous()


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
    return q_t, scale_t.t().contiguous()


def _pads_wgrad_operands(recipe: str) -> bool:
    """Whether the FP8 wgrad takes x^T and dy^T as ``fp8_quantize_grouped`` writes them: each group's columns padded
    to a non-zero multiple of 16, a scale per group and column. For the recipes whose activation scales span the
    contracted S (tensorwise, rowwise); blockwise and MXFP8 keep S's own blocks, which may straddle groups."""
    r = RECIPES[recipe]
    return not r.high_precision_wgrad and r.activation_block[1] == 0


def _grouped_quantizer(t: Tensor, impl: str) -> Callable:
    """The grouped quantization kernel. On fake tensors, one that only allocates its outputs."""
    if isinstance(t, FakeTensor):
        return _allocating_grouped_quantize
    return registry.select(GROUPED_QUANTIZE_KERNEL, t.device, impl)


def _allocating_grouped_quantize(t, offs, fp8_dtype, power_of_two=False, rowwise=False):
    """``fp8_quantize_grouped``'s outputs, allocated (the shapes the fakes return)."""
    (rows, cols), groups = t.shape, offs.shape[0]
    transposed = (
        t.new_empty((cols, padded_columns(rows, groups)), dtype=fp8_dtype),
        t.new_empty((groups, cols), dtype=torch.float32),
        offs.new_empty(groups),
    )
    return (*_quantize_outputs(t, fp8_dtype, 1, max(cols, 1), False), *transposed) if rowwise else transposed


def _wgrad_operands(
    t: Tensor, offs: Tensor, recipe: str, fp8_dtype: torch.dtype, impl: str, q: Optional[tuple[Tensor, Tensor]] = None
) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]:
    """((q, scale), (q_t, scale_t, offs_t)): t [S, C] quantized for the rows-grouped GEMM (``q``: already, or None)
    and t^T for the FP8 wgrad, with the group offsets of its columns.

    Where :func:`_pads_wgrad_operands`: q_t [C, S_pad] padded, scale_t [E, C, 1] (per group, one block along its
    columns), offs_t the padded offsets. Otherwise t^T in the recipe's blocks, with offs."""
    r = RECIPES[recipe]
    if not _pads_wgrad_operands(recipe):
        quantize = _quantizer(t, impl)
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
        q = q or _activations(t, recipe, fp8_dtype, _quantizer(t, impl), False)[0]
        q_t, scale_t, offs_t = grouped(t, offs, fp8_dtype, r.power_of_two)
    return q, (q_t, scale_t.unsqueeze(-1), offs_t)


def weight_operands(
    weight: Tensor, recipe: str, quantize: Callable, forward: bool, backward: bool
) -> tuple[Optional[tuple[Tensor, Tensor]], Optional[tuple[Tensor, Tensor]]]:
    """W's per-expert FP8 operands in the recipe's weight blocks: (q, scale) each, or None where not wanted.

    Forward: W[g]^T [N, K] as [E, N, K], scales [E, N blocks, K blocks]. Backward (dx): W[g] [K, N] as
    [E, K, N], scales [E, K blocks, N blocks]. Strided views; the contracted dimension is contiguous."""
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
    own = transposed = None
    if forward if base_is_forward else backward:
        block = rows_block or rows
        q, scale = quantize(flat, e4m3, block, cols_block or C, False, power_of_two=r.power_of_two)
        own = q.view(experts, rows, C)[:, :R], scale.view(experts, -1, scale.shape[1])[:, : -(-R // block)]
    if backward if base_is_forward else forward:
        # [C, R] per expert, R contracted: rows_block along C, cols_block along R. Read in base's layout.
        block = cols_block or rows
        q, scale = quantize(flat, e4m3, block, rows_block or C, True, power_of_two=r.power_of_two)
        transposed = (
            q.view(C, experts, rows)[:, :, :R].permute(1, 0, 2),
            scale.view(experts, -1, scale.shape[1])[:, : -(-R // block)].transpose(1, 2),
        )
    return (own, transposed) if base_is_forward else (transposed, own)


def _flattens(t: Tensor) -> bool:
    """Whether [E, R, C] reshapes to [E * R, C] as a view."""
    return t.shape[1] <= 1 or t.stride(0) == t.shape[1] * t.stride(1)


def _keeps_x(recipe: str) -> bool:
    return RECIPES[recipe].high_precision_wgrad


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
) -> tuple[Tensor, ...]:
    """(y,), or with ``for_backward`` (y, x_t, x_t_scale, w_t, w_t_scale).

    ``x_q``, ``x_scale``: x already quantized, or None. On fake tensors: the same views of allocated outputs."""
    r, e4m3 = RECIPES[recipe], fp8_formats(x.device)[0]
    quantize = _quantizer(x, impl)
    given = None if x_q is None else (x_q, x_scale)
    x_t = None
    if for_backward and weight_grad and not _keeps_x(recipe):
        # The backward gets the offsets of x^T's columns again from dy^T's quantization: a function of offs and S.
        x_q, (*x_t, _) = _wgrad_operands(x, offs, recipe, e4m3, impl, given)
    else:
        x_q = given or _activations(x, recipe, e4m3, quantize, False)[0]
    w_q, w_t = weight_operands(weight, recipe, quantize, True, for_backward)
    if isinstance(x, FakeTensor) or x.shape[0] == 0:
        y = x.new_zeros((x.shape[0], weight.shape[2]))
    else:
        gemm = registry.select(FP8_GROUPED_KERNEL, x.device, impl)
        y = gemm(*x_q, *w_q, offs, x.dtype, fast_accum=r.fast_accum_forward)
    if not for_backward:
        return (y,)
    return y, *(x_t or unsaved_operand(x, e4m3)), *w_t


@kernel_op("fp8_grouped_mm_fwd", (QUANTIZE_KERNEL, GROUPED_QUANTIZE_KERNEL, FP8_GROUPED_KERNEL), symbolic_sizes=False)
def fp8_grouped_mm_fwd(
    x: Tensor,
    weight: Tensor,
    offs: Tensor,
    recipe: str,
    impl: str = "auto",
    weight_grad: bool = True,
    x_q: Optional[Tensor] = None,
    x_scale: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    _check_fp8("fp8_grouped_mm", x, weight, offs, recipe, x_q, x_scale)
    return _forward(x, weight, offs, recipe, impl, True, weight_grad, x_q, x_scale)


@fp8_grouped_mm_fwd.register_fake
def _(x, weight, offs, recipe, impl="auto", weight_grad=True, x_q=None, x_scale=None):
    _check_fp8("fp8_grouped_mm", x, weight, offs, recipe, x_q, x_scale)
    return _forward(x, weight, offs, recipe, impl, True, weight_grad, x_q, x_scale)


@kernel_op("fp8_grouped_mm_inference", (QUANTIZE_KERNEL, FP8_GROUPED_KERNEL), symbolic_sizes=False)
def fp8_grouped_mm_inference(
    x: Tensor,
    weight: Tensor,
    offs: Tensor,
    recipe: str,
    impl: str = "auto",
    x_q: Optional[Tensor] = None,
    x_scale: Optional[Tensor] = None,
) -> Tensor:
    """The forward alone, quantizing no operands for a backward."""
    _check_fp8("fp8_grouped_mm", x, weight, offs, recipe, x_q, x_scale)
    return _forward(x, weight, offs, recipe, impl, False, x_q=x_q, x_scale=x_scale)[0]


@fp8_grouped_mm_inference.register_fake
def _(x, weight, offs, recipe, impl="auto", x_q=None, x_scale=None):
    _check_fp8("fp8_grouped_mm", x, weight, offs, recipe, x_q, x_scale)
    return _forward(x, weight, offs, recipe, impl, False, x_q=x_q, x_scale=x_scale)[0]


@kernel_op(
    "fp8_grouped_mm_bwd",
    (QUANTIZE_KERNEL, GROUPED_QUANTIZE_KERNEL, FP8_GROUPED_KERNEL, FP8_WGRAD_KERNEL),
    symbolic_sizes=False,
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
) -> tuple[Tensor, Tensor]:
    """(dx, dweight). dweight is empty where the forward saved nothing for a wgrad (a frozen weight)."""
    _check_backward(dy, x, weight, offs, x_t, x_t_scale, recipe)
    return _backward(dy, x, weight, offs, x_t, x_t_scale, w_t, w_t_scale, recipe, impl)


@fp8_grouped_mm_bwd.register_fake
def _(dy, x, weight, offs, x_t, x_t_scale, w_t, w_t_scale, recipe, impl="auto"):
    _check_backward(dy, x, weight, offs, x_t, x_t_scale, recipe)
    return _backward(dy, x, weight, offs, x_t, x_t_scale, w_t, w_t_scale, recipe, impl)


def _backward(dy, x, weight, offs, x_t, x_t_scale, w_t, w_t_scale, recipe, impl) -> tuple[Tensor, Tensor]:
    """(dx, dweight) of the FP8 backward. On fake tensors: allocated outputs of the same layouts."""
    r, (e4m3, e5m2) = RECIPES[recipe], fp8_formats(dy.device)
    wgrad = x is not None if _keeps_x(recipe) else x_t.dim() == 2
    transposed = transposed_layout(weight)
    if isinstance(dy, FakeTensor) or dy.shape[0] == 0:
        dx = dy.new_zeros((dy.shape[0], weight.shape[1]))
        dweight = _new_weight_gradient(weight, weight.shape, transposed).zero_() if wgrad else weight.new_empty(0)
        return dx, dweight
    gradient_format = e5m2 if r.gradient_format == "e5m2" else e4m3
    fp8_wgrad = wgrad and not _keeps_x(recipe)
    if fp8_wgrad:  # dy for dx and dy^T for the wgrad
        dy_q, (*dy_t, wgrad_offs) = _wgrad_operands(dy, offs, recipe, gradient_format, impl)
    else:
        dy_q = _activations(dy, recipe, gradient_format, _quantizer(dy, impl), False)[0]
    dx = registry.select(FP8_GROUPED_KERNEL, dy.device, impl)(*dy_q, w_t, w_t_scale, offs, dy.dtype)
    if not wgrad:
        return dx, weight.new_empty(0)
    if not fp8_wgrad:
        wgrad_kernel = registry.select(WGRAD_KERNEL, dy.device, impl)
        return dx, _in_layout(lambda a, b: wgrad_kernel(a, b, offs, weight.dtype), x, dy, transposed)
    gemm = registry.select(FP8_WGRAD_KERNEL, dy.device, impl)
    return dx, _in_layout(lambda a, b: gemm(*a, *b, wgrad_offs, weight.dtype), (x_t, x_t_scale), dy_t, transposed)


def _check_backward(
    dy: Tensor, x: Optional[Tensor], weight: Tensor, offs: Tensor, x_t: Tensor, x_t_scale: Tensor, recipe: str
) -> None:
    op = "fp8_grouped_mm_bwd"
    _check_recipe(op, recipe)
    check(
        dy.dim() == 2 and dy.shape[1] == weight.shape[2] and dy.dtype == weight.dtype,
        op,
        lambda: f"dy must be [S, {weight.shape[2]}] in {weight.dtype}, got {list(dy.shape)} {dy.dtype}",
    )
    check(
        x is None or _keeps_x(recipe),
        op,
        lambda: f"x must be None for recipe {recipe!r}: its wgrad takes x^T quantized",
    )
    if x is not None:
        _check(op, x, weight, offs)
    if x_t.dim() == 2 and _pads_wgrad_operands(recipe):
        k, s_pad, groups = weight.shape[1], padded_columns(dy.shape[0], offs.shape[0]), offs.shape[0]
        check(
            x_t.shape == (k, s_pad) and x_t_scale.shape == (groups, k, 1),
            op,
            lambda: (
                f"x_t and x_t_scale must be x^T in fp8_quantize_grouped's padded layout, [{k}, {s_pad}] and "
                f"[{groups}, {k}, 1], got {list(x_t.shape)} and {list(x_t_scale.shape)}"
            ),
        )


def _fp8_setup(ctx, inputs, output):
    x, weight, offs, recipe, impl, weight_grad, _x_q, _x_scale = inputs
    saved = output[1:]
    keeps_x = _keeps_x(recipe) and weight_grad
    ctx.save_for_backward(x if keeps_x else None, weight, offs, *saved)
    ctx.mark_non_differentiable(*saved)
    ctx.recipe, ctx.impl = recipe, impl


def _fp8_backward(ctx, dy, *_saved_grads):
    x, weight, offs, *saved = ctx.saved_tensors
    dx, dweight = fp8_grouped_mm_bwd(dy, x, weight, offs, *saved, ctx.recipe, ctx.impl)
    wants_dx, wants_dweight = ctx.needs_input_grad[:2]
    return dx if wants_dx else None, dweight if wants_dweight else None, None, None, None, None, None, None


fp8_grouped_mm_fwd.register_autograd(_fp8_backward, setup_context=_fp8_setup)


def _fp8_grouped_mm(
    x: Tensor,
    weight: Tensor,
    offs: Tensor,
    recipe: str,
    impl: str = "auto",
    x_q: Optional[Tensor] = None,
    x_scale: Optional[Tensor] = None,
) -> Tensor:
    # Decided at decomposition, under autograd: AOTAutograd traces training and inference graphs apart.
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return fp8_grouped_mm_fwd(x, weight, offs, recipe, impl, weight.requires_grad, x_q, x_scale)[0]
    return fp8_grouped_mm_inference(x, weight, offs, recipe, impl, x_q, x_scale)


fp8_grouped_mm = define_composite(
    "fp8_grouped_mm(Tensor x, Tensor weight, Tensor offs, str recipe, str impl='auto', Tensor? x_q=None, "
    "Tensor? x_scale=None) -> Tensor",
    _fp8_grouped_mm,
)


def can_rewrite(x: Tensor, weight: Tensor, offs: Tensor) -> bool:
    """Whether ``torch._grouped_mm(x, weight, offs=offs)`` (fake tensors) can run as :func:`grouped_mm`.

    Forward and backward."""
    return (
        x.dim() == 2
        and x.dtype in SUPPORTED_FLOAT_DTYPES
        and weight.dim() == 3
        and weight.dtype == x.dtype
        and weight.shape[0] >= 1
        and weight.shape[1] == x.shape[1]
        and offs.dim() == 1
        and offs.dtype == torch.int32
        and offs.shape[0] == weight.shape[0]
        and x.device == weight.device == offs.device
        and all(registry.available_on(kernel, x.device) for kernel in (GROUPED_KERNEL, WGRAD_KERNEL))
    )


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


class GroupedMMNode(OpNode):
    op = torch.ops.turbo_inductor.grouped_mm.default
    kernels = (GROUPED_KERNEL, WGRAD_KERNEL)
    x: fx.Node
    weight: fx.Node
    offs: fx.Node
    impl: str


class FP8GroupedMMNode(OpNode):
    op = fp8_grouped_mm
    kernels = FP8_KERNELS
    x: fx.Node
    weight: fx.Node
    offs: fx.Node
    recipe: str
    impl: str
    x_q: fx.Node | None  # x already quantized by its producer
    x_scale: fx.Node | None
