"""GEMM, then all-reduce through functional collectives: the semantics of ``gemm_allreduce``.
Traced, it is Inductor's program for the unfused spelling. So the rewrite is never slower than Inductor."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import registry
from ..registry import implementation
from . import unavailable_reason

registry.collective("gemm_allreduce_fwd", "gemm_allreduce_bwd")


def start_all_reduce(t: torch.Tensor, group_name: str) -> torch.Tensor:
    """The sum of ``t`` over the group, issued but not waited for (see ``wait``)."""
    return torch.ops._c10d_functional.all_reduce(t, "sum", group_name)


def wait(t: torch.Tensor) -> torch.Tensor:
    return torch.ops._c10d_functional.wait_tensor(t)


def weight_grad(g: torch.Tensor, x: torch.Tensor | None, weight: torch.Tensor) -> torch.Tensor:
    """``g^T @ x``, or an empty tensor without x. A frozen weight skips the wgrad GEMM."""
    return g.t() @ x if x is not None else weight.new_empty(0)


@implementation("gemm_allreduce_fwd", "reference", priority=0, unavailable_reason=unavailable_reason)
def gemm_allreduce_fwd(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, group_name: str
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` summed over the group's ranks; ``x [M, K]``, ``weight [N, K]``."""
    return wait(start_all_reduce(F.linear(x, weight, bias), group_name))


@implementation("gemm_allreduce_bwd", "reference", priority=0, unavailable_reason=unavailable_reason)
def gemm_allreduce_bwd(dy: torch.Tensor, x: torch.Tensor | None, weight: torch.Tensor, group_name: str):
    """Sums ``dy`` over the ranks into ``g``, as torch's all-reduce backward does.
    Returns ``(g @ weight, g^T @ x, g.sum(0))``; the wgrad is empty without x."""
    g = wait(start_all_reduce(dy, group_name))
    return g @ weight, weight_grad(g, x, weight), g.sum(0)
