"""GEMM then all-reduce, one after the other: the semantics of ``gemm_allreduce`` and the fallback at sizes where
overlapping cannot win. Never traced into a graph (nor is the overlap): both drive a ProcessGroup object, which a
functional graph cannot hold."""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..registry import implementation, never
from . import unavailable_reason


@implementation("gemm_allreduce_fwd", "reference", priority=0, unavailable_reason=unavailable_reason,
                traceable=never)
def gemm_allreduce_fwd(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, group) -> torch.Tensor:
    """``sum over the group's ranks of F.linear(x, weight, bias)``; x [M, K], weight [N, K]."""
    out = F.linear(x, weight, bias)
    dist.all_reduce(out, group=group)
    return out


@implementation("gemm_allreduce_bwd", "reference", priority=0, unavailable_reason=unavailable_reason,
                traceable=never)
def gemm_allreduce_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, group):
    """The all-reduce's backward (torch's: the gradients are all-reduced too), then the GEMMs':
    ``g = sum over ranks of dy``; returns ``(g @ weight, g^T @ x, g summed over rows)``."""
    g = dy.clone()
    dist.all_reduce(g, group=group)
    return g @ weight, g.t() @ x, g.sum(0)
