"""Cross-entropy's forward and logits gradient in plain PyTorch. They define the semantics.
Per row of logits [N, V], in fp32: ``lse = logsumexp(row)`` and ``loss = lse - row[target]``; a row whose target
is ``ignore_index`` has loss 0, and a target outside [0, V) otherwise gives NaN. The gradient is
``(exp(row - lse) - onehot(target)) * dloss``, zero on ignored rows. See docs/kernels.md, Cross-entropy.
"""

from __future__ import annotations

import torch

from ..registry import implementation
from . import traced_off_cpu, unavailable_reason


def target_logits(logits: torch.Tensor, target: torch.Tensor, ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(picked, valid)``: each row's fp32 logit at its target (NaN outside [0, V)), and whether the row counts."""
    vocab = logits.shape[1]
    valid = target != ignore_index
    in_range = (target >= 0) & (target < vocab)
    picked = logits.gather(1, torch.where(in_range, target, 0).long().unsqueeze(1)).squeeze(1).float()
    return torch.where(in_range | ~valid, picked, float("nan")), valid


@implementation(
    "cross_entropy_fwd", "reference", priority=0, unavailable_reason=unavailable_reason, traceable=traced_off_cpu
)
def cross_entropy_fwd(
    logits: torch.Tensor, target: torch.Tensor, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, lse)``, fp32 [N] each, of logits [N, V] and target [N] (int64)."""
    lse = torch.logsumexp(logits.float(), dim=1)
    picked, valid = target_logits(logits, target, ignore_index)
    return torch.where(valid, lse - picked, 0.0), lse


@implementation(
    "cross_entropy_bwd", "reference", priority=0, unavailable_reason=unavailable_reason, traceable=traced_off_cpu
)
def cross_entropy_bwd(
    logits: torch.Tensor, target: torch.Tensor, lse: torch.Tensor, dloss: torch.Tensor, ignore_index: int
) -> torch.Tensor:
    """dlogits [N, V] in the logits' dtype, from the forward's lse and dloss (fp32 [N] each)."""
    classes = torch.arange(logits.shape[1], device=logits.device)
    softmax = torch.exp(logits.float() - lse.unsqueeze(1))
    grad = (softmax - (classes == target.unsqueeze(1)).float()) * dloss.unsqueeze(1)
    # A select, not a multiply: an ignored row's inf or NaN logits must not reach the gradient.
    return torch.where((target != ignore_index).unsqueeze(1), grad, 0.0).to(logits.dtype)
