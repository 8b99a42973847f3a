"""Models the tests and benchmarks share, written as real training code writes them. Weights are random."""

import functools

import torch


@functools.cache
def scaled_mm_takes_row_scales(device: str) -> bool:
    """Whether this torch's ``torch._scaled_mm`` takes per-row scales on ``device`` (on CPU, torch 2.13's does and
    2.11's does not): whether hand-written rowwise FP8 and torchao's rowwise recipes can run there."""
    a = torch.ones(16, 16, device=device).to(torch.float8_e4m3fn)
    rows = torch.ones(16, 1, device=device)
    try:
        torch._scaled_mm(a, a.t(), scale_a=rows, scale_b=rows.t(), out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError):
        return False
    return True
