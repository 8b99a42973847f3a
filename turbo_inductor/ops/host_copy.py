"""A device tensor copied to the host without a sync, for ops whose implementation reads values on the host.

Ops in ``torch.ops.turbo_inductor``:
  copy_to_host(t) -> host     custom op, not differentiable

host: t's values on the CPU. From a GPU the copy is queued on the current stream into pinned memory and an event
recorded; the ops given it (``grouped_mm``'s ``host_offs``) wait for that event, not for the work queued after the
copy. Read it only through those ops. Why: ``docs/kernels.md``, "Offsets on the host".
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels import host_copy
from .library import NAMESPACE, check
from .node import OpNode


def check_host_copy(op: str, name: str, host: Tensor | None, of: Tensor) -> None:
    """``host`` None, or a CPU tensor of ``of``'s shape and dtype (a ``copy_to_host`` of it)."""
    check(
        host is None or (isinstance(host, Tensor) and host.device.type == "cpu" and host.shape == of.shape),
        op,
        lambda: (
            f"{name} must be None or a copy_to_host of a tensor of shape {list(of.shape)}, got "
            f"{getattr(host, 'device', type(host).__name__)} {list(getattr(host, 'shape', []))}"
        ),
    )
    check(
        host is None or host.dtype == of.dtype,
        op,
        lambda: f"{name} must have dtype {of.dtype}, got {host.dtype}",
    )


@torch.library.custom_op(f"{NAMESPACE}::copy_to_host", mutates_args=())
def copy_to_host(t: Tensor) -> Tensor:
    check(isinstance(t, Tensor), "copy_to_host", lambda: f"t must be a Tensor, got {type(t).__name__}")
    return host_copy.copy_to_host(t)


@copy_to_host.register_fake
def _(t):
    return t.new_empty(t.shape, device="cpu")


class CopyToHostNode(OpNode):
    op = torch.ops.turbo_inductor.copy_to_host.default
