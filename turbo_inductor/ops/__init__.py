"""The Python API: differentiable functions over the ``torch.ops.turbo_inductor`` ops.

``impl`` forces a kernel implementation ("triton", "reference", ... or "kernel=name,..."); "auto" picks the best
available on the tensors' device (see ``turbo_inductor.kernels.registry``).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import rmsnorm as _rmsnorm  # noqa: F401  (defines the ops)


def rmsnorm(x: Tensor, weight: Optional[Tensor] = None, eps: float = 1e-6, *, impl: str = "auto") -> Tensor:
    """RMSNorm over the last dimension, in fp32, returned in ``x.dtype``."""
    return torch.ops.turbo_inductor.rmsnorm(x, weight, eps, impl)


def rmsnorm_residual(x: Tensor, residual: Tensor, weight: Optional[Tensor] = None, eps: float = 1e-6, *,
                     impl: str = "auto") -> tuple[Tensor, Tensor]:
    """``(rmsnorm(x + residual), x + residual)`` in one pass, as a pre-norm transformer block needs."""
    return torch.ops.turbo_inductor.rmsnorm_residual(x, residual, weight, eps, impl)
