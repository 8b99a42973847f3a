"""What the tests and benchmarks share: models written as real training code writes them (weights random), and the
tests' helpers, each module imported by name (``from turbo_inductor.testing.compare import assert_matches_inductor``).
Only tests and benchmarks import this package: ``import turbo_inductor`` does not, and importing it chooses nothing
(the tests' conftest.py sets ``TRITON_INTERPRET`` on a CPU before any kernel loads)."""

import functools

import torch

# Where the tests run our ops: the GPU when there is one, else the CPU (Triton's kernels in its interpreter there).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@functools.cache
def scaled_mm_takes_row_scales(device: str) -> bool:
    """Whether this torch's ``torch._scaled_mm`` takes per-row scales on ``device`` (on CPU, torch 2.13's does and
    2.11's does not): whether hand-written rowwise FP8 and torchao's rowwise recipes can run there."""
    a = torch.ones(16, 16, device=device).to(torch.float8_e4m3fn)
    rows = torch.ones(16, 1, device=device)
    try:
        torch._scaled_mm(a, a.t(), scale_a=rows, scale_b=rows.t(), out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError):
        return False
    return True


def hide_package(monkeypatch, name: str) -> None:
    """Makes ``importlib.metadata.version`` answer for package ``name`` as where it is not installed."""
    import importlib.metadata

    installed = importlib.metadata.version

    def version(package: str) -> str:
        if package == name:
            raise importlib.metadata.PackageNotFoundError(package)
        return installed(package)

    monkeypatch.setattr(importlib.metadata, "version", version)
