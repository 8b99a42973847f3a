"""Implementations over PyTorch's symmetric memory (``torch.distributed._symmetric_memory``): buffers that every rank
of a group maps into its GPU's address space (peer access over NVLink / xGMI), read and written by kernels
directly, without NCCL. Point-to-point copies and loads only: never NVLink multicast (``multimem``), which the lent
machines disable and this project does not use."""

from __future__ import annotations

import warnings

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


def symmetric_tensor(
    shape: tuple, dtype: torch.dtype, device: torch.device, group_name: str
) -> tuple[object, list[torch.Tensor]]:
    """``(handle, tensors)``: a tensor of ``shape`` in symmetric memory, its handle (``rank``, ``barrier``, ...), and
    every rank's tensor of the group as mapped here (``tensors[handle.rank]`` is the allocation). A collective
    (``rendezvous``): every rank of the group makes the same calls in the same order."""
    from torch.distributed import _symmetric_memory as symm_mem

    with warnings.catch_warnings():  # needed on older torch, deprecated (a no-op) on newer
        warnings.simplefilter("ignore", FutureWarning)
        symm_mem.enable_symm_mem_for_group(group_name)
    own = symm_mem.empty(*shape, dtype=dtype, device=device)
    handle = symm_mem.rendezvous(own, group_name)
    return handle, [
        own if peer == handle.rank else handle.get_buffer(peer, own.shape, dtype) for peer in range(handle.world_size)
    ]
