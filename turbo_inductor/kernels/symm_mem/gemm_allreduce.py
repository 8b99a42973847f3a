"""GEMM + all-reduce through symmetric memory, moved by the copy engines: in row chunks, each chunk's GEMM writes
the rank's partial output, and a side stream pushes it into every peer's symmetric buffer with a device-to-device
copy (the copy engines, no SMs taken from the GEMM), meets the peers at a barrier (every rank's pushes to it have
landed) and adds the peers' partials into the output, all while the next chunk's GEMM computes. Only the last
chunk's push and add stay exposed, so more chunks hide more (down to GEMMs too small to run at full rate:
``collective.row_chunks`` keeps small sizes whole). The backward reduces dy the same way, and each chunk's dx GEMM
starts when its chunk
is summed.
No NCCL, no multicast; PyTorch's own fused matmul + reduce-scatter moves data the same way.

Each rank sends its whole partial to each peer: the least data for two ranks (reduce-scatter + all-gather sends
the same), W/2 times more for W ranks, so ``supports`` keeps to ``MAX_RANKS``.

Buffers are allocated and exchanged (``rendezvous``, a collective: every rank makes the same calls in the same
order) at the first call of each shape, two per shape, used in turn by successive calls: a peer pushes into the
buffer this rank used the call before last only after both met at this call's barrier for the same chunk, which
this rank reaches after adding that chunk (one stream, in order).

The work is runtime state, so it runs in two operators of their own, ``turbo_inductor_symm_mem::gemm_allreduce_fwd``
and ``_bwd`` (fakes give their shapes), which a compiled graph calls as extern kernels: the implementation traces
into the graph as that call, as the native kernels' do, and the op's eager rank check stays out of compiled code.
Opt-in (``impl="symm_mem"``, below the reference); ``autotune`` never chooses among collective implementations
(``registry.collective``). Measured on two H200s (``bench_gemm_allreduce``) it is bound by the host: at 8192x4096x7168
with 4 chunks a call took 1.017 ms (Inductor's 1.064), of which issuing it took the host 0.861 ms, about 0.12 ms
of Python per chunk (a GEMM, a copy, a barrier, an add, stream waits). A Python-issued pipeline cannot overlap much
more on that host; the same steps issued from C++ (or captured in a CUDA graph) would leave the GPU's times alone.
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
CHUNKS = 4  # row chunks per call: the last chunk's push and add are exposed; each costs the host ~0.12 ms
MAX_RANKS = 4  # each rank sends W-1 full partials, W/2 times a ring's data: at most twice
# (rows, cols, dtype, device, group) -> the two buffers used in turn, with their handles; and calls per key.
_BUFFERS: dict[tuple, tuple] = {}
USES: collections.Counter = collections.Counter()


def peer_slot(source: int, destination: int, world: int) -> int:
    """The slot of ``destination``'s buffer (W - 1 slots) that ``source``'s partials land in: each peer its own."""
    return (source - destination - 1) % world


class _PeerSum:
    """One call's reduction: ``push`` a chunk's partial to every peer's buffer (copy engine, side stream), meet them
    at a barrier, and add theirs, one per slot (``peer_slot``), into ``out``."""

    def __init__(self, rows: int, cols: int, dtype: torch.dtype, device: torch.device, group_name: str):
        key = (rows, cols, dtype, device, group_name)
        if key not in _BUFFERS:
            _BUFFERS[key] = tuple(_symmetric_buffers(rows, cols, dtype, device, group_name) for _ in range(2))
        USES[key] += 1
        self.handle, self.buffers = _BUFFERS[key][USES[key] % 2]
        self.rank, self.world = self.handle.rank, self.handle.world_size
        self.main, self.side = torch.cuda.current_stream(device), _side_stream(device)

    def push(self, start: int, stop: int, partial: torch.Tensor, out: torch.Tensor) -> torch.cuda.Event:
        """``out[start:stop] = partial + the peers' partials of these rows`` (``partial`` may be that slice of
        ``out``: it is read by the pushes before the add writes); the event marks it done."""
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
    """The symmetric memory's handle and, per rank of the group, that rank's buffer of W - 1 slots of [rows, cols]
    as mapped here (this rank's own is the allocation)."""
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
        else:  # the bias on every rank, then summed: F.linear's, as the reference's
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
    """``g = sum over ranks of dy`` (pushed in chunks as the forward's partials), then ``(g @ weight, g^T @ x,
    g.sum(0))``, each chunk's ``g @ weight`` overlapping the next chunk's reduction (no ``g^T @ x`` without x)."""
    return _bwd(dy, x, weight, group_name)
