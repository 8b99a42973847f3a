"""aiter implementations: AMD's kernel library ``amd-aiter``, on ROCm builds of torch (extra ``rocm``).
aiter is imported lazily, never off ROCm. Adapters call it only as ``aiter.<function>(...)`` on :func:`module`.
See docs/kernels.md, aiter, and docs/rocm.md."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging

import torch

log = logging.getLogger("turbo_inductor")
PACKAGE = "amd-aiter"


def rocm_reason(device: torch.device) -> str | None:
    """None on a ROCm GPU, else why aiter cannot run on ``device``."""
    if device.type != "cuda":
        return f"aiter runs on AMD GPUs (ROCm), not on {device.type}"
    if torch.version.hip is None:
        built_for = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU only"
        return f"aiter needs a ROCm build of torch; torch {torch.__version__} is built for {built_for}"
    if not torch.cuda.is_available():
        return "torch sees no GPU"
    return None


@functools.cache
def load_error() -> str | None:
    """None once aiter is imported, else why it cannot be."""
    if importlib.util.find_spec("aiter") is None:
        return f"{PACKAGE} is not installed (pip install 'turbo_inductor[rocm]')"
    try:
        importlib.import_module("aiter")
    except Exception as error:  # noqa: BLE001  (aiter's import raises RuntimeError where ROCm is incomplete)
        return f"import aiter failed: {type(error).__name__}: {error}"
    return None


@functools.cache
def _say_once(reason: str) -> None:
    log.warning("turbo_inductor: %s: the other implementations stand in for aiter's", reason)


def unavailable_reason(device: torch.device) -> str | None:
    """None where aiter runs on ``device``. On a ROCm GPU this imports aiter, once."""
    reason = rocm_reason(device)
    if reason is None:
        reason = load_error()
        if reason is not None:
            _say_once(reason)
    return reason


def module():
    """The ``aiter`` module. Raises RuntimeError naming why when it cannot be imported."""
    reason = load_error()
    if reason is not None:
        raise RuntimeError(f"turbo_inductor: {reason}")
    return importlib.import_module("aiter")
