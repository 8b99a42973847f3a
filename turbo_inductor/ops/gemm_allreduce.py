"""GEMM + all-reduce: ``y = sum over a group's ranks of F.linear(x, weight, bias)``, ending a row-parallel linear.

Ops in ``torch.ops.turbo_inductor``:
  gemm_allreduce(x, weight, bias, group_name, impl) -> y                     custom op; backward: gemm_allreduce_bwd
  gemm_allreduce_bwd(dy, x, weight, group_name, impl) -> (dx, dw, db)        custom op (not differentiable)
  linear_dgrad_allreduce(x, weight, bias, group_name, impl) -> y             F.linear; backward: the op below
  linear_dgrad_allreduce_bwd(dy, x, weight, group_name, impl) -> (dx, dw)    dx = sum over ranks of dy @ weight

``group_name`` is ``ProcessGroup.group_name``, as functional collectives carry it.
The backward is torch's for the unfused graph. A weight that wants no gradient gets none: dw is empty.
An eager call first checks that the ranks agree on the shapes; every rank raises where they do not. A compiled
graph checks once, at its first call (``turbo_inductor/ranks.py``).
Implementations and why: ``docs/ops.md``, "GEMM + all-reduce".
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor

from ..kernels import registry
from ..kernels.reference.gemm_allreduce import weight_grad
from .library import SUPPORTED_FLOAT_DTYPES, check, check_linear, kernel_op, register_linear_autograd
from .node import OpNode

FWD_KERNEL, BWD_KERNEL = "gemm_allreduce_fwd", "gemm_allreduce_bwd"


def process_group(op: str, group_name: str):
    check(
        dist.is_available() and dist.is_initialized(),
        op,
        lambda: "torch.distributed is not initialized (call init_process_group first)",
    )
    try:
        return dist.distributed_c10d._resolve_process_group(group_name)
    except Exception as error:  # noqa: BLE001  (its error types differ across torch versions)
        raise ValueError(f"turbo_inductor.{op}: no process group named {group_name!r} ({error})") from None


def check_ranks_agree(op: str, group, sizes: list[int], device: torch.device) -> None:
    """Raise on every rank unless all ranks of ``group`` pass the same ``sizes``.

    One all-reduce (MAX) of the sizes and their negatives gives each rank the group's extremes."""
    local = torch.tensor(sizes + [-s for s in sizes], dtype=torch.int64, device=device)
    extremes = local.clone()
    dist.all_reduce(extremes, op=dist.ReduceOp.MAX, group=group)
    largest, smallest = extremes[: len(sizes)].tolist(), [-s for s in extremes[len(sizes) :].tolist()]
    check(
        largest == smallest,
        op,
        lambda: (
            f"the ranks of group {group.group_name!r} disagree on the shapes: this rank (rank {dist.get_rank(group)}) "
            f"has {sizes}, the group ranges from {smallest} to {largest} (every rank must call it with the same shapes)"
        ),
    )


def _checked_group(op: str, group_name: str, sizes: list, device: torch.device) -> None:
    """Check that the group exists and, in an eager call, that its ranks agree on the sizes.

    A traced op does not: its graph checks at its first call (``docs/ops.md``, "Ranks that disagree")."""
    group = process_group(op, group_name)
    if not registry.is_tracing():
        check_ranks_agree(op, group, [int(s) for s in sizes], device)


@kernel_op("gemm_allreduce", (FWD_KERNEL,))
def gemm_allreduce(x: Tensor, weight: Tensor, bias: Optional[Tensor], group_name: str, impl: str = "auto") -> Tensor:
    check_linear("gemm_allreduce", x, weight, bias)
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    _checked_group("gemm_allreduce", group_name, [x2.shape[0], weight.shape[0], x2.shape[1]], x.device)
    out = registry.select(FWD_KERNEL, x.device, impl)(x2, weight.contiguous(), bias, group_name)
    return out.view(x.shape[:-1] + (weight.shape[0],))


@gemm_allreduce.register_fake
def _(x, weight, bias, group_name, impl="auto"):
    check_linear("gemm_allreduce", x, weight, bias)
    return x.new_empty(x.shape[:-1] + (weight.shape[0],))


def _check_backward(op: str, dy: Tensor, x: Optional[Tensor], weight: Tensor) -> tuple[Tensor, Optional[Tensor]]:
    """dy [..., N] and x [..., K] as matrices, checked against weight. x is None for a frozen weight."""
    check(
        dy.dim() >= 1 and dy.shape[-1] == weight.shape[0] and dy.dtype == weight.dtype,
        op,
        lambda: f"dy must be [..., {weight.shape[0]}] in {weight.dtype}, got {list(dy.shape)} {dy.dtype}",
    )
    if x is not None:
        check_linear(op, x, weight, None)
        check(
            x.shape[:-1] == dy.shape[:-1],
            op,
            lambda: f"x {list(x.shape)} and dy {list(dy.shape)} must have the same leading dimensions",
        )
    return (
        dy.reshape(-1, weight.shape[0]).contiguous(),
        None if x is None else x.reshape(-1, x.shape[-1]).contiguous(),
    )


@kernel_op("gemm_allreduce_bwd", (BWD_KERNEL,))
def gemm_allreduce_bwd(
    dy: Tensor, x: Optional[Tensor], weight: Tensor, group_name: str, impl: str = "auto"
) -> tuple[Tensor, Tensor, Tensor]:
    dy2, x2 = _check_backward("gemm_allreduce_bwd", dy, x, weight)
    _checked_group("gemm_allreduce_bwd", group_name, [dy2.shape[0], weight.shape[0], weight.shape[1]], dy.device)
    dx, dweight, dbias = registry.select(BWD_KERNEL, dy.device, impl)(dy2, x2, weight.contiguous(), group_name)
    return dx.view(dy.shape[:-1] + (weight.shape[1],)), dweight, dbias


@gemm_allreduce_bwd.register_fake
def _(dy, x, weight, group_name, impl="auto"):
    dy2, x2 = _check_backward("gemm_allreduce_bwd", dy, x, weight)
    dx = dy.new_empty(dy.shape[:-1] + (weight.shape[1],))
    return dx, weight_grad(dy2, x2, weight), weight.new_empty(weight.shape[0])


def _weight_grad(group_name: str, weight: Tensor) -> bool:
    """Whether the backward takes x: only a weight wanting a gradient needs it."""
    return weight.requires_grad


register_linear_autograd(gemm_allreduce, gemm_allreduce_bwd, keeps_x=_weight_grad)


@kernel_op("linear_dgrad_allreduce", ())
def linear_dgrad_allreduce(
    x: Tensor, weight: Tensor, bias: Optional[Tensor], group_name: str, impl: str = "auto"
) -> Tensor:
    """A column-parallel linear: ``F.linear(x, weight, bias)``, its input gradient summed over the group's ranks.

    The forward runs no collective. The backward runs ``dy @ weight`` and its all-reduce as one op."""
    check_linear("linear_dgrad_allreduce", x, weight, bias)
    process_group("linear_dgrad_allreduce", group_name)
    return torch.nn.functional.linear(x, weight, bias)


@linear_dgrad_allreduce.register_fake
def _(x, weight, bias, group_name, impl="auto"):
    check_linear("linear_dgrad_allreduce", x, weight, bias)
    return x.new_empty(x.shape[:-1] + (weight.shape[0],))


@kernel_op("linear_dgrad_allreduce_bwd", (FWD_KERNEL,))
def linear_dgrad_allreduce_bwd(
    dy: Tensor, x: Optional[Tensor], weight: Tensor, group_name: str, impl: str = "auto"
) -> tuple[Tensor, Tensor]:
    """(dx, dweight): dx = sum over ranks of dy @ weight, by the GEMM + all-reduce kernel on weight^T.

    dweight = dy^T x, empty without x."""
    dy2, x2 = _check_backward("linear_dgrad_allreduce_bwd", dy, x, weight)
    _checked_group(
        "linear_dgrad_allreduce_bwd", group_name, [dy2.shape[0], weight.shape[0], weight.shape[1]], dy.device
    )
    dx = registry.select(FWD_KERNEL, dy.device, impl)(dy2, weight.t(), None, group_name)
    return dx.view(dy.shape[:-1] + (weight.shape[1],)), weight_grad(dy2, x2, weight)


@linear_dgrad_allreduce_bwd.register_fake
def _(dy, x, weight, group_name, impl="auto"):
    dy2, x2 = _check_backward("linear_dgrad_allreduce_bwd", dy, x, weight)
    return dy.new_empty(dy.shape[:-1] + (weight.shape[1],)), weight_grad(dy2, x2, weight)


register_linear_autograd(linear_dgrad_allreduce, linear_dgrad_allreduce_bwd, keeps_x=_weight_grad)


def can_rewrite(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> bool:
    """Whether ``all_reduce(F.linear(x, weight, bias))`` (fake tensors) can run on our op."""
    return (
        x.dtype in SUPPORTED_FLOAT_DTYPES
        and weight.dim() == 2
        and weight.dtype == x.dtype
        and x.dim() >= 1
        and x.shape[-1] == weight.shape[1]
        and weight.device == x.device
        and (bias is None or (bias.shape == (weight.shape[0],) and bias.dtype == x.dtype))
        and all(registry.available_on(k, x.device) for k in (FWD_KERNEL, BWD_KERNEL))
    )


class GemmAllReduceNode(OpNode):
    op = torch.ops.turbo_inductor.gemm_allreduce.default
    kernels = (FWD_KERNEL, BWD_KERNEL)


class LinearDgradAllReduceNode(OpNode):
    op = torch.ops.turbo_inductor.linear_dgrad_allreduce.default
    kernels = (FWD_KERNEL,)  # in its backward
