"""GEMM then all-reduce, one after the other, through functional collectives (``_c10d_functional``): the semantics
of ``gemm_allreduce``. Traced into a compiled graph it is the program Inductor compiles for the unfused spelling
(the GEMM, then the all-reduce and its wait), so the rewrite is never slower than Inductor with it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import registry
from ..registry import implementation
from . import unavailable_reason

registry.collective("gemm_allreduce_fwd", "gemm_allreduce_bwd")


def start_all_reduce(t: torch.Tensor, group_name: str) -> torch.Tensor:
    """The sum of ``t`` over the group's ranks, issued and not yet waited for (``wait``)."""
    return torch.ops._c10d_functional.all_reduce(t, "sum", group_name)


def wait(t: torch.Tensor) -> torch.Tensor:
    return torch.ops._c10d_functional.wait_tensor(t)


def weight_grad(g: torch.Tensor, x: torch.Tensor | None, weight: torch.Tensor) -> torch.Tensor:
    """``g^T @ x``, or an empty tensor where x was not saved (a weight that wants no gradient: no wgrad GEMM)."""
    return g.t() @ x if x is not None else weight.new_empty(0)


@implementation("gemm_allreduce_fwd", "reference", priority=0, unavailable_reason=unavailable_reason)
def gemm_allreduce_fwd(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, group_name: str
) -> torch.Tensor:
    """``sum over the group's ranks of F.linear(x, weight, bias)``; x [M, K], weight [N, K]."""
    return wait(start_all_reduce(F.linear(x, weight, bias), group_name))


@implementation("gemm_allreduce_bwd", "reference", priority=0, unavailable_reason=unavailable_reason)
def gemm_allreduce_bwd(dy: torch.Tensor, x: torch.Tensor | None, weight: torch.Tensor, group_name: str):
    """The all-reduce's backward (torch's: the gradients are all-reduced too), then the GEMMs':
    ``g = sum over ranks of dy``; returns ``(g @ weight, g^T @ x, g summed over rows)`` (``weight_grad``: empty
    without x)."""
    g = wait(start_all_reduce(dy, group_name))
    return g @ weight, weight_grad(g, x, weight), g.sum(0)
