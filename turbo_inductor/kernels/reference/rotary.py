"""Rotary position embedding in plain PyTorch. It defines the semantics.
With x's halves x1, x2 and cos, sin's halves c1, c2 and s1, s2 (last dim), in fp32, rounded once to x's dtype:
  ``out = cat(x1 * c1 - x2 * s1, x2 * c2 + x1 * s2)``, that is ``x * cos + rotate_half(x) * sin``;
  transposed (its gradient): ``out = cat(x1 * c1 + x2 * s2, x2 * c2 - x1 * s1)``.
cos and sin broadcast to x. See docs/kernels.md, Rotary embedding.
"""

from __future__ import annotations

import torch

from ..registry import implementation
from . import traced_off_cpu, unavailable_reason


@implementation("rotary", "reference", priority=0, unavailable_reason=unavailable_reason, traceable=traced_off_cpu)
def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, transposed: bool) -> torch.Tensor:
    """4-D x rotated along its last dimension by cos, sin, which broadcast to it; out has x's layout."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    c1, c2 = cos[..., :half].float(), cos[..., half:].float()
    s1, s2 = sin[..., :half].float(), sin[..., half:].float()
    if transposed:
        out = torch.cat((x1 * c1 + x2 * s2, x2 * c2 - x1 * s1), dim=-1)
    else:
        out = torch.cat((x1 * c1 - x2 * s1, x2 * c2 + x1 * s2), dim=-1)
    return torch.empty_like(x).copy_(out)
