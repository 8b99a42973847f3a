"""A device tensor's values read on the host without draining the GPU's queue.

``copy_to_host`` queues the copy into pinned memory where the values are made and records an event; a reader waits
for that event only, while the work queued after the copy keeps the GPU busy. ``values(t)`` inside
``given_host_copy(t, host)`` reads ``host``, elsewhere ``t.tolist()`` (a sync on a GPU). Why: ``docs/kernels.md``,
"Offsets on the host".
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch

# The attribute of a pinned copy holding the event its copy completes at; absent where the copy was synchronous.
READY = "_turbo_inductor_copied"
_GIVEN: contextvars.ContextVar[tuple[torch.Tensor, torch.Tensor] | None] = contextvars.ContextVar(
    "turbo_inductor_host_copy", default=None
)


def copy_to_host(t: torch.Tensor) -> torch.Tensor:
    """A host tensor with ``t``'s values: from a GPU, pinned and copied asynchronously (read it through ``values``)."""
    if t.device.type != "cuda":
        return t.to("cpu", copy=True)
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    copied = torch.cuda.Event()
    copied.record()
    setattr(host, READY, copied)
    return host


@contextlib.contextmanager
def given_host_copy(t: torch.Tensor, host: torch.Tensor | None) -> Iterator[None]:
    """Within: ``values(t)`` reads ``host``, a ``copy_to_host`` of ``t`` (None: nothing given)."""
    token = _GIVEN.set((t, host) if host is not None else None)
    try:
        yield
    finally:
        _GIVEN.reset(token)


def given(t: torch.Tensor) -> torch.Tensor | None:
    """The host copy given for this very tensor (``given_host_copy``), else None."""
    pair = _GIVEN.get()
    return pair[1] if pair is not None and pair[0] is t else None


def values(t: torch.Tensor) -> list:
    """``t``'s values: from the host copy given for it, once its copy completed; else ``t.tolist()``."""
    host = given(t)
    if host is None:
        return t.tolist()
    copied = getattr(host, READY, None)
    if copied is not None:
        copied.synchronize()
    return host.tolist()
