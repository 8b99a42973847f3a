"""Implementations that overlap torch's GEMMs with process-group collectives (NCCL/RCCL on GPUs, gloo on CPU)."""

from __future__ import annotations

import torch


def unavailable_reason(device: torch.device) -> str | None:
    return None if torch.distributed.is_available() else "this torch has no torch.distributed"
