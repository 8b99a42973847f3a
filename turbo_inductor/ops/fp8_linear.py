"""FP8 linear: ``y = x W^T (+ bias)`` with x and W quantized by a recipe, forward and backward.

Ops in ``torch.ops.turbo_inductor``:
  fp8_linear(x, weight, bias, recipe, impl, x_q, x_scale, save_weight_t, x_t, x_t_scale) -> y
                                                                 public op: fp8_linear_fwd(...)[0] where a
                                                                 gradient is wanted, else fp8_linear_inference
  fp8_linear_inference(x, weight, bias, recipe, impl, x_q, x_scale, w_q, w_scale) -> y
                                                                 the forward alone; W as weight or quantized
  fp8_linear_fwd(x, weight, bias, recipe, impl, x_q, x_scale, weight_grad, save_weight_t, x_t, x_t_scale)
                                                                 -> (y, x_t, x_t_scale, w_t, w_t_scale)
                                                                 custom op; backward: fp8_linear_bwd (+ dbias)
  fp8_linear_bwd(dy, x, weight, x_t, x_t_scale, w_t, w_t_scale, recipe, impl, weight_dtype) -> (dx, dweight)

Each GEMM operand is quantized with dynamic scaling, in blocks set by the recipe (``turbo_inductor.recipes``).
The forward saves x^T and W^T quantized; the backward reads neither x nor W again, and W is not held for it (a
W concatenated in the graph, ``fp8_concat``'s, would otherwise stay alive until the backward).
A weight that wants no gradient (``weight_grad`` False) gets no wgrad: dweight is empty.
W may be float32 beside a narrower x (fp32 parameters under autocast): it is quantized from float32, y and dx take
x's dtype, and the wgrad GEMM writes dW in float32, so that no cast of W or dW runs.
``save_weight_t=False``: the backward quantizes W^T from W instead of saving it (FSDP2); where W^T's scales are W's
transposed, the forward returns them and the backward only casts.
``x_q``, ``x_scale``: x already quantized by its producer (``rmsnorm_fp8``, ``glu_fp8``, ``fp8_shared_input``).
``x_t``, ``x_t_scale``: x^T quantized too (``fp8_shared_input``). The backward reads them; the forward then saves
no x^T of its own and returns it empty.
Under Inductor's ``freezing``, W is quantized once, at compile time.
Why: ``docs/ops.md``, "FP8 linear".
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor
from torch._inductor import config as inductor_config

from ..kernels import registry
from ..recipes import RECIPES
from .fp8 import GEMM_KERNEL, quantize_weight
from .fp8_operands import (
    ALIGNMENT,
    QUANTIZE_KERNEL,
    check_quantized,
    check_recipe,
    check_saved_x,
    fp8_formats,
    keeps_x,
    kernel_block,
    quantize_operand,
    quantize_operand_both,
    recipe_formats,
    saves_x_t,
    scale_shape,
    transposed_scale,
    unsaved_operand,
)
from .library import (
    SUPPORTED_FLOAT_DTYPES,
    check,
    check_float,
    check_linear,
    composite_op,
    kernel_op,
    register_linear_autograd,
)
from .node import OpNode


def _gemm(
    a: tuple[Tensor, Tensor], b: tuple[Tensor, Tensor], out_dtype: torch.dtype, impl: str, fast_accum: bool = False
) -> Tensor:
    return registry.select(GEMM_KERNEL, a[0].device, impl)(a[0], a[1], b[0], b[1], out_dtype, fast_accum=fast_accum)


def _check(
    op: str,
    x: Tensor,
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    recipe: str,
    x_q: Optional[Tensor] = None,
    x_scale: Optional[Tensor] = None,
    w_q: Optional[Tensor] = None,
    w_scale: Optional[Tensor] = None,
    x_t: Optional[Tensor] = None,
    x_t_scale: Optional[Tensor] = None,
) -> None:
    """Takes ``weight`` or, for inference, W quantized as ``w_q``, ``w_scale``: exactly one of them."""
    check_recipe(op, recipe)
    check((x_q is None) == (x_scale is None), op, lambda: "x_q and x_scale must be given together")
    check((x_t is None) == (x_t_scale is None), op, lambda: "x_t and x_t_scale must be given together")
    check(x_t is None or x_q is not None, op, lambda: "x_t is x^T quantized beside x_q: give x_q too")
    check((w_q is None) == (w_scale is None), op, lambda: "w_q and w_scale must be given together")
    check(
        (weight is None) != (w_q is None),
        op,
        lambda: (
            "give the weight or its FP8 form (w_q, w_scale), one of them, got "
            + ("both" if weight is not None else "neither")
        ),
    )
    r = RECIPES[recipe]
    if weight is not None:
        check_linear(op, x, weight, bias, weight_dtype=weight_dtype_for(x, weight))
    else:
        check_linear(op, x, w_q, bias, "w_q", fp8_formats(x.device)[0])
        check_quantized(op, "w", w_q, w_scale, *w_q.shape, x.device, r.weight_block, recipe)
    n, k = (weight if weight is not None else w_q).shape
    check(
        n % ALIGNMENT == 0 and k % ALIGNMENT == 0,
        op,
        lambda: f"weight dimensions must be multiples of {ALIGNMENT} for the FP8 GEMM, got {[n, k]}",
    )
    if x_q is not None:
        check_quantized(op, "x", x_q, x_scale, math.prod(x.shape[:-1]), k, x.device, r.activation_block, recipe)
    if _handed(x_t):
        rows = math.prod(x.shape[:-1])
        check_quantized(op, "x_t", x_t, x_t_scale, k, rows, x.device, r.activation_block, recipe)


def weight_dtype_for(x: Tensor, weight: Tensor) -> torch.dtype:
    """The dtype W may have beside x: x's, or float32, a wider parameter quantized from it (autocast)."""
    return torch.float32 if weight.dtype == torch.float32 else x.dtype


def _handed(x_t: Optional[Tensor]) -> bool:
    """Whether x^T came quantized from x's producer. Empty where it wrote none (its readers wanted no wgrad)."""
    return x_t is not None and x_t.dim() == 2


def _forward(
    x: Tensor,
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    recipe: str,
    impl: str,
    for_backward: bool,
    x_q: Optional[Tensor],
    x_scale: Optional[Tensor],
    w_q: Optional[Tensor] = None,
    w_scale: Optional[Tensor] = None,
    weight_grad: bool = True,
    save_weight_t: bool = True,
    x_t: Optional[Tensor] = None,
    x_t_scale: Optional[Tensor] = None,
) -> tuple[Tensor, ...]:
    """(y,), or with ``for_backward`` (y, *what the backward takes).

    ``x_q``, ``x_scale``: x quantized by its producer, or None; ``x_t``, ``x_t_scale`` x^T with them, or None.
    A handed x^T is returned empty: the backward reads the input (``_saves``).
    ``w_q``, ``w_scale``: W already quantized (inference, weight None)."""
    _check("fp8_linear", x, weight, bias, recipe, x_q, x_scale, w_q, w_scale, x_t, x_t_scale)
    r, (e4m3, _) = RECIPES[recipe], fp8_formats(x.device)
    x2 = x.reshape(-1, x.shape[-1])
    quantizes_x_t = for_backward and saves_x_t(recipe, weight_grad) and not _handed(x_t)
    if x2.shape[0] == 0:
        y = x.new_zeros(x.shape[:-1] + ((weight if weight is not None else w_q).shape[0],))
        y = y + (0 if bias is None else bias)
        saved = _saved_transposes(x2, weight, recipe, weight_grad and not _handed(x_t), save_weight_t)
        return (y, *saved) if for_backward else (y,)
    if x_q is not None:
        x_t = (
            quantize_operand(x2, r.activation_block, e4m3, r, impl, transposed=True)
            if quantizes_x_t
            else unsaved_operand(x, e4m3)
        )
        x_q = (x_q, x_scale)
    elif quantizes_x_t:
        x_q, x_t = quantize_operand_both(x2, r.activation_block, e4m3, r, impl)
    else:
        x_q, x_t = quantize_operand(x2, r.activation_block, e4m3, r, impl), unsaved_operand(x, e4m3)
    if w_q is not None:
        w_q, w_t = (w_q, w_scale), unsaved_operand(x, e4m3)
    elif for_backward and save_weight_t:
        w_q, w_t = quantize_operand_both(weight, r.weight_block, e4m3, r, impl)
    else:
        w_q = quantize_operand(weight, r.weight_block, e4m3, r, impl)
        w_t = unsaved_operand(x, e4m3)
        if for_backward and r.weight_scales_transpose:  # W^T's scales are W's transposed: the backward casts by them
            w_t = w_t[0], transposed_scale(w_q[1], copy=True)
    y = _gemm(x_q, w_q, x.dtype, impl, fast_accum=r.fast_accum_forward)
    if bias is not None:
        y = y + bias
    y = y.view(x.shape[:-1] + (y.shape[-1],))
    return (y, *x_t, *w_t) if for_backward else (y,)


def _saved_transposes(
    x2: Tensor, weight: Tensor, recipe: str, weight_grad: bool, save_weight_t: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Uninitialized tensors of the saved transposes' shapes (the fake; a forward with no rows)."""
    r, e4m3 = RECIPES[recipe], fp8_formats(x2.device)[0]
    saved = []
    for save, t, block in (
        (saves_x_t(recipe, weight_grad), x2, r.activation_block),
        (save_weight_t, weight, r.weight_block),
    ):
        rows, cols = t.shape
        block_rows, block_cols = kernel_block(block, rows, cols)
        q_t, scale_t = unsaved_operand(t, e4m3)
        if save or (t is weight and r.weight_scales_transpose):  # without W^T, its scales
            scale_t = t.new_empty(scale_shape(cols, rows, block_rows, block_cols), dtype=torch.float32)
        if save:
            q_t = t.new_empty((cols, rows), dtype=e4m3)
        saved += (q_t, scale_t)
    return tuple(saved)


@kernel_op("fp8_linear_fwd", (QUANTIZE_KERNEL, GEMM_KERNEL), symbolic_sizes=False)
def fp8_linear_fwd(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    recipe: str,
    impl: str = "auto",
    x_q: Optional[Tensor] = None,
    x_scale: Optional[Tensor] = None,
    weight_grad: bool = True,
    save_weight_t: bool = True,
    x_t: Optional[Tensor] = None,
    x_t_scale: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    return _forward(
        x,
        weight,
        bias,
        recipe,
        impl,
        True,
        x_q,
        x_scale,
        weight_grad=weight_grad,
        save_weight_t=save_weight_t,
        x_t=x_t,
        x_t_scale=x_t_scale,
    )


@fp8_linear_fwd.register_fake
def _(
    x,
    weight,
    bias,
    recipe,
    impl="auto",
    x_q=None,
    x_scale=None,
    weight_grad=True,
    save_weight_t=True,
    x_t=None,
    x_t_scale=None,
):
    _check("fp8_linear", x, weight, bias, recipe, x_q, x_scale, x_t=x_t, x_t_scale=x_t_scale)
    y = x.new_empty(x.shape[:-1] + (weight.shape[0],))
    x2 = x.reshape(-1, x.shape[-1])
    return y, *_saved_transposes(x2, weight, recipe, weight_grad and not _handed(x_t), save_weight_t)


def _requantizes_weight(inputs: tuple) -> bool:
    """Whether the backward reads W: only where the forward saved no W^T (``save_weight_t=False``)."""
    return not _arguments(inputs)["save_weight_t"]


def _arguments(inputs: tuple) -> dict:
    """fp8_linear_fwd's inputs by name."""
    return dict(zip((a.name for a in torch.ops.turbo_inductor.fp8_linear_fwd.default._schema.arguments), inputs))


def _saves(inputs: tuple, saved: tuple) -> tuple:
    """What the backward reads: the forward's saved transposes, with x^T the input where it was handed one."""
    arguments = _arguments(inputs)
    x_t = arguments["x_t"]
    if saves_x_t(arguments["recipe"], arguments["weight_grad"]) and _handed(x_t):
        return (x_t, arguments["x_t_scale"], *saved[2:])
    return saved


@kernel_op("fp8_linear_inference", (QUANTIZE_KERNEL, GEMM_KERNEL), symbolic_sizes=False)
def fp8_linear_inference(
    x: Tensor,
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    recipe: str,
    impl: str = "auto",
    x_q: Optional[Tensor] = None,
    x_scale: Optional[Tensor] = None,
    w_q: Optional[Tensor] = None,
    w_scale: Optional[Tensor] = None,
) -> Tensor:
    """The forward alone, writing no operands for a backward.

    W comes as ``weight`` or as :func:`quantize_weight`'s ``w_q``, ``w_scale``."""
    return _forward(x, weight, bias, recipe, impl, False, x_q, x_scale, w_q, w_scale)[0]


@fp8_linear_inference.register_fake
def _(x, weight, bias, recipe, impl="auto", x_q=None, x_scale=None, w_q=None, w_scale=None):
    _check("fp8_linear", x, weight, bias, recipe, x_q, x_scale, w_q, w_scale)
    return x.new_empty(x.shape[:-1] + ((weight if weight is not None else w_q).shape[0],))


@kernel_op("fp8_linear_bwd", (QUANTIZE_KERNEL, GEMM_KERNEL), symbolic_sizes=False)
def fp8_linear_bwd(
    dy: Tensor,
    x: Optional[Tensor],
    weight: Optional[Tensor],
    x_t: Tensor,
    x_t_scale: Tensor,
    w_t: Tensor,
    w_t_scale: Tensor,
    recipe: str,
    impl: str = "auto",
    weight_dtype: Optional[torch.dtype] = None,
) -> tuple[Tensor, Tensor]:
    """(dx, dweight). ``weight`` may be None where W^T was saved. dW is in ``weight_dtype``, W's: by default the
    weight's where given, else dy's."""
    _check_backward(dy, x, weight, w_t, w_t_scale, recipe, weight_dtype)
    r, (e4m3, grad_dtype) = RECIPES[recipe], recipe_formats(recipe, dy.device)
    dweight_dtype = _dweight_dtype(dy, weight, weight_dtype)
    n, k = _weight_shape(dy, weight, w_t)
    dy2 = dy.reshape(-1, n)
    dx_shape = dy.shape[:-1] + (k,)
    wgrad = _wgrad(x, x_t, recipe)
    if dy2.shape[0] == 0:
        return dy.new_zeros(dx_shape), dy.new_zeros((n, k) if wgrad else 0, dtype=dweight_dtype)
    # dy^T only for an FP8 wgrad. A weight wanting no gradient gets an empty one.
    if wgrad and not r.high_precision_wgrad:
        dy_q, dy_t = quantize_operand_both(dy2, r.activation_block, grad_dtype, r, impl)
    else:
        dy_q = quantize_operand(dy2, r.activation_block, grad_dtype, r, impl)
    if w_t.dim() != 2:  # no W^T saved (save_weight_t=False): quantize it from W, by its scales where they were saved
        given = w_t_scale if w_t_scale.dim() == 2 else None
        w_t, w_t_scale = quantize_operand(weight, r.weight_block, e4m3, r, impl, transposed=True, scale_t=given)
    dx = _gemm(dy_q, (w_t, w_t_scale), dy.dtype, impl)
    if not wgrad:
        dweight = dy.new_empty(0, dtype=dweight_dtype)
    elif r.high_precision_wgrad:
        dweight = (dy2.t() @ x.reshape(-1, k)).to(dweight_dtype)
    else:
        operands = (*dy_t, x_t, x_t_scale)
        writes = registry.has_capability(GEMM_KERNEL, dy.device, impl, registry.WRITES_FLOAT32, *operands)
        gemm_dtype = dweight_dtype if dweight_dtype != torch.float32 or writes else dy.dtype
        dweight = _gemm(dy_t, (x_t, x_t_scale), gemm_dtype, impl).to(dweight_dtype)
    return dx.view(dx_shape), dweight


def _dweight_dtype(dy: Tensor, weight: Optional[Tensor], weight_dtype: Optional[torch.dtype]) -> torch.dtype:
    return weight_dtype or (weight.dtype if weight is not None else dy.dtype)


def _weight_shape(dy: Tensor, weight: Optional[Tensor], w_t: Tensor) -> tuple[int, int]:
    """W's [N, K]: the weight's, or where none is given, from dy and the saved W^T [K, N]."""
    return tuple(weight.shape) if weight is not None else (dy.shape[-1], w_t.shape[0])


def _wgrad(x: Optional[Tensor], x_t: Tensor, recipe: str) -> bool:
    """Whether the forward saved the wgrad's operand: x for a high-precision wgrad, else x^T quantized.

    It saves none for a weight wanting no gradient."""
    return x is not None if keeps_x(recipe) else x_t.dim() == 2


def _check_backward(
    dy: Tensor,
    x: Optional[Tensor],
    weight: Optional[Tensor],
    w_t: Tensor,
    w_t_scale: Tensor,
    recipe: str,
    weight_dtype: Optional[torch.dtype],
) -> None:
    op = "fp8_linear_bwd"
    check_recipe(op, recipe)
    check(
        weight is not None or w_t.dim() == 2,
        op,
        lambda: "weight may be None only where the forward saved W^T (w_t [K, N]): give the weight",
    )
    n, k = _weight_shape(dy, weight, w_t)
    check_float(op, "dy", dy)
    check(
        dy.dim() >= 1 and dy.shape[-1] == n,
        op,
        lambda: f"dy must be [..., {n}], got {list(dy.shape)}",
    )
    dweight_dtype = _dweight_dtype(dy, weight, weight_dtype)
    check(
        dweight_dtype in (dy.dtype, torch.float32) and (weight is None or weight.dtype == dweight_dtype),
        op,
        lambda: (
            f"W's dtype must be dy's ({dy.dtype}) or float32, the weight's where given; got weight_dtype "
            f"{weight_dtype}, weight {None if weight is None else weight.dtype}"
        ),
    )
    check(
        w_t.dim() != 2 or tuple(w_t.shape) == (k, n),
        op,
        lambda: f"w_t must be W^T, [{k}, {n}], got {list(w_t.shape)}",
    )
    if w_t.dim() != 2 and w_t_scale.dim() == 2:  # W^T's scales alone, saved by the forward
        scales = scale_shape(k, n, *kernel_block(RECIPES[recipe].weight_block, n, k))
        check(
            tuple(w_t_scale.shape) == scales,
            op,
            lambda: (
                f"w_t_scale must be W^T's scales, {list(scales)}, or empty, where w_t is; got {list(w_t_scale.shape)}"
            ),
        )
    check_saved_x(op, x, recipe)
    if x is not None:
        check(x.shape[-1] == k, op, lambda: f"x must be [..., {k}] for a weight of [{n}, {k}], got {list(x.shape)}")


@fp8_linear_bwd.register_fake
def _(dy, x, weight, x_t, x_t_scale, w_t, w_t_scale, recipe, impl="auto", weight_dtype=None):
    _check_backward(dy, x, weight, w_t, w_t_scale, recipe, weight_dtype)
    n, k = _weight_shape(dy, weight, w_t)
    dweight = dy.new_empty((n, k) if _wgrad(x, x_t, recipe) else 0, dtype=_dweight_dtype(dy, weight, weight_dtype))
    return dy.new_empty(dy.shape[:-1] + (k,)), dweight


register_linear_autograd(
    fp8_linear_fwd,
    fp8_linear_bwd,
    keeps_x=lambda recipe, weight: keeps_x(recipe) and weight.requires_grad,
    saves=_saves,
    keeps_weight=_requantizes_weight,
    passes_weight_dtype=True,
)


@composite_op("fp8_linear")
def fp8_linear(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    recipe: str,
    impl: str = "auto",
    x_q: Optional[Tensor] = None,
    x_scale: Optional[Tensor] = None,
    save_weight_t: bool = True,
    x_t: Optional[Tensor] = None,
    x_t_scale: Optional[Tensor] = None,
) -> Tensor:
    # Decided at decomposition, under autograd: AOTAutograd traces training and inference graphs apart.
    wants_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))
    if wants_grad:
        return fp8_linear_fwd(
            x,
            weight,
            bias,
            recipe,
            impl,
            x_q=x_q,
            x_scale=x_scale,
            weight_grad=weight.requires_grad,
            save_weight_t=save_weight_t,
            x_t=x_t,
            x_t_scale=x_t_scale,
        )[0]
    if inductor_config.freezing:
        # W's quantization as a node of its own: constant folding runs it once (docs/ops.md, "Freezing").
        _check("fp8_linear", x, weight, bias, recipe, x_q, x_scale)
        w_q, w_scale = quantize_weight(weight, recipe, impl)
        return fp8_linear_inference(x, None, bias, recipe, impl, x_q=x_q, x_scale=x_scale, w_q=w_q, w_scale=w_scale)
    return fp8_linear_inference(x, weight, bias, recipe, impl, x_q=x_q, x_scale=x_scale)


def can_rewrite(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> bool:
    """Whether ``F.linear(x, weight, bias)`` (fake tensors) can run as an FP8 linear, forward and backward."""
    return (
        x.dtype in SUPPORTED_FLOAT_DTYPES
        and weight.dim() == 2
        and weight.dtype == weight_dtype_for(x, weight)
        and x.dim() >= 1
        and x.shape[-1] == weight.shape[1]
        and isinstance(weight.shape[0], int)
        and isinstance(weight.shape[1], int)
        and weight.shape[0] % ALIGNMENT == 0
        and weight.shape[1] % ALIGNMENT == 0
        and (bias is None or (bias.shape == (weight.shape[0],) and bias.dtype == x.dtype))
        and weight.device == x.device
        and all(registry.available_on(k, x.device) for k in (QUANTIZE_KERNEL, GEMM_KERNEL))
    )


class FP8LinearNode(OpNode):
    op = fp8_linear
    kernels = (QUANTIZE_KERNEL, GEMM_KERNEL)
