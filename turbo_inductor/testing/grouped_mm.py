"""Grouped GEMM cases for the op and kernel tests: groups of every shape (empty, odd sizes, one expert taking every
token, rows past the last group), the weight as transformers and torchtitan pass it or contiguous."""

from __future__ import annotations

import dataclasses
import functools

import torch

from turbo_inductor.kernels import host_copy, registry
from turbo_inductor.kernels.reference.fp8_quant_grouped import PAD_ALIGN
from turbo_inductor.ops.grouped_mm import GroupedMMNode
from turbo_inductor.testing import DEVICE

# name: (rows per group, rows past the last group)
PATTERNS = {
    "odd sizes": ([1, 3, 17, 5], 0),
    "one expert takes every token": ([0, 0, 26, 0], 0),
    "empty first and last, rows past the last group": ([0, 9, 14, 0], 5),
    # groups holding whole 32-row chunks (the interpreter's) and partial ones at either end, or within one chunk
    "long groups": ([45, 70, 0, 3, 32], 2),
}


def case(pattern: str, k: int, n: int, dtype=torch.float32, weight_layout: str = "transposed", seed: int = 0):
    """(x, parameter, weight, offs): x [S, K] random, and ``weight(parameter)`` the weight [E, K, N], either as
    transformers and torchtitan pass it (the transpose of an [E, N, K] parameter) or contiguous."""
    sizes, padding = PATTERNS[pattern]
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(sizes) + padding, k, generator=gen)
    if weight_layout == "transposed":
        parameter = torch.randn(len(sizes), n, k, generator=gen) / k**0.5
        weight = lambda p: p.transpose(-2, -1)  # noqa: E731
    else:
        parameter = torch.randn(len(sizes), k, n, generator=gen) / k**0.5
        weight = lambda p: p  # noqa: E731
    offs = torch.tensor(sizes, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    x, parameter = (t.to(DEVICE, dtype).requires_grad_() for t in (x, parameter))
    return x, parameter, weight, offs.to(DEVICE)


def padded_layout(ends: list[int], rows: int) -> list[tuple[int, int, int]]:
    """(first row, rows, padded start) of each group of the wgrad's padded layout, written out as the grouped FP8
    kernels' tests read it: each group bounded within [previous end, rows], padded to a non-zero multiple of 16."""
    groups, start, padded_start = [], 0, 0
    for end in ends:
        end = min(max(end, start), rows)
        groups.append((start, end - start, padded_start))
        padded_start += max(-(-(end - start) // PAD_ALIGN), 1) * PAD_ALIGN
        start = end
    return groups


HOST_READING = "host_reading"


def register_host_reading(monkeypatch) -> list[tuple[str, bool]]:
    """For the test's duration, an implementation ``host_reading`` of both bf16 grouped kernels on every device: the
    reference's loop, declaring that it reads offs on the host (not ``LAUNCHES_AHEAD``). Returns the list its calls
    append to: (kernel, whether a host copy of offs was given)."""
    seen = []
    for kernel in GroupedMMNode.kernels:
        reference = registry.implementations(kernel)["reference"]

        def reading(a, b, offs, out_dtype, kernel=kernel, fn=reference.fn):
            seen.append((kernel, host_copy.given(offs) is not None))
            return fn(a, b, offs, out_dtype)

        implementation = dataclasses.replace(
            reference,
            name=HOST_READING,
            fn=reading,
            unavailable_reason=lambda device: None,
            capabilities={registry.LAUNCHES_AHEAD: lambda: False},
        )
        monkeypatch.setitem(registry._IMPLS[kernel], HOST_READING, implementation)
    # A cache of its own: the registry's keeps no choice that names it once the test ends.
    monkeypatch.setattr(registry, "_candidates", functools.cache(registry._candidates.__wrapped__))
    return seen
