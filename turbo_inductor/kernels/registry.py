"""The kernel dispatcher: which implementation of a kernel runs on which device.

Every kernel (``rmsnorm_fwd``, ``rmsnorm_bwd``, ...) can have several implementations ("triton",
"native", "reference", ...). Each registers itself here with a priority, an availability test per device and,
where it takes only some arguments, a ``supports`` test per call; the op layer asks :func:`select` for one.
By default the highest-priority implementation that runs on the device and takes the arguments is used (the
priorities follow what ``benchmarks/`` measured). A user forces one with the op's ``impl`` argument (which the
backend fills from ``options={"impl": ...}``) or with the environment variable ``TURBO_INDUCTOR_IMPL``
(``triton`` for every kernel, or ``rmsnorm_fwd=reference,...``); a forced implementation that cannot run is an
error, never a silent substitute. ``autotune`` (for every kernel or per kernel) measures every candidate once
per argument signature (shapes, dtypes, other arguments) and device, and keeps the fastest for the process.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import functools
import logging
import os
import time
from collections.abc import Callable, Mapping

import torch
from torch.utils._python_dispatch import _disable_current_modes

IMPL_ENV = "TURBO_INDUCTOR_IMPL"
AUTO = "auto"
AUTOTUNE = "autotune"
log = logging.getLogger("turbo_inductor")
# Capability of the producers writing an FP8 copy (rmsnorm_fwd_fp8, glu_fwd_fp8): (width, element size, block cols)
# -> the copy is written from the producer's registers, not by a quantization pass after it.
FP8_IN_ITS_PASS = "fp8_in_its_pass"


@dataclasses.dataclass(frozen=True)
class Implementation:
    kernel: str
    name: str
    fn: Callable
    # higher wins; or device -> priority, for an implementation whose standing differs by device
    priority: int | Callable[[torch.device], int]
    # device -> None when it can run there, else the reason it cannot (shown in errors)
    unavailable_reason: Callable[[torch.device], str | None]
    # device -> whether its work can be traced into a compiled graph (plain torch calls can; see ops/library.py)
    traceable: Callable[[torch.device], bool]
    # the kernel's arguments -> None when it takes them, else why not; None: it takes every argument
    supports: Callable[..., str | None] | None = None
    # what the rewrites may ask of it (see has_capability): capability name -> predicate over the kernel's sizes
    capabilities: Mapping[str, Callable[..., bool]] = dataclasses.field(default_factory=dict)

    def priority_on(self, device: torch.device) -> int:
        return self.priority(device) if callable(self.priority) else self.priority

    def declines(self, *args, **kwargs) -> str | None:
        """Why this implementation cannot take these arguments, or None when it can."""
        return self.supports(*args, **kwargs) if self.supports is not None else None


_IMPLS: dict[str, dict[str, Implementation]] = collections.defaultdict(dict)
_CALLS: collections.Counter = collections.Counter()
# Kernels whose implementations run collectives. Autotune would time and choose on each rank alone, and ranks that
# chose differently would issue mismatched collectives (a hang): these choose as under "auto".
_COLLECTIVE: set[str] = set()


def always(device: torch.device) -> bool:
    """Traceable on every device: plain torch calls (the default)."""
    return True


def never(device: torch.device) -> bool:
    """Traceable nowhere: the implementation stays one call in a compiled graph."""
    return False


def implementation(
    kernel: str,
    name: str,
    *,
    priority: int | Callable[[torch.device], int],
    unavailable_reason: Callable[[torch.device], str | None],
    traceable: Callable[[torch.device], bool] = always,
    supports: Callable[..., str | None] | None = None,
    capabilities: Mapping[str, Callable[..., bool]] | None = None,
):
    """Decorator: register ``fn`` as implementation ``name`` of ``kernel``. ``supports(*args)``: for an
    implementation that takes only some of the kernel's arguments, None when it takes these, else why not."""

    def register(fn: Callable) -> Callable:
        if name in _IMPLS[kernel]:
            raise RuntimeError(f"turbo_inductor: implementation {name!r} of {kernel!r} registered twice")
        _IMPLS[kernel][name] = Implementation(
            kernel, name, fn, priority, unavailable_reason, traceable, supports, dict(capabilities or {})
        )
        _candidates.cache_clear()  # a new implementation can change earlier choices
        return fn

    return register


def collective(*kernels: str) -> None:
    """Mark ``kernels`` as running collectives: ``autotune`` leaves them to the default choice."""
    _COLLECTIVE.update(kernels)
    _candidates.cache_clear()


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
    """What an ``impl`` spec may name for ``kernel`` (or for any kernel when it is empty): its implementations,
    and ``autotune``."""
    if kernel:
        return set(implementations(kernel)) | {AUTOTUNE}
    return {name for impls in _IMPLS.values() for name in impls} | {AUTOTUNE}


def _requested_by(spec: str, kernel: str) -> str:
    for key, name in parse_spec(spec):
        if key in ("", kernel):
            return name
    return AUTO


def kernels() -> list[str]:
    """Every kernel that has an implementation registered."""
    return sorted(_IMPLS)


def available_on(kernel: str, device: torch.device) -> bool:
    """Whether some implementation of ``kernel`` runs on ``device``."""
    return any(i.unavailable_reason(device) is None for i in implementations(kernel).values())


@functools.cache
def _candidates(kernel: str, device_type: str, impl: str, env: str) -> tuple[str, tuple[Implementation, ...]]:
    """``(how, candidates)``: how ("forced", "auto" or "autotune") the call picks among the candidates, which are
    the implementations that run on the device, best first."""
    impls = implementations(kernel)
    device = torch.device(device_type)
    requested = _requested_by(impl, kernel)
    if requested == AUTO:
        requested = _requested_by(env, kernel)
    if requested == AUTOTUNE and kernel in _COLLECTIVE:
        requested = AUTO
    if requested not in (AUTO, AUTOTUNE):
        if requested not in impls:
            raise ValueError(
                f"turbo_inductor: {kernel} has no implementation {requested!r} "
                f"(choose from {sorted(impls)}, 'auto' or 'autotune')"
            )
        reason = impls[requested].unavailable_reason(device)
        if reason is not None:
            raise RuntimeError(
                f"turbo_inductor: implementation {requested!r} of {kernel} cannot run on {device_type}: {reason}"
            )
        return "forced", (impls[requested],)
    usable = sorted(
        (i for i in impls.values() if i.unavailable_reason(device) is None),
        key=lambda i: i.priority_on(device),
        reverse=True,
    )
    if not usable:
        reasons = "; ".join(f"{i.name}: {i.unavailable_reason(device)}" for i in impls.values())
        raise RuntimeError(f"turbo_inductor: no implementation of {kernel} runs on {device_type} ({reasons})")
    if requested == AUTO:  # only those up to the first that takes every argument can ever be chosen
        first_total = next((n for n, i in enumerate(usable) if i.supports is None), len(usable) - 1)
        usable = usable[: first_total + 1]
    return ("auto" if requested == AUTO else "autotune"), tuple(usable)


def _resolve(kernel: str, device: torch.device, impl: str) -> tuple[str, tuple[Implementation, ...]]:
    return _candidates(kernel, device.type, impl, os.environ.get(IMPL_ENV, ""))


def candidates(kernel: str, device: torch.device, impl: str = AUTO) -> list[str]:
    """The implementations :func:`select` would try for ``kernel`` on ``device``, in order: under ``auto`` those up
    to the first that takes every argument, under ``autotune`` all that it measures. Errors as :func:`select`."""
    return [c.name for c in _resolve(kernel, device, impl)[1]]


def select(kernel: str, device: torch.device, impl: str = AUTO) -> Callable:
    """The function implementing ``kernel`` on ``device``: the one ``impl`` names ("name" or "kernel=name,..."),
    else the one ``TURBO_INDUCTOR_IMPL`` names, else the best available one that takes the call's arguments, or
    with ``autotune`` the fastest measured. Counts the calls (see :func:`kernel_calls`). The candidates are
    resolved once per (kernel, device type, impl, environment)."""
    how, candidates = _resolve(kernel, device, impl)
    if how == "autotune":
        return functools.partial(_call_autotuned, kernel, candidates)
    if candidates[0].supports is None:
        _CALLS[(kernel, candidates[0].name)] += 1
        return candidates[0].fn
    return functools.partial(_call_first_supporting, kernel, candidates, how == "forced")


def _call_first_supporting(kernel: str, candidates: tuple[Implementation, ...], forced: bool, *args, **kwargs):
    reasons = []
    for candidate in candidates:
        reason = candidate.declines(*args, **kwargs)
        if reason is None:
            _CALLS[(kernel, candidate.name)] += 1
            return candidate.fn(*args, **kwargs)
        if forced:
            raise ValueError(
                f"turbo_inductor: implementation {candidate.name!r} of {kernel} cannot take these arguments: {reason}"
            )
        reasons.append(f"{candidate.name}: {reason}")
    raise ValueError(f"turbo_inductor: no implementation of {kernel} takes these arguments ({'; '.join(reasons)})")


def traceable(kernel: str, device: torch.device, impl: str = AUTO) -> bool:
    """Whether the implementation :func:`select` prefers can be traced into a compiled graph (with autotune:
    every candidate). The arguments are not known here: where the preferred one declines them, the next one is
    traced in its place (the Triton FP8 GEMM where torch._scaled_mm declines the scales, say)."""
    how, candidates = _resolve(kernel, device, impl)
    return all(c.traceable(device) for c in (candidates if how == "autotune" else candidates[:1]))


def has_capability(kernel: str, device: torch.device, impl: str, capability: str, *args) -> bool:
    """Whether the implementation :func:`select` prefers (with autotune: every candidate) has ``capability`` for
    ``args``. The rewrites ask this instead of one implementation's tiling; an implementation that does not
    declare the capability has it for every argument."""
    how, candidates = _resolve(kernel, device, impl)
    chosen = candidates if how == "autotune" else candidates[:1]
    return all(c.capabilities.get(capability, _always_capable)(*args) for c in chosen)


def _always_capable(*args) -> bool:
    return True


# --------------------------------------------------------------------------------------------------------------
# Autotuning: each candidate that takes the arguments is timed on arguments like the call's, once per signature.
# --------------------------------------------------------------------------------------------------------------
_WINNERS: dict[tuple, Implementation] = {}
AUTOTUNE_SECONDS = 0.01  # measured time per candidate, after one warm-up call (which also compiles Triton kernels)


def _size(n) -> int:
    """A size as a number: a symbolic size (tracing with dynamic shapes) by the value it was traced with."""
    if isinstance(n, torch.SymInt):
        hint = n.node.hint
        return int(hint) if hint is not None else 4096  # unbacked: no example value; a typical size
    return int(n)


def _signature(device: torch.device, args: tuple, kwargs: dict) -> tuple:
    return (str(device),) + tuple(
        (tuple(_size(n) for n in a.shape), a.dtype) if isinstance(a, torch.Tensor) else a
        for a in args + tuple(sorted(kwargs.items()))
    )


def _real_arguments(args) -> tuple:
    """``args`` where every tensor is real, for timing: tensors being traced (fake or functional) are replaced
    by random ones of the same size, dtype and device (contiguous)."""
    if all(type(a) in (torch.Tensor, torch.nn.Parameter) for a in args if isinstance(a, torch.Tensor)):
        return tuple(args)

    def real(a):
        if not isinstance(a, torch.Tensor):
            return a
        shape = [_size(n) for n in a.shape]
        if a.dtype.is_floating_point:
            return torch.randn(shape, device=a.device).to(a.dtype)
        return torch.randint(0, 2, shape, device=a.device).to(a.dtype)

    return tuple(real(a) for a in args)


def _seconds_per_call(fn: Callable, args: tuple, kwargs: dict, device: torch.device) -> float:
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn(*args, **kwargs)  # warm-up: compiles and caches what the first call needs
    sync()
    calls, start = 0, time.perf_counter()
    while calls == 0 or time.perf_counter() - start < AUTOTUNE_SECONDS:
        fn(*args, **kwargs)
        calls += 1
        if device.type == "cuda":  # a few launches between synchronizations keep the queue busy
            if calls % 8 == 0:
                sync()
    sync()
    return (time.perf_counter() - start) / calls


def _call_autotuned(kernel: str, candidates: tuple[Implementation, ...], *args, **kwargs):
    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    key = (kernel,) + _signature(device, args, kwargs)
    winner = _WINNERS.get(key)
    if winner is None:
        taking = [c for c in candidates if c.declines(*args, **kwargs) is None]
        if not taking:
            raise ValueError(f"turbo_inductor: no implementation of {kernel} takes these arguments")
        times = {}
        token = _TRACING.set(False)  # measured as eager launches, even while the call itself is traced
        try:
            # Outside the fake, functional and proxy modes of a trace: the measurement runs real kernels.
            with torch.no_grad(), _disable_current_modes():
                real = _real_arguments(args)
                for candidate in taking:
                    try:
                        times[candidate.name] = _seconds_per_call(candidate.fn, real, kwargs, device)
                    except Exception as error:  # a candidate that fails here is not chosen; the others still run
                        log.warning("turbo_inductor: autotune %s: %s failed (%s)", kernel, candidate.name, error)
        finally:
            _TRACING.reset(token)
        if not times:
            raise RuntimeError(f"turbo_inductor: autotune {kernel}: every candidate failed; see the warnings")
        winner = next(c for c in taking if c.name == min(times, key=times.get))
        _WINNERS[key] = winner
        log.info(
            "turbo_inductor: autotune %s %s -> %s (%s)",
            kernel,
            key[1:],
            winner.name,
            ", ".join(f"{name} {t * 1e6:.1f} us" for name, t in times.items()),
        )
    _CALLS[(kernel, winner.name)] += 1
    return winner.fn(*args, **kwargs)


def autotuned() -> dict[tuple, str]:
    """The winners autotuning chose so far: (kernel, device, argument signature...) -> implementation name."""
    return {key: impl.name for key, impl in _WINNERS.items()}


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
