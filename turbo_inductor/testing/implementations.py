"""A kernel's implementations as modules of kernel functions, for the kernel tests."""

import pytest
import torch

from turbo_inductor.testing import DEVICE


class TakingSome:
    """An implementation that takes only some of a kernel's arguments (its ``supports``), as a module of kernel
    functions for the kernel tests: a call it does not take skips the test, naming why."""

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, kernel: str):
        from turbo_inductor.kernels import registry

        implementation = registry.implementations(kernel)[self.name]

        def call(*args, **kwargs):
            reason = implementation.declines(*args, **kwargs)
            if reason is not None:
                pytest.skip(f"{self.name} {kernel}: {reason}")
            return implementation.fn(*args, **kwargs)

        return call


def native_on_device() -> dict:
    """{"native": its kernels} where the native extension was built and runs on DEVICE, else {}."""
    from turbo_inductor.kernels import native

    return {"native": TakingSome("native")} if native.unavailable_reason(torch.device(DEVICE)) is None else {}
