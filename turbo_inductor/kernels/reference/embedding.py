"""An embedding's lookup and weight gradient in plain PyTorch. They define the semantics.
``dweight[v] = sum of grad's rows whose index is v``, in fp32, rounded once to grad's dtype; the ``padding_idx`` row
and rows no index names are zeros; indices outside [0, V) add nothing. See docs/kernels.md, Embedding.
"""

from __future__ import annotations

import torch

from ..registry import implementation
from . import traced_off_cpu, unavailable_reason


def in_range(indices: torch.Tensor, num_weights: int) -> torch.Tensor:
    return (indices >= 0) & (indices < num_weights)


@implementation(
    "embedding_fwd", "reference", priority=0, unavailable_reason=unavailable_reason, traceable=traced_off_cpu
)
def embedding_fwd(weight: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``weight[indices]``: [*indices.shape, H]."""
    return torch.nn.functional.embedding(indices, weight)


@implementation(
    "embedding_bwd", "reference", priority=0, unavailable_reason=unavailable_reason, traceable=traced_off_cpu
)
def embedding_bwd(grad: torch.Tensor, indices: torch.Tensor, num_weights: int, padding_idx: int) -> torch.Tensor:
    """``dweight`` [num_weights, H] in grad's dtype, from grad [T, H] and indices [T]."""
    keep = in_range(indices, num_weights) & (indices != padding_idx)
    total = grad.new_zeros((num_weights, grad.shape[1]), dtype=torch.float32)
    total.index_add_(0, torch.where(keep, indices, 0).long(), torch.where(keep.unsqueeze(1), grad.float(), 0.0))
    return total.to(grad.dtype)
