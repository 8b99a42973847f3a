"""Implementations over PyTorch's symmetric memory (``torch.distributed._symmetric_memory``): buffers that every rank
of a group maps into its GPU's address space (peer access over NVLink / xGMI), read and written by kernels
directly, without NCCL. Point-to-point loads only: never NVLink multicast (``multimem``), which the lent machines
disable and this project does not use."""
from __future__ import annotations

import torch


def unavailable_reason(device: torch.device) -> str | None:
    if device.type != "cuda":
        return "symmetric memory needs a GPU"
    if not torch.distributed.is_available():
        return "this torch has no torch.distributed"
    if not hasattr(torch.ops.symm_mem, "one_shot_all_reduce_copy_out"):
        return "this torch has no symm_mem.one_shot_all_reduce_copy_out"
    return None
