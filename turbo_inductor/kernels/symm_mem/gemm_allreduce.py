"""GEMM + all-reduce over symmetric memory, moved by the copy engines (``impl="symm_mem"``, opt-in).
Chunk partials reach every peer while the next chunk's GEMM runs. No NCCL, no multicast.
See docs/kernels.md, GEMM + all-reduce.
"""

from __future__ import annotations

import collections
import functools
from typing import Optional

import torch

from ..collective.gemm_allreduce import row_chunks
from ..reference.gemm_allreduce import weight_grad
from ..registry import implementation
from . import symmetric_tensor, unavailable_reason

PRIORITY = -20
NAMESPACE = "turbo_inductor_symm_mem"
CHUNKS = 4  # row chunks per call: more hide more, but each costs the host ~0.12 ms
MAX_RANKS = 4  # each rank sends W-1 whole partials, W/2 times a ring's data: at most twice
# (rows, cols, dtype, device, group) -> two buffers used in turn, with handles. USES counts calls per key.
_BUFFERS: dict[tuple, tuple] = {}
USES: collections.Counter = collections.Counter()


def peer_slot(source: int, destination: int, world: int) -> int:
    """The slot of ``destination``'s buffer that ``source``'s partials land in. Each peer has its own of W - 1."""
    return (source - destination - 1) % world


class _PeerSum:
    """One call's reduction. ``push`` copies a chunk's partial into every peer's buffer, on a side stream.
    After a barrier it adds the peers' partials into ``out``."""

    def __init__(self, rows: int, cols: int, dtype: torch.dtype, device: torch.device, group_name: str):
        key = (rows, cols, dtype, device, group_name)
        if key not in _BUFFERS:
            _BUFFERS[key] = tuple(_symmetric_buffers(rows, cols, dtype, device, group_name) for _ in range(2))
        USES[key] += 1
        self.handle, self.buffers = _BUFFERS[key][USES[key] % 2]
        self.rank, self.world = self.handle.rank, self.handle.world_size
        self.main, self.side = torch.cuda.current_stream(device), _side_stream(device)

    def push(self, start: int, stop: int, partial: torch.Tensor, out: torch.Tensor) -> torch.cuda.Event:
        """Sets ``out[start:stop]`` to ``partial`` plus the peers' partials; returns an event marking it done.
        ``partial`` may alias that slice: the pushes read it before the add writes."""
        self.side.wait_stream(self.main)  # partial is written
        with torch.cuda.stream(self.side):
            for step in range(1, self.world):
                peer = (self.rank + step) % self.world
                self.buffers[peer][peer_slot(self.rank, peer, self.world), start:stop].copy_(partial)
            self.handle.barrier(channel=0)  # every peer's pushes to this rank have landed
            mine = self.buffers[self.rank]
            torch.add(partial, mine[0, start:stop], out=out[start:stop])
            for slot in range(1, self.world - 1):
                out[start:stop].add_(mine[slot, start:stop])
            done = torch.cuda.Event()
            done.record()
        return done

    def finish(self) -> None:
        self.main.wait_stream(self.side)


def _symmetric_buffers(rows: int, cols: int, dtype: torch.dtype, device: torch.device, group_name: str):
    """The handle and every rank's buffer as mapped here: W - 1 slots of [rows, cols].
    This rank's own is the allocation."""
    world = torch.distributed.distributed_c10d._resolve_process_group(group_name).size()
    return symmetric_tensor((world - 1, rows, cols), dtype, device, group_name)


@functools.cache
def _side_stream(device: torch.device) -> torch.cuda.Stream:
    return torch.cuda.Stream(device)


@torch.library.custom_op(f"{NAMESPACE}::gemm_allreduce_fwd", mutates_args=())
def _fwd(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], group_name: str) -> torch.Tensor:
    rows, cols = x.shape[0], weight.shape[0]
    out = torch.empty((rows, cols), dtype=x.dtype, device=x.device)
    reduction = _PeerSum(rows, cols, x.dtype, x.device, group_name)
    for start, stop in row_chunks(rows, cols * x.element_size(), CHUNKS):
        if bias is None:
            torch.mm(x[start:stop], weight.t(), out=out[start:stop])
        else:  # the bias on every rank, then summed, as F.linear in the reference
            torch.addmm(bias, x[start:stop], weight.t(), out=out[start:stop])
        reduction.push(start, stop, out[start:stop], out)
    reduction.finish()
    return out


@_fwd.register_fake
def _(x, weight, bias, group_name):
    return x.new_empty((x.shape[0], weight.shape[0]))


@torch.library.custom_op(f"{NAMESPACE}::gemm_allreduce_bwd", mutates_args=())
def _bwd(
    dy: torch.Tensor, x: Optional[torch.Tensor], weight: torch.Tensor, group_name: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows, cols = dy.shape
    g, dx = torch.empty_like(dy), dy.new_empty((rows, weight.shape[1]))
    reduction = _PeerSum(rows, cols, dy.dtype, dy.device, group_name)
    chunks = row_chunks(rows, max(cols, weight.shape[1]) * dy.element_size(), CHUNKS)
    reduced = [reduction.push(start, stop, dy[start:stop], g) for start, stop in chunks]  # all queued at once
    for (start, stop), event in zip(chunks, reduced):
        reduction.main.wait_event(event)
        torch.mm(g[start:stop], weight, out=dx[start:stop])  # overlaps the next chunks' reductions
    reduction.finish()
    return dx, weight_grad(g, x, weight), g.sum(0)


@_bwd.register_fake
def _(dy, x, weight, group_name):
    return dy.new_empty((dy.shape[0], weight.shape[1])), weight_grad(dy, x, weight), weight.new_empty(weight.shape[0])


def supports(x: torch.Tensor, weight: torch.Tensor, *args) -> str | None:
    group_name = args[-1]
    world = torch.distributed.distributed_c10d._resolve_process_group(group_name).size()
    if not 2 <= world <= MAX_RANKS:
        return f"groups of 2 to {MAX_RANKS} ranks (each rank sends its whole partial to each peer), got {world}"
    return None


@implementation(
    "gemm_allreduce_fwd", "symm_mem", priority=PRIORITY, unavailable_reason=unavailable_reason, supports=supports
)
def gemm_allreduce_fwd(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, group_name: str
) -> torch.Tensor:
    return _fwd(x, weight, bias, group_name)


@implementation(
    "gemm_allreduce_bwd", "symm_mem", priority=PRIORITY, unavailable_reason=unavailable_reason, supports=supports
)
def gemm_allreduce_bwd(dy: torch.Tensor, x: torch.Tensor | None, weight: torch.Tensor, group_name: str):
    """``g`` = dy summed over ranks, pushed in chunks like the forward's partials.
    Returns ``(g @ weight, g^T @ x, g.sum(0))``. Each chunk's ``g @ weight`` overlaps the next reduction."""
    return _bwd(dy, x, weight, group_name)
