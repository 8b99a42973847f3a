"""GEMM + all-reduce overlapped in row chunks through functional collectives (``impl="overlap"``, opt-in).
Each chunk's all-reduce starts when its GEMM ends and runs during the next GEMM.
See docs/kernels.md, GEMM + all-reduce.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..reference import gemm_allreduce as sequential
from ..reference.gemm_allreduce import start_all_reduce, wait
from ..registry import implementation
from . import unavailable_reason

CHUNKS = 4
# Smaller chunks cannot pay for their extra launches and smaller GEMMs.
CHUNK_MIN_ROWS = 256
CHUNK_MIN_BYTES = 8 << 20
PRIORITY = -10  # opt-in: below the reference


def row_chunks(rows: int, row_bytes: int, chunks: int = CHUNKS) -> list[tuple[int, int]]:
    """``chunks`` (start, stop) row ranges. One range where chunking would not pay."""
    if rows < chunks * CHUNK_MIN_ROWS or rows * row_bytes < CHUNK_MIN_BYTES:
        return [(0, rows)]
    step = -(-rows // chunks)
    return [(start, min(start + step, rows)) for start in range(0, rows, step)]


@implementation("gemm_allreduce_fwd", "overlap", priority=PRIORITY, unavailable_reason=unavailable_reason)
def gemm_allreduce_fwd(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, group_name: str
) -> torch.Tensor:
    # The row count sets the chunks, so compiled graphs specialize on it.
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
