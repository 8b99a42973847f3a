"""Reference implementations in plain PyTorch: they run on every device and set the semantics."""

from __future__ import annotations

import torch


def unavailable_reason(device: torch.device) -> str | None:
    return None
