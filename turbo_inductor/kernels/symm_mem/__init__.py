"""Implementations over PyTorch's symmetric memory: buffers that every rank of a group maps.
Kernels copy and load over NVLink or xGMI, without NCCL. They never use NVLink multicast (``multimem``)."""

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
    """``(handle, tensors)``: a symmetric tensor of ``shape``, and every rank's copy as mapped here.
    ``tensors[handle.rank]`` is the local allocation. A collective: every rank makes the same calls in order."""
    from torch.distributed import _symmetric_memory as symm_mem

    with warnings.catch_warnings():  # needed on older torch; a deprecated no-op on newer
        warnings.simplefilter("ignore", FutureWarning)
        symm_mem.enable_symm_mem_for_group(group_name)
    own = symm_mem.empty(*shape, dtype=dtype, device=device)
    handle = symm_mem.rendezvous(own, group_name)
    return handle, [
        own if peer == handle.rank else handle.get_buffer(peer, own.shape, dtype) for peer in range(handle.world_size)
    ]
