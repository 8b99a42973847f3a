"""Cross-entropy's forward and logits gradient in Triton. Semantics: ``..reference.cross_entropy``.
Forward: one program per row, an online logsumexp over the row in chunks, then the target's logit. Gradient: one
program per row and column block, the row's lse, target and dloss loaded once. See docs/kernels.md, Cross-entropy.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..registry import implementation
from . import launch, on_device, traceable, unavailable_reason
from .access_analysis import writes

# Columns per step of the row loop; 8 warps at 32 bf16 elements (four 16-byte vectors) per thread. Qwen2.5's
# 4096 x 152064 logits on the H200: 414 us in the training step, 447 at 4096 columns (16 per thread).
BLOCK_V = 8192
ELEMENTS_PER_WARP = 1024
# Columns per gradient program, at 16 per thread. A 2-D grid gives each program its row from its id: Inductor's flat
# pass over the same math divides every element's index by V. Same logits: 650 us in the step, Inductor's 978.
GRAD_BLOCK_V = 2048
GRAD_ELEMENTS_PER_WARP = 512


@writes("LOSS", "LSE")
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


@writes("GRAD")
@triton.jit
def _cross_entropy_bwd_kernel(LOGITS, TARGET, LSE, DLOSS, GRAD, stride_row, V, ignore_index, BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    in_row = cols < V
    target = tl.load(TARGET + row)
    x = tl.load(LOGITS + row * stride_row + cols, mask=in_row, other=0.0).to(tl.float32)
    grad = (tl.exp(x - tl.load(LSE + row)) - tl.where(cols == target, 1.0, 0.0)) * tl.load(DLOSS + row)
    # A select, not a multiply: an ignored row's inf or NaN logits must not reach the gradient.
    grad = tl.where(target == ignore_index, 0.0, grad)
    tl.store(GRAD + row * V + cols, grad.to(GRAD.dtype.element_ty), mask=in_row)


@implementation("cross_entropy_bwd", "triton", priority=20, unavailable_reason=unavailable_reason, traceable=traceable)
def cross_entropy_bwd(
    logits: torch.Tensor, target: torch.Tensor, lse: torch.Tensor, dloss: torch.Tensor, ignore_index: int
) -> torch.Tensor:
    """dlogits; see ``..reference.cross_entropy.cross_entropy_bwd``. logits' rows are contiguous."""
    n_rows, vocab = logits.shape
    grad = torch.empty((n_rows, vocab), dtype=logits.dtype, device=logits.device)
    block = min(GRAD_BLOCK_V, triton.next_power_of_2(vocab))
    with on_device(logits.device):
        launch(_cross_entropy_bwd_kernel)[(n_rows, triton.cdiv(vocab, block))](
            logits,
            target,
            lse,
            dloss,
            grad,
            logits.stride(0),
            vocab,
            ignore_index,
            BLOCK_V=block,
            num_warps=max(1, min(4, block // GRAD_ELEMENTS_PER_WARP)),
        )
    return grad
