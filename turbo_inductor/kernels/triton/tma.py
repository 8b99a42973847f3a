"""Tensor descriptors (TMA, the Tensor Memory Accelerator of NVIDIA Hopper and newer): which devices and operands
the kernels that load through them take, and the descriptors themselves. Triton's interpreter runs them on CPU.

Launches with descriptors are not traced into compiled graphs: torch's static launcher takes no descriptor argument.
"""

from __future__ import annotations

import importlib.util

import torch
from torch._subclasses.fake_tensor import FakeTensor

from . import unavailable_reason

# A descriptor's base address and every stride but the last are multiples of 16 bytes.
ALIGNMENT = 16


def tma_unavailable_reason(device: torch.device) -> str | None:
    """None where kernels can load through tensor descriptors on ``device``, else why not."""
    reason = unavailable_reason(device)
    if reason is not None:
        return reason
    if importlib.util.find_spec("triton.tools.tensor_descriptor") is None:
        return "this Triton has no host-side tensor descriptors (triton.tools.tensor_descriptor)"
    if device.type == "cuda":
        if torch.version.hip is not None:
            return "tensor descriptors (TMA) are NVIDIA's, not on ROCm"
        major, minor = torch.cuda.get_device_capability(device)
        if major < 9:
            return f"tensor descriptors (TMA) need compute capability 9.0 or newer, this GPU has {major}.{minor}"
    return None


def tma_reason(*operands: tuple[str, torch.Tensor]) -> str | None:
    """None where each named operand can be read through a descriptor, else why not: its last dimension contiguous,
    the other strides and its address 16-byte aligned."""
    for name, t in operands:
        size = t.element_size()
        if t.stride(-1) != 1 or any(stride * size % ALIGNMENT for stride in t.stride()[:-1]):
            return (
                f"tensor descriptors need {name}'s last dimension contiguous and its other strides multiples of "
                f"{ALIGNMENT} bytes, got strides {list(t.stride())} of {t.dtype}"
            )
        if not (t.is_meta or isinstance(t, FakeTensor)) and t.data_ptr() % ALIGNMENT:
            return f"tensor descriptors need {name}'s address {ALIGNMENT}-byte aligned"
    return None


def descriptor(t: torch.Tensor, block_shape: list[int]):
    """A descriptor of ``t`` whose loads are tiles of ``block_shape``; out of ``t`` they read zeros."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor.from_tensor(t, block_shape)
