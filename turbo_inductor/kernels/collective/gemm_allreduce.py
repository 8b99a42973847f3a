"""GEMM + all-reduce overlapped: the rows are cut into chunks, and each chunk's all-reduce runs (asynchronously, on
the process group's own stream) while the next chunk's GEMM computes. The backward does the mirror image: each
chunk of dy is all-reduced while the previous chunk's dx GEMM runs; dweight is one GEMM once every chunk arrived
(the same GEMM as unfused, so the same numerics).

Below CHUNK_MIN_ROWS rows per chunk or CHUNK_MIN_BYTES of output, chunking cannot pay for its extra launches and
smaller GEMMs: the sequential reference runs instead, so this is never the slower choice by construction there.
Where exactly overlap starts to pay is measured on the GPU (benchmarks/bench_gemm_allreduce.py).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..reference import gemm_allreduce as sequential
from ..registry import implementation, never
from . import unavailable_reason

CHUNKS = 4
CHUNK_MIN_ROWS = 256
CHUNK_MIN_BYTES = 8 << 20


def row_chunks(rows: int, row_bytes: int) -> list[tuple[int, int]]:
    """(start, stop) row ranges, one per chunk; a single range where chunking would not pay."""
    if rows < CHUNKS * CHUNK_MIN_ROWS or rows * row_bytes < CHUNK_MIN_BYTES:
        return [(0, rows)]
    step = -(-rows // CHUNKS)
    return [(start, min(start + step, rows)) for start in range(0, rows, step)]


@implementation("gemm_allreduce_fwd", "overlap", priority=10, unavailable_reason=unavailable_reason,
                traceable=never)
def gemm_allreduce_fwd(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, group) -> torch.Tensor:
    chunks = row_chunks(x.shape[0], weight.shape[0] * x.element_size())
    if len(chunks) == 1:
        return sequential.gemm_allreduce_fwd(x, weight, bias, group)
    out = x.new_empty((x.shape[0], weight.shape[0]))
    works = []
    for start, stop in chunks:
        rows = out[start:stop]  # rows of a row-major matrix: contiguous
        if bias is None:
            torch.mm(x[start:stop], weight.t(), out=rows)
        else:
            torch.addmm(bias, x[start:stop], weight.t(), out=rows)
        works.append(dist.all_reduce(rows, group=group, async_op=True))
    for work in works:
        work.wait()
    return out


@implementation("gemm_allreduce_bwd", "overlap", priority=10, unavailable_reason=unavailable_reason,
                traceable=never)
def gemm_allreduce_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, group):
    chunks = row_chunks(dy.shape[0], max(dy.shape[1], weight.shape[1]) * dy.element_size())
    if len(chunks) == 1:
        return sequential.gemm_allreduce_bwd(dy, x, weight, group)
    g = dy.clone()
    works = [dist.all_reduce(g[start:stop], group=group, async_op=True) for start, stop in chunks]
    dx = dy.new_empty((dy.shape[0], weight.shape[1]))
    for (start, stop), work in zip(chunks, works):
        work.wait()
        torch.mm(g[start:stop], weight, out=dx[start:stop])
    return dx, g.t() @ x, g.sum(0)
