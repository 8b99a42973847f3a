"""Implementations that overlap torch GEMMs with process-group collectives. NCCL or RCCL on GPUs, gloo on CPU."""

from __future__ import annotations

import torch


def unavailable_reason(device: torch.device) -> str | None:
    return None if torch.distributed.is_available() else "this torch has no torch.distributed"
