"""Grouped GEMMs for MoE layers: each group of x's rows (one expert's tokens) times its own weight.

In bf16, fp16 and fp32, forward and backward; FP8 in ``fp8_grouped_mm``.

Ops in ``torch.ops.turbo_inductor``:
  grouped_mm(x, weight, offs, impl, host_offs) -> y       custom op; backward: grouped_mm (dx), grouped_mm_wgrad
  grouped_mm_wgrad(x, dy, offs, transposed, impl, host_offs) -> dweight

x [S, K], rows sorted by group; weight [E, K, N], any strides; offs [E] int32, each group's cumulative end row.
y [S, N], contiguous, in x's dtype: row r of group g is x[r] @ weight[g]. Groups may be empty.
Rows past offs[-1] are zero in y and get a zero gradient. offs values are checked only on CPU.
host_offs: None, or ``copy_to_host(offs)``, which an implementation reading offs on the host reads instead; the
backward reads it too.
dW has weight's layout.
Semantics and why: ``docs/ops.md``, "Grouped GEMMs".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

import torch
from torch import Tensor

from ..kernels import host_copy, registry
from .host_copy import check_host_copy
from .library import SUPPORTED_FLOAT_DTYPES, check, check_float, check_same_device, kernel_op
from .node import OpNode

GROUPED_KERNEL, WGRAD_KERNEL = "grouped_gemm", "grouped_gemm_wgrad"


# ---- checks ---------------------------------------------------------------------------------------------------


def check_grouped(op: str, x: Tensor, weight: Tensor, offs: Tensor, rows=None, host_offs=None) -> None:
    """x [S, K], weight [E, K, N] in x's dtype, offs [E] int32 non-decreasing within [0, S] (checked on CPU).

    ``rows``: S where the GEMM's rows are x's gathered (an MoE layer's tokens in expert order), else x's own.
    ``host_offs``: None or a host copy of offs."""
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
    _check_offs(op, offs, weight.shape[0], x.shape[0] if rows is None else rows)
    check_same_device(op, x=x, weight=weight, offs=offs)
    check_host_copy(op, "host_offs", host_offs, offs)


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


def transposed_layout(weight: Tensor) -> bool:
    """Whether ``weight`` [E, K, N] is the transpose of a contiguous [E, N, K], not itself contiguous.

    Its gradient then takes that layout too."""
    return weight.transpose(-2, -1).is_contiguous() and not weight.is_contiguous()


def in_weight_layout(make: Callable[[Any, Any], Tensor], x: Any, dy: Any, transposed: bool) -> Tensor:
    """dW [E, K, N] = ``make(x, dy)``. With ``transposed``: ``make(dy, x)`` [E, N, K], seen as its transpose."""
    return make(dy, x).transpose(-2, -1) if transposed else make(x, dy)


def empty_weight_gradient(like: Tensor, shape: tuple, transposed: bool) -> Tensor:
    """An uninitialized dW of ``shape`` [E, K, N] in the layout :func:`in_weight_layout` gives."""
    experts, k, n = shape
    return like.new_empty((experts, n, k)).transpose(-2, -1) if transposed else like.new_empty((experts, k, n))


# ---- bf16 / fp16 / fp32 -------------------------------------------------------------------------------------


@kernel_op("grouped_mm", (GROUPED_KERNEL,))
def grouped_mm(
    x: Tensor, weight: Tensor, offs: Tensor, impl: str = "auto", host_offs: Optional[Tensor] = None
) -> Tensor:
    check_grouped("grouped_mm", x, weight, offs, host_offs=host_offs)
    if x.shape[0] == 0:
        return x.new_zeros((0, weight.shape[2]))
    with host_copy.given_host_copy(offs, host_offs):
        return registry.select(GROUPED_KERNEL, x.device, impl)(x, weight, offs, x.dtype)


@grouped_mm.register_fake
def _(x, weight, offs, impl="auto", host_offs=None):
    check_grouped("grouped_mm", x, weight, offs, host_offs=host_offs)
    return x.new_empty((x.shape[0], weight.shape[2]))


@kernel_op("grouped_mm_wgrad", (WGRAD_KERNEL,))
def grouped_mm_wgrad(
    x: Tensor,
    dy: Tensor,
    offs: Tensor,
    transposed: bool = False,
    impl: str = "auto",
    host_offs: Optional[Tensor] = None,
) -> Tensor:
    """dW [E, K, N]: dW[g] = x_g^T dy_g, zero for an empty group.

    Contiguous; with ``transposed``, the transpose of a contiguous [E, N, K] (:func:`transposed_layout`)."""
    _check_wgrad(x, dy, offs, host_offs)
    shape = (offs.shape[0], x.shape[1], dy.shape[1])
    if x.shape[0] == 0:
        return empty_weight_gradient(x, shape, transposed).zero_()
    wgrad = registry.select(WGRAD_KERNEL, x.device, impl)
    with host_copy.given_host_copy(offs, host_offs):
        return in_weight_layout(lambda a, b: wgrad(a, b, offs, x.dtype), x, dy, transposed)


def _check_wgrad(x: Tensor, dy: Tensor, offs: Tensor, host_offs: Optional[Tensor]) -> None:
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
    check_host_copy(op, "host_offs", host_offs, offs)


@grouped_mm_wgrad.register_fake
def _(x, dy, offs, transposed=False, impl="auto", host_offs=None):
    _check_wgrad(x, dy, offs, host_offs)
    return empty_weight_gradient(x, (offs.shape[0], x.shape[1], dy.shape[1]), transposed)


def _grouped_mm_setup(ctx, inputs, output):
    x, weight, offs, impl, host_offs = inputs
    ctx.save_for_backward(x, weight, offs, host_offs)
    ctx.impl = impl


def _grouped_mm_backward(ctx, dy):
    x, weight, offs, host_offs = ctx.saved_tensors
    wants_dx, wants_dweight = ctx.needs_input_grad[:2]
    dx = grouped_mm(dy, weight.transpose(-2, -1), offs, ctx.impl, host_offs) if wants_dx else None
    dweight = grouped_mm_wgrad(x, dy, offs, transposed_layout(weight), ctx.impl, host_offs) if wants_dweight else None
    return dx, dweight, None, None, None


grouped_mm.register_autograd(_grouped_mm_backward, setup_context=_grouped_mm_setup)


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


class GroupedMMNode(OpNode):
    op = torch.ops.turbo_inductor.grouped_mm.default
    kernels = (GROUPED_KERNEL, WGRAD_KERNEL)
