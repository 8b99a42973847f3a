"""Vendor BLAS implementations: cuBLASLt or hipBLASLt, reached through torch. Each takes what its library takes."""

from __future__ import annotations

import torch


def unavailable_reason(device: torch.device) -> str | None:
    if device.type != "cuda" or not torch.cuda.is_available():
        return "the vendor BLAS runs on GPUs only"
    if not hasattr(torch, "_scaled_mm"):
        return "this torch has no torch._scaled_mm"
    return None
