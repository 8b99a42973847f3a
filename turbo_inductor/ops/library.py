"""What every op module shares: the ``turbo_inductor`` library, public composite ops, and input checks.

Each op family has kernel-level custom ops (``torch.library.custom_op``: functional, exact fake, registered
autograd) and, where the user-facing result is a subset of what backward needs saved (RMSNorm's rstd), a public
op defined here as ``CompositeImplicitAutograd`` over them, the way ``aten::layer_norm`` sits on
``aten::native_layer_norm``.
"""
from __future__ import annotations

from typing import Callable

import torch

NAMESPACE = "turbo_inductor"
LIB = torch.library.Library(NAMESPACE, "FRAGMENT")

SUPPORTED_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def define_composite(schema: str, fn: Callable) -> torch._ops.OpOverload:
    """Define ``turbo_inductor::<schema>`` implemented by ``fn`` for every dispatch key, autograd included."""
    name = schema.split("(", 1)[0]
    LIB.define(schema)
    LIB.impl(name, fn, "CompositeImplicitAutograd")
    return getattr(getattr(torch.ops, NAMESPACE), name).default


class OpInputError(ValueError):
    """Raised for input an op cannot take; the message names the op and the problem."""


def check(condition: bool, op: str, message: Callable[[], str]) -> None:
    """Raise OpInputError naming ``op`` unless ``condition``; ``message`` is only built on failure (ops run this
    on every call)."""
    if not condition:
        raise OpInputError(f"turbo_inductor.{op}: {message()}")


def check_float(op: str, name: str, t: torch.Tensor) -> None:
    check(isinstance(t, torch.Tensor), op, lambda: f"{name} must be a Tensor, got {type(t).__name__}")
    check(t.dtype in SUPPORTED_FLOAT_DTYPES, op,
          lambda: f"{name} has dtype {t.dtype}; supported: float32, bfloat16, float16")


def check_same_device(op: str, **tensors: torch.Tensor | None) -> None:
    devices = [t.device for t in tensors.values() if t is not None]
    check(all(d == devices[0] for d in devices), op, lambda: "tensors on different devices: " + ", ".join(
        f"{name} on {t.device}" for name, t in tensors.items() if t is not None))


def rows_view(t: torch.Tensor) -> torch.Tensor:
    """Non-empty ``t`` as a contiguous [rows, last dim] matrix: the layout every row-wise kernel takes."""
    return t.contiguous().view(-1, t.shape[-1])
