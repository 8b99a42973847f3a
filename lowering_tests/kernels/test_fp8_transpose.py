"""FP8 operands transposed (``fp8_transpose``, an MoE weight's forward copy into its dgrad layout): the Triton kernel
against the reference, byte for byte, on strided inputs and tiles cut at every edge."""

from __future__ import annotations

import pytest
import torch

from turbo_inductor.kernels import registry
from turbo_inductor.kernels.triton import fp8_transpose as triton_transpose
from turbo_inductor.testing import DEVICE

KERNEL = "fp8_transpose"


def transpose(impl: str, q: torch.Tensor) -> torch.Tensor:
    return registry.implementations(KERNEL)[impl].fn(q)


@pytest.mark.parametrize("fp8_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("tile", [(16, 32), None])
def test_triton_matches_the_reference(monkeypatch, fp8_dtype, tile):
    """A view with padded rows per batch (as ``weight_operands`` gives the forward copy) and sizes no tile divides."""
    if tile is not None:
        monkeypatch.setattr(triton_transpose, "TILE_ROWS", tile[0])
        monkeypatch.setattr(triton_transpose, "TILE_COLS", tile[1])
    gen = torch.Generator().manual_seed(0)
    q = (torch.randn(3, 72, 90, generator=gen) * 8).to(DEVICE, fp8_dtype)[:, 3:70]
    got, want = transpose("triton", q), transpose("reference", q)
    assert got.shape == (3, 90, 67) and got.is_contiguous() and got.dtype == fp8_dtype
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert torch.equal(want.view(torch.uint8), q.view(torch.uint8).transpose(1, 2))


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_empty_and_bad_arguments(impl):
    assert transpose(impl, torch.empty(2, 0, 5, dtype=torch.float8_e4m3fn, device=DEVICE)).shape == (2, 5, 0)
    for bad in (torch.zeros(4, 4, dtype=torch.float8_e4m3fn), torch.zeros(1, 4, 4, dtype=torch.bfloat16)):
        with pytest.raises(ValueError, match="fp8_transpose expects a 3-D FP8 tensor"):
            transpose(impl, bad.to(DEVICE))
