"""aiter implementations: AMD's kernel library ``amd-aiter`` (CK, assembly and HIP kernels for MI300 and MI350)
behind the registry, on ROCm builds of torch. ``pip install "turbo_inductor[rocm]"`` installs it.

aiter is imported lazily: the first time the registry asks whether an aiter implementation runs on a ROCm device
(:func:`unavailable_reason`). Importing turbo_inductor never imports it, and off ROCm nothing imports it. One module
per kernel family aiter has (``rmsnorm``, ``fp8_quant``, ``fp8_gemm``); each says which arguments it takes
(``supports``), maps our kernel's arguments onto aiter's call, and converts FP8 formats where aiter's differ
(``fp8_formats``). Adapters call aiter only as ``aiter.<function>(...)`` on :func:`module`'s result, with keywords
where aiter's signature names them: ``lowering_tests/test_aiter.py`` reads those calls and checks them against the
installed aiter's source.

Extension point, grouped GEMM / fused MoE: a ``grouped_gemm.py`` here registers aiter's grouped GEMM (``moe_op``,
``fused_moe``) on that family's kernel names the same way, imported from ``kernels/__init__.py``; the signature test
reads every module of this folder (its ``CALLED`` table lists the functions each calls).

The aiter implementations are traced into no compiled graph (``traceable=never``): aiter registers its functions as
custom ops whose schemas mark every tensor argument as mutated, which a trace would turn into copies.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging

import torch

log = logging.getLogger("turbo_inductor")
PACKAGE = "amd-aiter"


def rocm_reason(device: torch.device) -> str | None:
    """None on a GPU of a ROCm build of torch, else why aiter cannot run on ``device``."""
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
    """None once aiter is imported, else why it cannot be (not installed, or its import failed)."""
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
    """None where aiter runs on ``device``; on a ROCm GPU this imports aiter (once)."""
    reason = rocm_reason(device)
    if reason is None:
        reason = load_error()
        if reason is not None:
            _say_once(reason)
    return reason


def module():
    """The ``aiter`` module; RuntimeError naming why where it cannot be imported."""
    reason = load_error()
    if reason is not None:
        raise RuntimeError(f"turbo_inductor: {reason}")
    return importlib.import_module("aiter")
