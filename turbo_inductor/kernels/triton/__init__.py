"""Triton implementations. On CPU they run only under ``TRITON_INTERPRET=1`` (set before import)."""

from __future__ import annotations

import contextlib
import os

import torch

from .. import registry

# Read once, when this package loads: triton.jit picks the interpreter at decoration time, which is when the kernel
# modules of this package load, so a later change of the variable does not change what our kernels are.
_INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"


def unavailable_reason(device: torch.device) -> str | None:
    """None where our Triton kernels can run on ``device``, else why not."""
    try:
        import triton  # noqa: F401  (installed?)
    except ImportError:
        return "triton is not installed"
    if device.type == "cuda":  # NVIDIA and ROCm builds of torch both say "cuda"
        return None if torch.cuda.is_available() else "torch has no usable GPU"
    if device.type == "cpu":
        return None if _INTERPRETING else "Triton runs on CPU only under TRITON_INTERPRET=1"
    return f"no Triton backend for device type {device.type!r}"


def traceable(device: torch.device) -> bool:
    """Whether a launch on ``device`` can be traced into a compiled graph. Not on CPU: the interpreter needs real
    data, and Inductor cannot launch a CPU Triton kernel."""
    return device.type != "cpu"


def launch(kernel):
    """``kernel``, to launch as ``launch(kernel)[grid](...)``. While an op body is traced for Inductor
    (``registry.tracing``), it goes through ``wrap_triton`` so that the launch becomes a graph node Inductor
    compiles and launches itself; otherwise the kernel is launched directly (``wrap_triton``'s dispatch costs
    about a millisecond per eager call)."""
    return torch.library.wrap_triton(kernel) if registry.is_tracing() else kernel


def interpreting() -> bool:
    """True when kernels run in Triton's CPU interpreter (whose bf16 dot and fp8 stores are unreliable)."""
    return _INTERPRETING


def on_device(device: torch.device):
    """Triton launches on the current CUDA device: a context that switches to ``device`` when it differs."""
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        return torch.cuda.device(device.index)
    return contextlib.nullcontext()
