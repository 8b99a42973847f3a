"""Triton implementations. On CPU they run only under ``TRITON_INTERPRET=1``, set before import."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os

import torch
from torch._inductor import config as inductor_config

from .. import registry
from . import access_analysis

# Read once at import: triton.jit picks the interpreter when it decorates a kernel.
# A later change of the variable cannot change the kernels.
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
    """Whether a launch on ``device`` can be traced into a compiled graph. Not on CPU.
    There the interpreter needs real data, and Inductor cannot launch CPU Triton kernels."""
    return device.type != "cpu"


def launch(kernel):
    """``kernel``, to launch as ``launch(kernel)[grid](...)``. In a traced op body it goes through ``wrap_triton``.
    Inductor then compiles and launches it. Eager calls skip the wrapper, which costs about 1 ms."""
    if not registry.is_tracing():
        return kernel
    access_analysis.install()  # torch analyzes each traced launch, several times: once per distinct launch suffices
    return torch.library.wrap_triton(kernel)


def interpreting() -> bool:
    """True when kernels run in Triton's CPU interpreter. Its bf16 dot and fp8 stores are unreliable."""
    return _INTERPRETING


@dataclasses.dataclass(frozen=True)
class DeviceLimits:
    sms: int  # streaming multiprocessors (compute units on AMD)
    max_shared: int  # bytes of shared memory (LDS) one program may use


@functools.cache
def device_limits(device: torch.device) -> DeviceLimits:
    """What the launch heuristics size persistent grids and pipeline stages by, on a GPU."""
    import triton

    index = device.index if device.index is not None else torch.cuda.current_device()
    max_shared = triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"]
    return DeviceLimits(torch.cuda.get_device_properties(index).multi_processor_count, max_shared)


def on_device(device: torch.device):
    """A context that makes ``device`` current. Triton launches on the current CUDA device."""
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        return torch.cuda.device(device.index)
    return contextlib.nullcontext()


# Triton starts user-defined kernels, ours, through C code built per signature on a cold cache; Inductor's static
# launcher builds none. Its compile workers read the setting from the environment as they start, so the package's
# import sets it (not on ROCm, where torch does not test it). Measured: docs/kernels.md, "Launchers".
STATIC_LAUNCH = "static_launch_user_defined_triton_kernels"
STATIC_LAUNCH_ENV = "TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS"


def static_launch_config() -> tuple[str, ...]:
    """The Inductor config keys to turn on for a static launch of our kernels: none where torch lacks it."""
    return (STATIC_LAUNCH,) if hasattr(inductor_config, STATIC_LAUNCH) and torch.version.hip is None else ()


def default_to_static_launch() -> None:
    """Inductor's compile workers started from now on launch user-defined kernels statically, unless the
    environment already says otherwise."""
    if static_launch_config():
        os.environ.setdefault(STATIC_LAUNCH_ENV, "1")
