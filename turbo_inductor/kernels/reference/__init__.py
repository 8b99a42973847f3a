"""Reference implementations in plain PyTorch. They run on every device and define the semantics."""

from __future__ import annotations

import torch


def unavailable_reason(device: torch.device) -> str | None:
    return None


def traced_off_cpu(device: torch.device) -> bool:
    """Traced into compiled graphs on GPUs only. On CPU, where the reference kernels serve the tests, Inductor's C++
    code for their traced math doubles a small model's compile time and gains nothing."""
    return device.type != "cpu"
