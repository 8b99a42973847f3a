"""Reference implementations in plain PyTorch. They run on every device and define the semantics."""

from __future__ import annotations

import torch


def unavailable_reason(device: torch.device) -> str | None:
    return None
