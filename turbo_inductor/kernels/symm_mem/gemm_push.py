"""GEMM + all-reduce of two ranks in one persistent Triton kernel that pushes its output tiles into the peer's
symmetric memory by TMA as it computes them (``impl="push"``, opt-in).

Each output tile has an owner, the rank that computes it second (of the designs measured, the fastest): rank 1 runs
the tiles from half-way, so each tile is computed early by one rank and half a kernel later by the other, its
owner. The early rank pushes its partial into the owner's buffer; the owner, half a kernel later, finds it landed,
adds it to its own partial (both rounded to the output dtype first, as GEMM then all-reduce rounds them), stores the
sum and pushes it back into the early rank's buffer, which copies it into its output: between its own tiles where
it has landed, the rest after its last tile. Each rank sends half its output twice (a reduce-scatter and an
all-gather, the least data an all-reduce can move) while its SMs compute: the TMA engine copies each tile from
shared memory to the peer asynchronously, and a tile's flag in the peer's memory is raised after the next tile's
GEMM, once the copy has completed, so no SM waits on NVLink. Both
ranks end with the owners' sums: the same bits on every rank. A tile's partial and final land in the same place
(the tiles a rank owns and those it does not are disjoint), so one buffer of the output's size suffices, for
successive calls too: a rank pushes call c + 1's partial of a tile its peer owns once it has every final of call c,
so after the peer's last read of that place in call c, and its final of a tile it owns once the peer's partial of
call c + 1 has come, so after the peer finished call c. Flags hold the number of the call that raised them: a
counter in device memory, advanced by the stream before each call, so that a CUDA graph's replays count too.

Measured on two H200s (``benchmarks/bench_gemm_allreduce.py``), compiled, calls back to back:
1.19-1.21x Inductor at 8192x4096x7168 (0.713-0.727 ms; the GEMM alone takes 0.60, and 0.61 as this kernel without
its pushes), 1.22-1.46x at 8192x4096x2048, 1.17-1.18x at 4096x4096x7168; the column-parallel backward's form
(x @ w) alike. Where the other 0.1 ms goes (the kernel timed without pushes, sums or copies): NVLink traffic
slows the GEMM by 0.03-0.055 ms whoever issues it (the copy engines too), the owners' waits and sums take 0.03,
the copies of the finals 0.02.

Opt-in, because a persistent kernel that waits on its peer can deadlock beside other kernels: if another kernel
(an NCCL collective on another stream) holds SMs on both GPUs while waiting on its own peer, programs of this
kernel that did not find an SM wait for it, and resident programs spin waiting for them. The grid leaves
``RESERVED_SMS`` SMs free so that small kernels beside it always find room; a larger one could still wait. Falls
back to GEMM then all-reduce (``kernels/reference``) where it cannot run or would lose: other than two ranks,
dtypes other than bf16/fp16, shapes TMA cannot address, outputs under ``MIN_OUTPUT_BYTES``.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ..reference import gemm_allreduce as sequential
from ..registry import implementation
from ..triton import interpreting, on_device
from . import symmetric_tensor
from . import unavailable_reason as symm_mem_unavailable_reason

log = logging.getLogger("turbo_inductor")
NAMESPACE = "turbo_inductor_symm_mem"
PRIORITY = -30
# BLOCK_M, BLOCK_N, BLOCK_K, stages, warps. Hopper's bf16 tiling from Triton's matmul tutorials; the TMA push stages
# a 64 KB tile in shared memory, beside which only 3 stages of 128x256 tiles fit (213 KB of 227).
TILE = (128, 256, 64, 3, 8)
GROUP_M = 8  # row tiles per group: consecutive programs share x's rows and w's columns in L2
RESERVED_SMS = 4
# Below this output size GEMM then all-reduce runs instead: the kernel won 1.09-1.16x at 8 MiB (1024x4096) and took
# twice GEMM then all-reduce's time at 2 MiB (256x4096x7168).
MIN_OUTPUT_BYTES = 8 << 20
INTERPRETED = tl.constexpr(interpreting())
# (cols, dtype, device, group) -> PeerBuffers; a key's buffers grow to the most rows asked for.
_BUFFERS: dict[tuple, PeerBuffers] = {}


@triton.jit
def _tile_origin(tile_id, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr):
    """A tile's first row and column, tiles in grouped order."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    group_size = GROUP * tiles_n
    first_m = (tile_id // group_size) * GROUP
    rows_in_group = min(tiles_m - first_m, GROUP)
    first_row = (first_m + (tile_id % group_size) % rows_in_group) * BLOCK_M
    first_col = ((tile_id % group_size) // rows_in_group) * BLOCK_N
    return first_row, first_col


@triton.jit
def _raise(flag_ptr, call):
    """Raise a flag to this call's number, after every thread's earlier stores (release, system scope). A maximum,
    so that a late flag of an earlier call never lowers it."""
    tl.debug_barrier()
    tl.atomic_max(flag_ptr, call, sem="release", scope="sys")


@triton.jit
def _landed(flag_ptr, call):
    """Whether a flag says this call (or a later one) has raised it, read once (acquire, system scope)."""
    return tl.atomic_cas(flag_ptr, -1, -1, sem="acquire", scope="sys") >= call


@triton.jit
def _wait(flag_ptr, call):
    """Wait until a flag says this call (or a later one) has raised it (acquire, system scope). The read is a
    compare-and-swap that never swaps (flags are never -1): it writes nothing, so it cannot undo a raise."""
    while not _landed(flag_ptr, call):
        pass


@triton.jit
def _proxy_fence(call, WAIT_PUSHES: tl.constexpr):
    """Order the TMA engine's copies (the async proxy) with the SM's flags (the generic proxy): ``WAIT_PUSHES``,
    before a raise, wait until this program's pushes have completed (their writes performed), as a release orders
    the SM's own stores only; else, after a wait, make the acquired data visible to the TMA loads that follow.
    ``call`` is only the inline assembly's operand (Triton's inline assembly takes at least one). The interpreter
    has no PTX and completes every copy at once."""
    if not INTERPRETED:
        if WAIT_PUSHES:
            tl.inline_asm_elementwise(
                "cp.async.bulk.wait_group 0;\n\tfence.proxy.async.global;\n\tmov.u32 $0, $1;",
                "=r,r",
                [call],
                dtype=tl.int32,
                is_pure=False,
                pack=1,
            )
        else:
            tl.inline_asm_elementwise(
                "fence.proxy.async.global;\n\tmov.u32 $0, $1;", "=r,r", [call], dtype=tl.int32, is_pure=False, pack=1
            )


@triton.jit
def _copy_final(recv_desc, out_desc, tile_id, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr):
    """Copy a tile's final sum, which the peer pushed into this rank's buffer, into the output (TMA both ways)."""
    first_row, first_col = _tile_origin(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP)
    out_desc.store([first_row, first_col], recv_desc.load([first_row, first_col]))


@triton.jit
def gemm_push_kernel(
    x_desc,
    w_desc,
    bias_ptr,
    out_desc,
    recv_desc,
    flags_ptr,
    peer_recv_desc,
    peer_flags_ptr,
    call_ptr,
    rank,
    M,
    N,
    K,
    HAS_BIAS: tl.constexpr,
    W_KN: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP: tl.constexpr,
    STAGES: tl.constexpr,
    PROGRAMS: tl.constexpr,
):
    """out = x @ w^T (+ bias) summed over two ranks, ``W_KN``: x @ w with w [K, N]. recv is this rank's buffer the
    peer pushes into (a partial where this rank owns the tile, the final sum where the peer does), flags its flag
    per tile; peer_recv_desc and peer_flags_ptr the peer's; call_ptr this call's number. Every tile moves through
    shared memory by TMA (the GEMM's operands, the peer's partial, the sum stored and pushed), so the epilogue's
    values stay in the MMA's registers: no layout conversion, and the SMs only issue the copies."""
    dtype = out_desc.dtype
    call = tl.load(call_ptr)
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    shift = tiles // 2 * rank  # rank 1 starts half-way
    # the index from which this rank computes its tiles second, and owns them: half, and for rank 1 tiles - half
    owned_from = tiles // 2 + rank * (tiles % 2)
    previous = -1  # the previous tile's flag, raised one tile late: its push has completed by then
    pending = tl.program_id(0)  # the next tile the peer owns whose final this program copies into the output
    for index in range(tl.program_id(0), tiles, PROGRAMS):
        tile_id = (index + shift) % tiles
        first_row, first_col = _tile_origin(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in tl.range(0, K, BLOCK_K, num_stages=STAGES):
            if W_KN:
                acc = tl.dot(x_desc.load([first_row, k]), w_desc.load([k, first_col]), acc)
            else:
                acc = tl.dot(x_desc.load([first_row, k]), w_desc.load([first_col, k]).T, acc)
        if HAS_BIAS:  # on every rank, then summed: F.linear's, as GEMM then all-reduce computes it
            cols = first_col + tl.arange(0, BLOCK_N)
            acc += tl.load(bias_ptr + cols, mask=cols < N).to(tl.float32)[None, :]
        partial = acc.to(dtype)
        if previous >= 0:
            _proxy_fence(call, WAIT_PUSHES=True)
            _raise(peer_flags_ptr + previous, call)
        if index < owned_from:
            peer_recv_desc.store([first_row, first_col], partial)
        else:
            _wait(flags_ptr + tile_id, call)
            _proxy_fence(call, WAIT_PUSHES=False)
            theirs = recv_desc.load([first_row, first_col])
            total = (partial.to(tl.float32) + theirs.to(tl.float32)).to(dtype)
            out_desc.store([first_row, first_col], total)
            peer_recv_desc.store([first_row, first_col], total)
            # The peer computes the tile at this rank's index i at its index i + tiles / 2: a final that has landed
            # is copied now, between GEMMs, rather than all of them after the last tile.
            if pending < owned_from:
                pending_tile = (pending + shift) % tiles
                if _landed(flags_ptr + pending_tile, call):
                    _proxy_fence(call, WAIT_PUSHES=False)
                    _copy_final(recv_desc, out_desc, pending_tile, M, N, BLOCK_M, BLOCK_N, GROUP)
                    pending += PROGRAMS
        previous = tile_id
    if previous >= 0:
        _proxy_fence(call, WAIT_PUSHES=True)
        _raise(peer_flags_ptr + previous, call)
    for index in range(pending, owned_from, PROGRAMS):  # the finals of the tiles the peer owns not yet copied
        tile_id = (index + shift) % tiles
        _wait(flags_ptr + tile_id, call)
        _proxy_fence(call, WAIT_PUSHES=False)
        _copy_final(recv_desc, out_desc, tile_id, M, N, BLOCK_M, BLOCK_N, GROUP)


def programs_for(tiles: int, sms: int) -> int:
    """The fewest programs, no more than ``sms - RESERVED_SMS``, that run the tiles in as many rounds as that many
    would (1024 tiles on 132 SMs: 128 programs of 8 tiles, as 128 would)."""
    most = max(1, min(tiles, sms - RESERVED_SMS))
    return triton.cdiv(tiles, triton.cdiv(tiles, most))


def launch(
    x: torch.Tensor,
    w: torch.Tensor,
    w_kn: bool,
    bias: Optional[torch.Tensor],
    out: torch.Tensor,
    recv: torch.Tensor,
    flags: torch.Tensor,
    peer_recv: torch.Tensor,
    peer_flags: torch.Tensor,
    call: torch.Tensor,
    rank: int,
    programs: int,
    tile: tuple = TILE,
) -> torch.Tensor:
    """One call of the kernel: ``out`` [M, N] = the sum over the two ranks of x @ w^T (``w_kn``: x @ w) + bias, with
    this rank's ``recv`` [M, N] and ``flags`` (a flag per tile) and the peer's (its memory as mapped here).
    ``call`` (one int32 in device memory) counts the calls from 1, the same on both ranks."""
    block_m, block_n, block_k, stages, warps = tile
    (M, K), N = x.shape, out.shape[1]
    x_desc = TensorDescriptor.from_tensor(x, [block_m, block_k])
    w_desc = TensorDescriptor.from_tensor(w, [block_k, block_n] if w_kn else [block_n, block_k])
    out_desc, recv_desc, peer_desc = (
        TensorDescriptor.from_tensor(t, [block_m, block_n]) for t in (out, recv, peer_recv)
    )
    with on_device(x.device):  # Triton launches on the current device, which need not be x's
        gemm_push_kernel[(programs,)](
            x_desc,
            w_desc,
            bias if bias is not None else out,
            out_desc,
            recv_desc,
            flags,
            peer_desc,
            peer_flags,
            call,
            rank,
            M,
            N,
            K,
            HAS_BIAS=bias is not None,
            W_KN=w_kn,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            BLOCK_K=block_k,
            GROUP=GROUP_M,
            STAGES=stages,
            PROGRAMS=programs,
            num_warps=warps,
        )
    return out


class PeerBuffers:
    """A group's receive buffer of [rows, cols], its flags, the peer's mappings of the same, and the call counter.
    Allocated and exchanged (a collective: every rank makes the same calls in the same order) at the first call of
    each width, and anew for more rows: eagerly, not while a CUDA graph is captured (a compiled graph's warm-up
    run allocates them)."""

    def __init__(self, rows: int, cols: int, dtype: torch.dtype, device: torch.device, group_name: str):
        tiles = triton.cdiv(rows, TILE[0]) * triton.cdiv(cols, TILE[1])
        self.rows, self.counter = rows, torch.zeros(1, dtype=torch.int32, device=device)
        handle, recv = symmetric_tensor((rows, cols), dtype, device, group_name)
        _, flags = symmetric_tensor((tiles,), torch.int32, device, group_name)
        self.rank = handle.rank
        self.recv, self.peer_recv = recv[self.rank], recv[1 - self.rank]
        self.flags, self.peer_flags = flags[self.rank].zero_(), flags[1 - self.rank]
        self.sms = torch.cuda.get_device_properties(device).multi_processor_count
        _meet(device, group_name)  # the flags are zero on both ranks before either raises one

    def __call__(
        self, x: torch.Tensor, w: torch.Tensor, w_kn: bool, bias: Optional[torch.Tensor], out: torch.Tensor
    ) -> torch.Tensor:
        M, N = out.shape
        self.counter += 1
        tiles = triton.cdiv(M, TILE[0]) * triton.cdiv(N, TILE[1])
        return launch(
            x,
            w,
            w_kn,
            bias,
            out,
            self.recv[:M],
            self.flags,
            self.peer_recv[:M],
            self.peer_flags,
            self.counter,
            self.rank,
            programs_for(tiles, self.sms),
        )

    def calls(self) -> int:
        """The calls so far (a device-to-host copy: for tests and benchmarks)."""
        return int(self.counter.item())


def _meet(device: torch.device, group_name: str) -> None:
    """Every kernel queued here has finished, and the peer has reached the same point."""
    torch.cuda.synchronize(device)
    torch.distributed.barrier(group=torch.distributed.distributed_c10d._resolve_process_group(group_name))


def peer_buffers(rows: int, cols: int, dtype: torch.dtype, device: torch.device, group_name: str) -> PeerBuffers:
    key = (cols, dtype, device, group_name)
    if (key not in _BUFFERS or _BUFFERS[key].rows < rows) and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"turbo_inductor: gemm_allreduce_fwd impl=push allocates its buffers for {rows} rows of "
            f"{cols} at the first such call, which cannot happen while a CUDA graph is captured: run "
            "one call of that size before capturing"
        )
    if key in _BUFFERS and _BUFFERS[key].rows < rows:
        _meet(device, group_name)  # neither rank's last call still pushes into the buffers freed here
        del _BUFFERS[key]
    if key not in _BUFFERS:
        _BUFFERS[key] = PeerBuffers(rows, cols, dtype, device, group_name)
    return _BUFFERS[key]


def _weight_form(weight: torch.Tensor) -> tuple[torch.Tensor, bool] | None:
    """``(w, w_kn)``: the linear weight [N, K] itself where it is row-major, or its transpose [K, N] where that is
    (the column-parallel backward passes ``weight.t()``); None where neither is."""
    if weight.stride(1) == 1 and weight.stride(0) == weight.shape[1]:
        return weight, False
    if weight.stride(0) == 1 and weight.stride(1) == weight.shape[0]:
        return weight.t(), True
    return None


@torch.library.custom_op(f"{NAMESPACE}::gemm_push_fwd", mutates_args=())
def _fwd(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], group_name: str) -> torch.Tensor:
    out = x.new_empty((x.shape[0], weight.shape[0]))
    w, w_kn = _weight_form(weight)
    # TMA reads from 16-byte aligned addresses: a view starting elsewhere is copied
    x, w = (t if t.data_ptr() % 16 == 0 else t.clone() for t in (x, w))
    return peer_buffers(x.shape[0], weight.shape[0], x.dtype, x.device, group_name)(x, w, w_kn, bias, out)


@_fwd.register_fake
def _(x, weight, bias, group_name):
    return x.new_empty((x.shape[0], weight.shape[0]))


def declines(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], group_name: str) -> str | None:
    """Why the kernel does not take these arguments (GEMM then all-reduce runs instead), or None."""
    world = torch.distributed.distributed_c10d._resolve_process_group(group_name).size()
    if world != 2:
        return f"a group of two ranks (the owners' design), got {world}"
    if x.dtype not in (torch.bfloat16, torch.float16):
        return f"bf16 or fp16 (tensor cores without tf32's rounding), got {x.dtype}"
    rows, cols = int(x.shape[0]), weight.shape[0]
    if x.shape[1] % 8 or cols % 8 or _weight_form(weight) is None or x.stride(1) != 1:
        return "row-major x and weight with K and N multiples of 8 (TMA's 16-byte strides)"
    if rows * cols * x.element_size() < MIN_OUTPUT_BYTES:
        return f"outputs of at least {MIN_OUTPUT_BYTES >> 20} MiB (smaller ones are not measured)"
    return None


def unavailable_reason(device: torch.device) -> str | None:
    reason = symm_mem_unavailable_reason(device)
    if reason is None and (torch.version.hip or torch.cuda.get_device_capability() < (9, 0)):
        return "TMA pushes need an NVIDIA GPU of compute capability 9.0 or newer"
    return reason


@implementation("gemm_allreduce_fwd", "push", priority=PRIORITY, unavailable_reason=unavailable_reason)
def gemm_allreduce_fwd(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, group_name: str
) -> torch.Tensor:
    """The kernel where it takes the arguments, else GEMM then all-reduce (decided per shape when traced)."""
    reason = declines(x, weight, bias, group_name)
    if reason is not None:
        log.debug("turbo_inductor: gemm_allreduce_fwd impl=push runs GEMM then all-reduce: it takes %s", reason)
        return sequential.gemm_allreduce_fwd(x, weight, bias, group_name)
    return _fwd(x, weight, bias, group_name)
