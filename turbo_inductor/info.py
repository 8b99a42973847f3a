"""``python -m turbo_inductor.info``: what turbo_inductor runs on this machine.

Versions (of transformers, torchao and aiter: "not installed" where absent), the device, the optional native
kernels (built or not, and why) and aiter. Per kernel: what ``impl="auto"`` tries, in order, and what is available.
The environment hash is part of the compile cache key. On a ROCm GPU this imports aiter, as the first kernel call
would. Elsewhere it imports nothing optional.
"""

from __future__ import annotations

import os
import platform

import torch
import triton

from . import __version__, environment
from .kernels import aiter, native, registry


def _native(device: torch.device) -> str:
    """Built or not, and why not; where built, its file's hash and whether it runs here."""
    error = native.load_error()
    if error is not None:
        return error
    reason = native.unavailable_reason(device)
    return f"built (sha256 {native.build_hash()[:12]})" + (f", but {reason}" if reason else "")


def _kernel(kernel: str, device: torch.device) -> dict:
    impls = registry.implementations(kernel)
    reasons = {name: impl.unavailable_reason(device) for name, impl in sorted(impls.items())}
    try:
        auto = [name if impls[name].supports is None else f"{name}*" for name in registry.candidates(kernel, device)]
    except (RuntimeError, ValueError) as error:  # none runs here, or TURBO_INDUCTOR_IMPL names a wrong one
        auto = [f"error: {error}"]
    return {
        "auto": auto,
        "available": [name for name, reason in reasons.items() if reason is None],
        "unavailable": {name: reason for name, reason in reasons.items() if reason is not None},
    }


def report() -> dict:
    """The facts ``main`` prints, as a dict."""
    device, description = environment.device()
    return {
        "turbo_inductor": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,  # its distribution's name differs on ROCm
        **{
            name: environment.installed_version(name) or "not installed"
            for name in ("transformers", "torchao", aiter.PACKAGE)
        },
        "device": description,
        "native": _native(device),
        "aiter": aiter.unavailable_reason(device) or "available",
        "impl": os.environ.get(registry.IMPL_ENV, ""),
        "environment": environment.identity()[:12],
        "kernels": {kernel: _kernel(kernel, device) for kernel in registry.kernels()},
    }


def format_report(facts: dict) -> str:
    lines = [
        f"turbo_inductor {facts['turbo_inductor']}: python {facts['python']}, torch {facts['torch']}, "
        f"triton {facts['triton']}, transformers {facts['transformers']}, torchao {facts['torchao']}, "
        f"amd-aiter {facts['amd-aiter']}",
        f"device: {facts['device']}",
        f"native kernels: {facts['native']}",
        f"aiter: {facts['aiter']}",
        f"environment hash (in the compile cache key): {facts['environment']}",
        f"kernels (auto: tried in this order, * takes only some arguments; available){_forced(facts['impl'])}:",
    ]
    unavailable: dict[tuple[str, str], list[str]] = {}
    for kernel, k in facts["kernels"].items():
        lines.append(f"  {kernel}: auto {', '.join(k['auto'])}; available {', '.join(k['available']) or 'none'}")
        for name, reason in k["unavailable"].items():
            unavailable.setdefault((name, reason), []).append(kernel)
    lines.append("unavailable here:")
    lines += [f"  {name} ({', '.join(kernels)}): {reason}" for (name, reason), kernels in sorted(unavailable.items())]
    return "\n".join(lines)


def _forced(spec: str) -> str:
    return f"; {registry.IMPL_ENV}={spec} forces" if spec else ""


def main() -> None:
    print(format_report(report()))


if __name__ == "__main__":
    main()
