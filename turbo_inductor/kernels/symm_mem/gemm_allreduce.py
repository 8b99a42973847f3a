"""GEMM + all-reduce through symmetric memory: the GEMM writes its output straight into this rank's symmetric
buffer, and one kernel, ``symm_mem.one_shot_all_reduce_out``, reads every rank's buffer over peer access and sums
(no NCCL, no staging copy; the kernel first waits, through the buffers' signal pads, until every rank has
reached it, so it reads finished GEMM outputs). In row chunks (``collective.row_chunks``) each chunk's reduction
runs on a side stream while the next chunk's GEMM computes. The backward reduces dy the same way (the one-shot
kernel copies dy into the symmetric buffer itself) before the GEMMs.

Buffers are allocated and exchanged (``rendezvous``, a collective: every rank makes the same calls in the same
order, as it must for any collective) at the first call of each shape, two per shape and chunk, used in turn: a
rank can start writing its next buffer while a slower peer still reads the last one, but not the one before (that
peer's next reduction waits for this rank first).

The work is runtime state, so it runs in two operators of their own, ``turbo_inductor_symm_mem::gemm_allreduce_fwd``
and ``_bwd`` (fakes give their shapes), which a compiled graph calls as extern kernels: the implementation traces
into the graph as that call, as the native kernels' do, and the op's eager rank check stays out of compiled code.
Opt-in (``impl="symm_mem"``, below the reference) until measured on two GPUs; ``autotune`` never chooses among
collective implementations (``registry.collective``).
"""
from __future__ import annotations

import collections
import functools
import warnings
from typing import Optional

import torch

from ..collective.gemm_allreduce import row_chunks
from ..registry import implementation
from . import unavailable_reason

PRIORITY = -20
NAMESPACE = "turbo_inductor_symm_mem"
# (rows, cols, dtype, device, group, chunk) -> the two buffers used in turn; and how many calls each key had.
_BUFFERS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
USES: collections.Counter = collections.Counter()


def _symmetric_buffer(rows: int, cols: int, dtype: torch.dtype, device: torch.device, group_name: str,
                      chunk: int) -> torch.Tensor:
    from torch.distributed import _symmetric_memory as symm_mem

    key = (rows, cols, dtype, device, group_name, chunk)
    if key not in _BUFFERS:
        with warnings.catch_warnings():  # needed on older torch, deprecated (a no-op) on newer
            warnings.simplefilter("ignore", FutureWarning)
            symm_mem.enable_symm_mem_for_group(group_name)
        pair = tuple(symm_mem.empty(rows, cols, dtype=dtype, device=device) for _ in range(2))
        for buffer in pair:
            symm_mem.rendezvous(buffer, group_name)
        _BUFFERS[key] = pair
    USES[key] += 1
    return _BUFFERS[key][USES[key] % 2]


@functools.lru_cache(maxsize=None)
def _side_stream(device: torch.device) -> torch.cuda.Stream:
    return torch.cuda.Stream(device)


@torch.library.custom_op(f"{NAMESPACE}::gemm_allreduce_fwd", mutates_args=())
def _fwd(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], group_name: str) -> torch.Tensor:
    rows, cols = x.shape[0], weight.shape[0]
    out = torch.empty((rows, cols), dtype=x.dtype, device=x.device)
    chunks = row_chunks(rows, cols * x.element_size())
    main, side = torch.cuda.current_stream(x.device), _side_stream(x.device)
    for n, (start, stop) in enumerate(chunks):
        buffer = _symmetric_buffer(stop - start, cols, x.dtype, x.device, group_name, n)
        if bias is None:
            torch.mm(x[start:stop], weight.t(), out=buffer)
        else:  # the bias on every rank, then summed: F.linear's, as the reference's
            torch.addmm(bias, x[start:stop], weight.t(), out=buffer)
        if len(chunks) == 1:
            torch.ops.symm_mem.one_shot_all_reduce_out(buffer, "sum", group_name, out)
            return out
        side.wait_stream(main)  # this chunk's GEMM is done (and the chunks before it)
        with torch.cuda.stream(side):
            torch.ops.symm_mem.one_shot_all_reduce_out(buffer, "sum", group_name, out[start:stop])
    main.wait_stream(side)  # out is read on the main stream only after every chunk's reduction
    return out


@_fwd.register_fake
def _(x, weight, bias, group_name):
    return x.new_empty((x.shape[0], weight.shape[0]))


@torch.library.custom_op(f"{NAMESPACE}::gemm_allreduce_bwd", mutates_args=())
def _bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
         group_name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    buffer = _symmetric_buffer(dy.shape[0], dy.shape[1], dy.dtype, dy.device, group_name, 0)
    g = torch.empty_like(dy)
    torch.ops.symm_mem.one_shot_all_reduce_copy_out(buffer, dy, "sum", group_name, g)
    return g @ weight, g.t() @ x, g.sum(0)


@_bwd.register_fake
def _(dy, x, weight, group_name):
    return x.new_empty(x.shape), weight.new_empty(weight.shape), weight.new_empty(weight.shape[0])


@implementation("gemm_allreduce_fwd", "symm_mem", priority=PRIORITY, unavailable_reason=unavailable_reason)
def gemm_allreduce_fwd(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                       group_name: str) -> torch.Tensor:
    return _fwd(x, weight, bias, group_name)


@implementation("gemm_allreduce_bwd", "symm_mem", priority=PRIORITY, unavailable_reason=unavailable_reason)
def gemm_allreduce_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, group_name: str):
    """``g = sum over ranks of dy`` (one-shot, from symmetric memory), then ``(g @ weight, g^T @ x, g.sum(0))``."""
    return _bwd(dy, x, weight, group_name)
