"""What decides the kernels compiled code calls, beyond the package's sources and the options.

The torch and Triton versions, the GPU, the native extension's build and the registry's implementations.
The backend's cache key covers them (``passes/manager.py``); ``python -m turbo_inductor.info`` prints them.
"""

from __future__ import annotations

import hashlib
import importlib.metadata

import torch
import triton

from .kernels import native, registry


def device() -> tuple[torch.device, str]:
    """The device the ops run on here, and its description: the current GPU, else the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu"), "cpu (no GPU visible to torch)"
    gpu = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(gpu)
    if torch.version.hip is not None:
        return gpu, f"{gpu} {props.name} ({props.gcnArchName}, ROCm {torch.version.hip})"
    return gpu, f"{gpu} {props.name} (sm_{props.major}{props.minor}, CUDA {torch.version.cuda})"


def identity() -> str:
    """A hash of the versions, the device, the native build and the registry's implementations on the devices.
    A compiled graph loaded from the cache is valid only where it is unchanged."""
    gpu, description = device()
    devices = [torch.device("cpu")] + ([gpu] if gpu.type != "cpu" else [])
    parts = (
        f"torch {torch.__version__}",
        f"triton {triton.__version__}",
        description,
        f"native {native.build_hash()}",
        f"implementations {registry.fingerprint(devices)}",
    )
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution``, None where it is not installed. Read from its metadata, not by
    importing it: torchao's CPU build warns about GPU libraries on import."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
