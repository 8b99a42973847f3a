"""GEMM + all-reduce's implementations: the overlap implementation's row chunks, symmetric memory's peer slots,
and which implementations run where (autotune leaves collectives alone)."""

import pytest
import torch

from turbo_inductor.kernels import registry
from turbo_inductor.kernels.collective import gemm_allreduce as overlap
from turbo_inductor.kernels.symm_mem import gemm_allreduce as symm_mem_impl
from turbo_inductor.testing.distributed import WORLD


@pytest.mark.parametrize("count", [overlap.CHUNKS, 1, 3, 8])
def test_chunks_cover_every_row_once_and_small_sizes_stay_whole(count):
    assert overlap.row_chunks(100, 1 << 20, count) == [(0, 100)]  # too few rows
    assert overlap.row_chunks(8192, 16, count) == [(0, 8192)]  # too few bytes
    chunks = overlap.row_chunks(8190, 4096 * 2, count)
    assert len(chunks) == count and chunks[0][0] == 0 and chunks[-1][1] == 8190
    assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_peer_pushes_into_a_slot_of_its_own(world):
    for destination in range(world):
        slots = [
            symm_mem_impl.peer_slot(source, destination, world) for source in range(world) if source != destination
        ]
        assert sorted(slots) == list(range(world - 1))


def test_symmetric_memory_is_a_gpu_implementation_and_autotune_leaves_collectives_alone(fake_group, monkeypatch):
    symm_mem = registry.implementations("gemm_allreduce_fwd")["symm_mem"]
    assert symm_mem.unavailable_reason(torch.device("cpu")) == "symmetric memory needs a GPU"
    # Each rank pushes its whole partial to each peer: beyond MAX_RANKS that is more than twice a ring's data.
    args = (torch.randn(6, 32), torch.randn(24, 32), None, fake_group.group_name)
    assert symm_mem.declines(*args) is None
    monkeypatch.setattr(symm_mem_impl, "MAX_RANKS", WORLD - 1)
    assert "groups of 2 to 1 ranks" in symm_mem.declines(*args)
    # Its extern ops have exact fakes: a compiled graph calls them with the shapes the op has.
    x, w = torch.randn(6, 32, device="meta"), torch.randn(24, 32, device="meta")
    assert torch.ops.turbo_inductor_symm_mem.gemm_allreduce_fwd(x, w, None, "g").shape == (6, 24)
    dx, dw, db = torch.ops.turbo_inductor_symm_mem.gemm_allreduce_bwd(torch.randn(6, 24, device="meta"), x, w, "g")
    assert (dx.shape, dw.shape, db.shape) == (x.shape, w.shape, (24,))
    # Each rank would time and choose alone: ranks choosing differently would issue mismatched collectives.
    for kernel in ("gemm_allreduce_fwd", "gemm_allreduce_bwd"):
        assert registry._resolve(kernel, torch.device("cpu"), "autotune")[0] == "auto"
    assert registry._resolve("rmsnorm_fwd", torch.device("cpu"), "autotune")[0] == "autotune"
