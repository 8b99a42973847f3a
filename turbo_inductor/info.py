"""``python -m turbo_inductor.info``: what turbo_inductor runs on this machine.

Versions, the device, the optional native kernels and aiter. Per kernel: what ``impl="auto"`` tries, in order,
and what is available. On a ROCm GPU this imports aiter, as the first kernel call would. Elsewhere it imports
nothing optional.
"""

from __future__ import annotations

import importlib.metadata
import platform

import torch

from . import __version__
from .kernels import aiter, native, registry


def _installed(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _device() -> tuple[torch.device, str]:
    """The device the ops would run on here, and its description. The current GPU, else the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu"), "cpu (no GPU visible to torch)"
    device = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(device)
    if torch.version.hip is not None:
        return device, f"{device} {props.name} ({props.gcnArchName}, ROCm {torch.version.hip})"
    return device, f"{device} {props.name} (sm_{props.major}{props.minor}, CUDA {torch.version.cuda})"


def _native(device: torch.device) -> str:
    error = native.load_error()
    if error is not None:
        return error
    reason = native.unavailable_reason(device)
    return "built" + (f", but {reason}" if reason else "")


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
    device, description = _device()
    return {
        "turbo_inductor": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _installed("triton"),
        "amd-aiter": _installed(aiter.PACKAGE),
        "device": description,
        "native": _native(device),
        "aiter": aiter.unavailable_reason(device) or "available",
        "kernels": {kernel: _kernel(kernel, device) for kernel in registry.kernels()},
    }


def format_report(facts: dict) -> str:
    lines = [
        f"turbo_inductor {facts['turbo_inductor']}: python {facts['python']}, torch {facts['torch']}, "
        f"triton {facts['triton']}, amd-aiter {facts['amd-aiter']}",
        f"device: {facts['device']}",
        f"native kernels: {facts['native']}",
        f"aiter: {facts['aiter']}",
        "kernels (auto: tried in this order, * takes only some arguments; available):",
    ]
    unavailable: dict[tuple[str, str], list[str]] = {}
    for kernel, k in facts["kernels"].items():
        lines.append(f"  {kernel}: auto {', '.join(k['auto'])}; available {', '.join(k['available']) or 'none'}")
        for name, reason in k["unavailable"].items():
            unavailable.setdefault((name, reason), []).append(kernel)
    lines.append("unavailable here:")
    lines += [f"  {name} ({', '.join(kernels)}): {reason}" for (name, reason), kernels in sorted(unavailable.items())]
    return "\n".join(lines)


def main() -> None:
    print(format_report(report()))


if __name__ == "__main__":
    main()
