"""GEMM + all-reduce overlapped by chunks of rows, in functional collectives: each chunk's all-reduce is issued as
soon as its GEMM is done and waited for only at the end, so the collective (on the process group's stream) runs
while the next chunk's GEMM computes. The backward is the mirror image: every chunk of dy is all-reduced, and
each chunk's dx GEMM starts once its chunk arrived; dweight is one GEMM over all of them (the same GEMM as
unfused, so the same numerics). Traced into the compiled graph: no host work per call.

Opt-in (``impl="overlap"``, priority below the reference): an earlier form, which drove the ProcessGroup from
Python with a host-synchronizing shape check per call, measured 0.37-0.69x Inductor on two H200s
(``benchmarks/bench_gemm_allreduce.py``). Below CHUNK_MIN_ROWS rows per chunk or CHUNK_MIN_BYTES of
output, chunking cannot pay for its extra launches and smaller GEMMs, and the sequential reference runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..reference import gemm_allreduce as sequential
from ..reference.gemm_allreduce import start_all_reduce, wait
from ..registry import implementation
from . import unavailable_reason

CHUNKS = 4
CHUNK_MIN_ROWS = 256
CHUNK_MIN_BYTES = 8 << 20
PRIORITY = -10


def row_chunks(rows: int, row_bytes: int, chunks: int = CHUNKS) -> list[tuple[int, int]]:
    """(start, stop) row ranges, ``chunks`` of them; a single range where chunking would not pay."""
    if rows < chunks * CHUNK_MIN_ROWS or rows * row_bytes < CHUNK_MIN_BYTES:
        return [(0, rows)]
    step = -(-rows // chunks)
    return [(start, min(start + step, rows)) for start in range(0, rows, step)]


@implementation("gemm_allreduce_fwd", "overlap", priority=PRIORITY, unavailable_reason=unavailable_reason)
def gemm_allreduce_fwd(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, group_name: str
) -> torch.Tensor:
    # Chunk sizes set the graph's structure: a compiled graph specializes on the row count.
    chunks = row_chunks(int(x.shape[0]), weight.shape[0] * x.element_size())
    if len(chunks) == 1:
        return sequential.gemm_allreduce_fwd(x, weight, bias, group_name)
    pending = [start_all_reduce(F.linear(x[start:stop], weight, bias), group_name) for start, stop in chunks]
    return torch.cat([wait(p) for p in pending])


@implementation("gemm_allreduce_bwd", "overlap", priority=PRIORITY, unavailable_reason=unavailable_reason)
def gemm_allreduce_bwd(dy: torch.Tensor, x: torch.Tensor | None, weight: torch.Tensor, group_name: str):
    chunks = row_chunks(int(dy.shape[0]), max(dy.shape[1], weight.shape[1]) * dy.element_size())
    if len(chunks) == 1:
        return sequential.gemm_allreduce_bwd(dy, x, weight, group_name)
    pending = [start_all_reduce(dy[start:stop], group_name) for start, stop in chunks]
    g_chunks = [wait(p) for p in pending]
    dx = torch.cat([g @ weight for g in g_chunks])
    g = torch.cat(g_chunks)
    return dx, sequential.weight_grad(g, x, weight), g.sum(0)
