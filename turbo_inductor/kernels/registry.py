"""The kernel dispatcher: which implementation of a kernel runs on which device.

Every kernel (``rmsnorm_fwd``, ``rmsnorm_bwd``, ...) can have several implementations ("triton",
"native", "reference", ...). Each registers itself here with a priority and an availability test;
the op layer asks :func:`select` for one per call. A user forces one with the op's ``impl``
argument (which the backend fills from ``options={"impl": ...}``) or with the environment
variable ``TURBO_INDUCTOR_IMPL`` (``triton`` for every kernel, or ``rmsnorm_fwd=reference,...``).
"""
from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import functools
import os
from typing import Callable

import torch

IMPL_ENV = "TURBO_INDUCTOR_IMPL"
AUTO = "auto"


@dataclasses.dataclass(frozen=True)
class Implementation:
    kernel: str
    name: str
    fn: Callable
    priority: int
    # device -> None when it can run there, else the reason it cannot (shown in errors)
    unavailable_reason: Callable[[torch.device], str | None]
    # device -> whether its work can be traced into a compiled graph (plain torch calls can; see ops/library.py)
    traceable: Callable[[torch.device], bool]


_IMPLS: dict[str, dict[str, Implementation]] = collections.defaultdict(dict)
_CALLS: collections.Counter = collections.Counter()


def always(device: torch.device) -> bool:
    """Traceable on every device: plain torch calls (the default)."""
    return True


def never(device: torch.device) -> bool:
    """Traceable nowhere: the implementation stays one call in a compiled graph."""
    return False


def implementation(kernel: str, name: str, *, priority: int,
                   unavailable_reason: Callable[[torch.device], str | None],
                   traceable: Callable[[torch.device], bool] = always):
    """Decorator: register ``fn`` as implementation ``name`` of ``kernel``."""

    def register(fn: Callable) -> Callable:
        if name in _IMPLS[kernel]:
            raise RuntimeError(f"turbo_inductor: implementation {name!r} of {kernel!r} registered twice")
        _IMPLS[kernel][name] = Implementation(kernel, name, fn, priority, unavailable_reason, traceable)
        _select.cache_clear()  # a new implementation can change earlier choices
        return fn

    return register


def implementations(kernel: str) -> dict[str, Implementation]:
    if kernel not in _IMPLS:
        raise KeyError(f"turbo_inductor: no kernel named {kernel!r}; known: {sorted(_IMPLS)}")
    return dict(_IMPLS[kernel])


def parse_spec(spec: str) -> list[tuple[str, str]]:
    """``"triton"`` -> [("", "triton")]; ``"rmsnorm_fwd=triton,rmsnorm_bwd=reference"`` -> per-kernel pairs."""
    pairs = []
    for item in spec.split(","):
        if not item.strip():
            continue
        kernel, _, name = item.rpartition("=")
        pairs.append((kernel.strip(), name.strip()))
    return pairs


def known_names(kernel: str = "") -> set[str]:
    """Implementation names of ``kernel``, or of any kernel when it is empty."""
    if kernel:
        return set(implementations(kernel))
    return {name for impls in _IMPLS.values() for name in impls}


def _requested_by(spec: str, kernel: str) -> str:
    for key, name in parse_spec(spec):
        if key in ("", kernel):
            return name
    return AUTO


def available_on(kernel: str, device: torch.device) -> bool:
    """Whether some implementation of ``kernel`` runs on ``device``."""
    return any(i.unavailable_reason(device) is None for i in implementations(kernel).values())


@functools.lru_cache(maxsize=None)
def _select(kernel: str, device_type: str, impl: str, env: str) -> Implementation:
    impls = implementations(kernel)
    device = torch.device(device_type)
    requested = _requested_by(impl, kernel)
    if requested == AUTO:
        requested = _requested_by(env, kernel)
    if requested != AUTO:
        if requested not in impls:
            raise ValueError(
                f"turbo_inductor: {kernel} has no implementation {requested!r} "
                f"(choose from {sorted(impls)} or 'auto')")
        reason = impls[requested].unavailable_reason(device)
        if reason is not None:
            raise RuntimeError(
                f"turbo_inductor: implementation {requested!r} of {kernel} cannot run on {device_type}: {reason}")
        return impls[requested]
    usable = [i for i in impls.values() if i.unavailable_reason(device) is None]
    if not usable:
        reasons = "; ".join(f"{i.name}: {i.unavailable_reason(device)}" for i in impls.values())
        raise RuntimeError(f"turbo_inductor: no implementation of {kernel} runs on {device_type} ({reasons})")
    return max(usable, key=lambda i: i.priority)


def select(kernel: str, device: torch.device, impl: str = AUTO) -> Callable:
    """The function implementing ``kernel`` on ``device``: the one ``impl`` names ("name" or
    "kernel=name,..."), else the one ``TURBO_INDUCTOR_IMPL`` names, else the highest-priority available one.
    Counts the call (see :func:`kernel_calls`). Resolved once per (kernel, device type, impl, environment)."""
    chosen = _select(kernel, device.type, impl, os.environ.get(IMPL_ENV, ""))
    _CALLS[(kernel, chosen.name)] += 1
    return chosen.fn


def traceable(kernel: str, device: torch.device, impl: str = AUTO) -> bool:
    """Whether the implementation :func:`select` would pick can be traced into a compiled graph."""
    return _select(kernel, device.type, impl, os.environ.get(IMPL_ENV, "")).traceable(device)


_TRACING = contextvars.ContextVar("turbo_inductor_tracing", default=False)


@contextlib.contextmanager
def tracing():
    """Marks that an op body is being traced into a compiled graph (``ops/library.py``): implementations then
    record their work in the graph instead of launching it (Triton: ``triton.launch``)."""
    token = _TRACING.set(True)
    try:
        yield
    finally:
        _TRACING.reset(token)


def is_tracing() -> bool:
    return _TRACING.get()


def kernel_calls() -> dict[tuple[str, str], int]:
    """How often each (kernel, implementation) was called since the last :func:`reset_kernel_calls`: at run time
    for eager calls and for ops a compiled graph calls, at compile time for ops traced into it (GPU)."""
    return dict(_CALLS)


def reset_kernel_calls() -> None:
    _CALLS.clear()
