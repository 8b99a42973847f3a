"""The kernel dispatcher: which implementation of a kernel runs on which device.

Each implementation registers a priority, a device test and an optional argument test. :func:`select` returns
the forced one, or the best that takes the call. See docs/kernels.md, Dispatch.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import functools
import hashlib
import logging
import os
import time
from collections.abc import Callable, Mapping

import torch
from torch.utils._python_dispatch import _disable_current_modes

IMPL_ENV = "TURBO_INDUCTOR_IMPL"
AUTO = "auto"
AUTOTUNE = "autotune"
# "prefer:NAME": NAME where it runs on the device and takes the call, else what "auto" picks (TURBO_INDUCTOR_IMPL
# outranks it). What a rewrite writes from measured data (the cost table): a call NAME declines still runs.
PREFER = "prefer:"
log = logging.getLogger("turbo_inductor")
# Capability of the FP8-writing producers (rmsnorm_fwd_fp8, glu_fwd_fp8). Arguments: width, element size, block cols.
# True: the producer quantizes its output from registers, with no separate pass.
FP8_IN_ITS_PASS = "fp8_in_its_pass"
# Capability of the FP8 GEMMs. Arguments: a, a_scale, b, b_scale. True: the GEMM writes a float32 output itself, as
# an fp32 parameter's gradient is wanted (fp8_linear under autocast); else it writes bf16, cast after.
WRITES_FLOAT32 = "writes_float32"
# Capability of any implementation. No arguments. False where the host waits on the GPU (it reads device values):
# its cost in a compiled graph is then its wall time where its host lags, while the others' launches run ahead.
LAUNCHES_AHEAD = "launches_ahead"


@dataclasses.dataclass(frozen=True)
class Implementation:
    kernel: str
    name: str
    fn: Callable
    # Higher wins. A callable gives the priority per device.
    priority: int | Callable[[torch.device], int]
    # device -> None where it runs, else why not (shown in errors)
    unavailable_reason: Callable[[torch.device], str | None]
    # device -> whether its work can be traced into a compiled graph (see ops/library.py)
    traceable: Callable[[torch.device], bool]
    # The kernel's arguments -> None when it takes them, else why not. None: it takes all.
    supports: Callable[..., str | None] | None = None
    # Capability name -> predicate over the kernel's sizes, for the rewrites (see has_capability).
    capabilities: Mapping[str, Callable[..., bool]] = dataclasses.field(default_factory=dict)

    def priority_on(self, device: torch.device) -> int:
        return self.priority(device) if callable(self.priority) else self.priority

    def declines(self, *args, **kwargs) -> str | None:
        """Why this implementation cannot take these arguments, or None when it can."""
        return self.supports(*args, **kwargs) if self.supports is not None else None


_IMPLS: dict[str, dict[str, Implementation]] = collections.defaultdict(dict)
_CALLS: collections.Counter = collections.Counter()
# Kernels whose implementations run collectives. Autotune would choose on each rank alone.
# Ranks that chose differently would hang in mismatched collectives. These choose as "auto" does.
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
    """Decorator: register ``fn`` as implementation ``name`` of ``kernel``.
    ``supports(*args)`` returns None for arguments it takes, else why not."""

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


def preferred(name: str) -> str | None:
    """NAME of a ``prefer:NAME`` spec, else None."""
    return name[len(PREFER) :] if name.startswith(PREFER) else None


def known_names(kernel: str = "") -> set[str]:
    """The names an ``impl`` spec may give ``kernel``: its implementations, each also as ``prefer:NAME``, and
    ``autotune``. An empty ``kernel`` means any kernel."""
    names = set(implementations(kernel)) if kernel else {name for impls in _IMPLS.values() for name in impls}
    return names | {PREFER + name for name in names} | {AUTOTUNE}


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


def fingerprint(devices: list[torch.device]) -> str:
    """What decides the implementations compiled code calls on ``devices``, for the cache key.
    Per implementation: its function, and where it runs, its priority and traceability. Also TURBO_INDUCTOR_IMPL."""
    parts = [os.environ.get(IMPL_ENV, "")]
    for kernel in sorted(_IMPLS):
        for name, impl in sorted(_IMPLS[kernel].items()):
            parts.append(f"{kernel}={name}:{impl.fn.__module__}.{impl.fn.__qualname__}")
            for device in devices:
                if impl.unavailable_reason(device) is None:
                    parts.append(f"{device}:{impl.priority_on(device)},{impl.traceable(device)}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


@functools.cache
def _candidates(kernel: str, device_type: str, impl: str, env: str) -> tuple[str, tuple[Implementation, ...]]:
    """``(how, candidates)``. ``how`` is "forced", "auto" or "autotune".
    The candidates run on the device, best first."""
    impls = implementations(kernel)
    device = torch.device(device_type)
    requested = _requested_by(impl, kernel)
    if requested == AUTO or (preferred(requested) is not None and _requested_by(env, kernel) != AUTO):
        requested = _requested_by(env, kernel)  # the environment's choice outranks a measured preference
    first = None  # a preferred implementation, tried before auto's
    if (name := preferred(requested)) is not None:
        if not any(name in names for names in _IMPLS.values()):
            raise ValueError(f"turbo_inductor: no kernel has an implementation {name!r} to prefer")
        requested = AUTO  # a kernel without that implementation, or not on this device, takes auto's alone
        if name in impls and impls[name].unavailable_reason(device) is None:
            first = impls[name]
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
    if requested == AUTO:  # implementations after the first that takes every argument are never reached
        first_total = next((n for n, i in enumerate(usable) if i.supports is None), len(usable) - 1)
        usable = usable[: first_total + 1]
    if first is not None:  # auto's candidates after it, up to the first that takes every argument
        usable = [first] + ([] if first.supports is None else [i for i in usable if i is not first])
    return ("auto" if requested == AUTO else "autotune"), tuple(usable)


def _resolve(kernel: str, device: torch.device, impl: str) -> tuple[str, tuple[Implementation, ...]]:
    return _candidates(kernel, device.type, impl, os.environ.get(IMPL_ENV, ""))


def candidates(kernel: str, device: torch.device, impl: str = AUTO) -> list[str]:
    """The implementations :func:`select` would try for ``kernel`` on ``device``, in order.
    Under ``auto``: up to the first that takes every argument. Under ``autotune``: all it times."""
    return [c.name for c in _resolve(kernel, device, impl)[1]]


def select(kernel: str, device: torch.device, impl: str = AUTO) -> Callable:
    """The function implementing ``kernel`` on ``device``. The one ``impl`` names wins (a preference yields to the
    environment's), then ``TURBO_INDUCTOR_IMPL``'s.
    Otherwise the best that takes the call runs, or under ``autotune`` the fastest. Counts the calls."""
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
    """Whether the implementation :func:`select` prefers can be traced (under autotune: every candidate).
    The arguments are unknown here. Where the preferred one declines them, the next one is traced instead."""
    how, candidates = _resolve(kernel, device, impl)
    return all(c.traceable(device) for c in (candidates if how == "autotune" else candidates[:1]))


def has_capability(kernel: str, device: torch.device, impl: str, capability: str, *args) -> bool:
    """Whether the implementation :func:`select` prefers has ``capability`` for ``args`` (autotune: every candidate).
    Rewrites ask this instead of reading a tiling. An undeclared capability holds for every argument."""
    how, candidates = _resolve(kernel, device, impl)
    chosen = candidates if how == "autotune" else candidates[:1]
    return all(c.capabilities.get(capability, _always_capable)(*args) for c in chosen)


def declares(kernel: str, name: str, capability: str, *args) -> bool:
    """Whether implementation ``name`` of ``kernel`` has ``capability`` for ``args``, whatever the device: an
    undeclared capability holds, and so does any capability of a name no implementation has (``auto``)."""
    impl = _IMPLS[kernel].get(name)
    return impl is None or impl.capabilities.get(capability, _always_capable)(*args)


def _always_capable(*args) -> bool:
    return True


# --------------------------------------------------------------------------------------------------------------
# Autotuning: every candidate that takes the arguments is timed, once per signature.
# --------------------------------------------------------------------------------------------------------------
_WINNERS: dict[tuple, Implementation] = {}
AUTOTUNE_SECONDS = 0.01  # timed seconds per candidate, after a warm-up call that also compiles it


def _size(n) -> int:
    """A size as an int. A symbolic size gives the value it was traced with."""
    if isinstance(n, torch.SymInt):
        hint = n.node.hint
        return int(hint) if hint is not None else 4096  # unbacked: no example value, so a typical size
    return int(n)


def _signature(device: torch.device, args: tuple, kwargs: dict) -> tuple:
    return (str(device),) + tuple(
        (tuple(_size(n) for n in a.shape), a.dtype) if isinstance(a, torch.Tensor) else a
        for a in args + tuple(sorted(kwargs.items()))
    )


# Per kernel, the arguments to time it on, made from random ones where random values would mislead: a grouped
# GEMM's offs must be sorted group ends, or every group is empty and every candidate equally fast.
_TIMING_ARGUMENTS: dict[str, Callable[..., tuple]] = {}


def timing_arguments(kernel: str, make: Callable[..., tuple]) -> None:
    """``make(*args) -> args``: what ``autotune`` times ``kernel`` on, from the random tensors drawn for traced ones."""
    _TIMING_ARGUMENTS[kernel] = make


def _real_arguments(kernel: str, args) -> tuple:
    """``args`` with every tensor real, for timing. A traced tensor (fake or functional) becomes a random one.
    It keeps the size, dtype and device, made contiguous; the kernel's ``timing_arguments`` then shape the values."""
    if all(type(a) in (torch.Tensor, torch.nn.Parameter) for a in args if isinstance(a, torch.Tensor)):
        return tuple(args)

    def real(a):
        if not isinstance(a, torch.Tensor):
            return a
        shape = [_size(n) for n in a.shape]
        if a.dtype.is_floating_point:
            return torch.randn(shape, device=a.device).to(a.dtype)
        return torch.randint(0, 2, shape, device=a.device).to(a.dtype)

    drawn = tuple(real(a) for a in args)
    return _TIMING_ARGUMENTS[kernel](*drawn) if kernel in _TIMING_ARGUMENTS else drawn


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
        token = _TRACING.set(False)  # timed as eager launches, even while the call itself is traced
        try:
            # Leave the trace's fake, functional and proxy modes: timing runs real kernels.
            with torch.no_grad(), _disable_current_modes():
                real = _real_arguments(kernel, args)
                for candidate in taking:
                    try:
                        times[candidate.name] = _seconds_per_call(candidate.fn, real, kwargs, device)
                    except Exception as error:  # a failing candidate is skipped; the others still run
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
    """Marks an op body as being traced into a compiled graph (``ops/library.py``).
    Implementations then record their launches in the graph (Triton: ``triton.launch``)."""
    token = _TRACING.set(True)
    try:
        yield
    finally:
        _TRACING.reset(token)


def is_tracing() -> bool:
    return _TRACING.get()


def kernel_calls() -> dict[tuple[str, str], int]:
    """Selections per (kernel, implementation) since the last :func:`reset_kernel_calls`.
    Eager calls, and ops a compiled graph keeps as one call, count each time they run. A kernel traced into a
    compiled graph counts once, when traced, and not at all when the graph comes from the cache. What each
    compiled graph uses, cached or not: ``compile_records()[i].implementations``."""
    return dict(_CALLS)


def reset_kernel_calls() -> None:
    _CALLS.clear()
