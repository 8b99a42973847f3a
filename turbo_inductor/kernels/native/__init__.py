"""Native implementations: the CUDA/HIP kernels of ``csrc/``, which ``setup.py`` builds into ``turbo_inductor._native``.
Loading it registers the ``turbo_inductor_native`` operators. Without the build, these implementations say why."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import pathlib

import torch

log = logging.getLogger("turbo_inductor")


@functools.cache
def load_error() -> str | None:
    """None once the extension is loaded, else why it cannot be."""
    try:
        importlib.import_module("turbo_inductor._native")
    except ImportError as error:
        return f"the native extension is not built ({error}); the README says how to build it"
    return None


@functools.cache
def build_hash() -> str | None:
    """SHA-256 of the built extension's file, None where there is none. It does not load the extension."""
    spec = importlib.util.find_spec("turbo_inductor._native")
    if spec is None or not spec.origin or not pathlib.Path(spec.origin).is_file():
        return None
    return hashlib.sha256(pathlib.Path(spec.origin).read_bytes()).hexdigest()


@functools.cache
def _say_once(reason: str) -> None:
    log.warning("turbo_inductor: %s: the Triton kernels stand in for the native ones", reason)


def unavailable_reason(device: torch.device) -> str | None:
    if device.type != "cuda" or not torch.cuda.is_available():
        return "the native kernels run on GPUs only"
    reason = load_error()
    if reason is not None:
        _say_once(reason)
    return reason


def ops():
    """The ``turbo_inductor_native`` operators. Call only where ``unavailable_reason`` returns None."""
    return torch.ops.turbo_inductor_native
