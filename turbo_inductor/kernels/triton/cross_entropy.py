"""Cross-entropy's forward in Triton. Semantics: ``..reference.cross_entropy``.
One program per row: an online logsumexp over the row in chunks, then the target's logit. See docs/kernels.md,
Cross-entropy.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..registry import implementation
from . import launch, on_device, traceable, unavailable_reason

# Columns per step of the row loop; 8 warps at 16 bf16 elements (two 16-byte vectors) per thread.
BLOCK_V = 4096
ELEMENTS_PER_WARP = 512


@triton.jit
def _cross_entropy_fwd_kernel(LOGITS, TARGET, LOSS, LSE, stride_row, V, ignore_index, BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = LOGITS + row * stride_row
    cols = tl.arange(0, BLOCK_V)
    # The running maximum is one number per row: each element then takes one exp.
    row_max = tl.zeros([], tl.float32) - float("inf")
    total = tl.zeros([], tl.float32)
    for start in range(0, V, BLOCK_V):
        x = tl.load(base + start + cols, mask=start + cols < V, other=-float("inf")).to(tl.float32)
        new_max = tl.maximum(row_max, tl.max(x, 0))
        total = total * tl.exp(row_max - new_max) + tl.sum(tl.exp(x - new_max), 0)
        row_max = new_max
    lse = row_max + tl.log(total)
    target = tl.load(TARGET + row)
    in_range = (target >= 0) & (target < V)
    picked = tl.load(base + tl.where(in_range, target, 0)).to(tl.float32)
    picked = tl.where(in_range, picked, float("nan"))
    tl.store(LOSS + row, tl.where(target == ignore_index, 0.0, lse - picked))
    tl.store(LSE + row, lse)


@implementation("cross_entropy_fwd", "triton", priority=20, unavailable_reason=unavailable_reason, traceable=traceable)
def cross_entropy_fwd(
    logits: torch.Tensor, target: torch.Tensor, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, lse)``; see ``..reference.cross_entropy.cross_entropy_fwd``. logits' rows are contiguous."""
    n_rows, vocab = logits.shape
    loss = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    lse = torch.empty_like(loss)
    block = min(BLOCK_V, triton.next_power_of_2(vocab))
    with on_device(logits.device):
        launch(_cross_entropy_fwd_kernel)[(n_rows,)](
            logits,
            target,
            loss,
            lse,
            logits.stride(0),
            vocab,
            ignore_index,
            BLOCK_V=block,
            num_warps=max(1, min(8, block // ELEMENTS_PER_WARP)),
        )
    return loss, lse
