"""Implementations over PyTorch's symmetric memory (``torch.distributed._symmetric_memory``): buffers that every rank
of a group maps into its GPU's address space (peer access over NVLink / xGMI), read and written by kernels
directly, without NCCL. Point-to-point copies and loads only: never NVLink multicast (``multimem``), which the lent machines
disable and this project does not use."""
from __future__ import annotations

import torch


def unavailable_reason(device: torch.device) -> str | None:
    if device.type != "cuda":
        return "symmetric memory needs a GPU"
    if not torch.distributed.is_available():
        return "this torch has no torch.distributed"
    from torch.distributed import _symmetric_memory as symm_mem

    if not hasattr(symm_mem, "empty"):
        return "this torch has no torch.distributed._symmetric_memory.empty"
    return None
