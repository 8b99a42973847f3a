"""GEMM + all-reduce of two ranks in one persistent Triton kernel (``impl="push"``, opt-in).
It pushes output tiles by TMA into the peer's symmetric memory. Its waits for the peer are bounded: where one gives
up, the tile is NaN and the rank's next call raises, naming the peer and the shapes.
Design, flags and deadlock risk: docs/kernels.md, GEMM + all-reduce.
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
# BLOCK_M, BLOCK_N, BLOCK_K, stages, warps: Hopper's bf16 tiling from Triton's matmul tutorials.
# The TMA push stages a 64 KB tile in shared memory. Beside it only 3 stages fit (213 of 227 KB).
TILE = (128, 256, 64, 3, 8)
GROUP_M = 8  # row tiles per group: neighbouring programs share operands in L2
RESERVED_SMS = 4  # left free, so that small kernels beside this one find room
# Smaller outputs run GEMM then all-reduce. On two H200s the kernel won 1.09-1.16x at 8 MiB.
# At 2 MiB it took twice as long.
MIN_OUTPUT_BYTES = 8 << 20
# Flag reads a program makes, in all its waits of one call, before it gives up on the peer. A count, not a clock:
# every thread of a program reads the same flags, so all leave the loop at the same read. 2^30 system-scope reads
# take minutes, longer than a peer may spend compiling before it makes the call.
MAX_FLAG_READS = 1 << 30
INTERPRETED = tl.constexpr(interpreting())
# (cols, dtype, device, group) -> PeerBuffers. A key's buffers grow to the most rows asked for.
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
    """Raises a flag to this call's number after all threads' earlier stores (release, system scope).
    A max: a late raise from an earlier call never lowers it."""
    tl.debug_barrier()
    tl.atomic_max(flag_ptr, call, sem="release", scope="sys")


@triton.jit
def _landed(flag_ptr, call):
    """Whether this call or a later one raised the flag. One acquire read, at system scope."""
    return tl.atomic_cas(flag_ptr, -1, -1, sem="acquire", scope="sys") >= call


@triton.jit
def _wait(flag_ptr, call, reads_left):
    """Spins until this call or a later one raised the flag, or ``reads_left`` more reads found it low.
    Returns (whether it landed, the reads left). Each read is ``_landed``'s: one acquire at system scope."""
    landed = _landed(flag_ptr, call)
    while (not landed) and (reads_left > 0):
        reads_left -= 1
        landed = _landed(flag_ptr, call)
    return landed, reads_left


@triton.jit
def _gave_up(landed, gave_up_ptr, call):
    """Where a wait gave up, records the call's number for the host (its next call raises)."""
    if not landed:
        tl.atomic_max(gave_up_ptr, call)


@triton.jit
def _proxy_fence(call, WAIT_PUSHES: tl.constexpr):
    """Orders the TMA engine's copies (async proxy) with the flags (generic proxy).
    ``WAIT_PUSHES``, before a raise: wait for this program's pushes. A release orders only SM stores.
    Else, after a wait: make the acquired data visible to later TMA loads."""
    # The interpreter has no PTX and completes every copy at once.
    # ``call`` is a dummy operand: Triton's inline assembly needs at least one.
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
def _copy_final(
    recv_desc, out_desc, tile_id, landed, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr
):
    """Copies a tile's final sum, pushed by the peer into this rank's buffer, to the output. NaN where it never
    ``landed``."""
    first_row, first_col = _tile_origin(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP)
    final = recv_desc.load([first_row, first_col]).to(tl.float32)
    out_desc.store([first_row, first_col], tl.where(landed, final, float("nan")).to(out_desc.dtype))


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
    gave_up_ptr,
    max_reads,
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
    """Sums ``x @ w^T (+ bias)`` over two ranks; with ``W_KN``, w is [K, N]. ``recv_desc`` is this rank's buffer.
    The peer pushes partials of tiles this rank owns there, and sums of tiles it owns. ``flags_ptr`` flags each.
    ``peer_*`` are the peer's. Tiles move by TMA, so the epilogue stays in the MMA's registers.
    A program's waits read flags at most ``max_reads`` times in all. Where one gives up, its tile is NaN and
    ``gave_up_ptr`` gets the call's number."""
    dtype = out_desc.dtype
    call = tl.load(call_ptr)
    reads_left = max_reads
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    shift = tiles // 2 * rank  # rank 1 starts half-way
    # From this index on, this rank computes its tiles second and owns them.
    owned_from = tiles // 2 + rank * (tiles % 2)
    previous = -1  # its flag is raised one tile late, once its push has completed
    pending = tl.program_id(0)  # the next peer-owned tile whose final sum this program copies out
    for index in range(tl.program_id(0), tiles, PROGRAMS):
        tile_id = (index + shift) % tiles
        first_row, first_col = _tile_origin(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in tl.range(0, K, BLOCK_K, num_stages=STAGES):
            if W_KN:
                acc = tl.dot(x_desc.load([first_row, k]), w_desc.load([k, first_col]), acc)
            else:
                acc = tl.dot(x_desc.load([first_row, k]), w_desc.load([first_col, k]).T, acc)
        if HAS_BIAS:  # on every rank, then summed, as GEMM then all-reduce computes it
            cols = first_col + tl.arange(0, BLOCK_N)
            acc += tl.load(bias_ptr + cols, mask=cols < N).to(tl.float32)[None, :]
        partial = acc.to(dtype)
        if previous >= 0:
            _proxy_fence(call, WAIT_PUSHES=True)
            _raise(peer_flags_ptr + previous, call)
        if index < owned_from:
            peer_recv_desc.store([first_row, first_col], partial)
        else:
            landed, reads_left = _wait(flags_ptr + tile_id, call, reads_left)
            _gave_up(landed, gave_up_ptr, call)
            _proxy_fence(call, WAIT_PUSHES=False)
            theirs = recv_desc.load([first_row, first_col])
            total = tl.where(landed, partial.to(tl.float32) + theirs.to(tl.float32), float("nan")).to(dtype)
            out_desc.store([first_row, first_col], total)
            peer_recv_desc.store([first_row, first_col], total)
            # The peer computes this rank's index i at its index i + tiles / 2.
            # Finals that have landed are copied now, between GEMMs, not after the last tile.
            if pending < owned_from:
                pending_tile = (pending + shift) % tiles
                landed = _landed(flags_ptr + pending_tile, call)
                if landed:
                    _proxy_fence(call, WAIT_PUSHES=False)
                    _copy_final(recv_desc, out_desc, pending_tile, landed, M, N, BLOCK_M, BLOCK_N, GROUP)
                    pending += PROGRAMS
        previous = tile_id
    if previous >= 0:
        _proxy_fence(call, WAIT_PUSHES=True)
        _raise(peer_flags_ptr + previous, call)
    for index in range(pending, owned_from, PROGRAMS):  # finals of peer-owned tiles not copied yet
        tile_id = (index + shift) % tiles
        landed, reads_left = _wait(flags_ptr + tile_id, call, reads_left)
        _gave_up(landed, gave_up_ptr, call)
        _proxy_fence(call, WAIT_PUSHES=False)
        _copy_final(recv_desc, out_desc, tile_id, landed, M, N, BLOCK_M, BLOCK_N, GROUP)


def programs_for(tiles: int, sms: int) -> int:
    """The fewest programs, at most ``sms - RESERVED_SMS``, that need no more rounds than that many.
    1024 tiles on 132 SMs: 128 programs of 8 tiles."""
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
    gave_up: torch.Tensor,
    rank: int,
    programs: int,
    tile: tuple = TILE,
    max_reads: int = MAX_FLAG_READS,
) -> torch.Tensor:
    """One call of the kernel: ``out = x @ w^T + bias`` summed over both ranks (``w_kn``: ``x @ w``).
    ``recv`` and ``flags`` are this rank's; ``peer_*`` the peer's, as mapped here.
    ``call`` is a device int32 counting calls from 1, equal on both ranks. ``gave_up``, a device int32, gets the
    call's number where a wait for the peer gave up after ``max_reads`` flag reads (its tiles are NaN)."""
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
            gave_up,
            max_reads,
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
    """A group's receive buffer and flags, the peer's mappings of both, and the call counter.
    Allocated collectively (:meth:`allocate`) at the first call of each width, and again for more rows.
    Never during CUDA graph capture: a compiled graph's warm-up run allocates them."""

    def __init__(
        self,
        recv: torch.Tensor,
        flags: torch.Tensor,
        peer_recv: torch.Tensor,
        peer_flags: torch.Tensor,
        rank: int,
        sms: int,
        group_name: str,
    ):
        device = recv.device
        self.recv, self.flags, self.peer_recv, self.peer_flags = recv, flags, peer_recv, peer_flags
        self.rows, self.rank, self.sms, self.group_name = recv.shape[0], rank, sms, group_name
        self.counter = torch.zeros(1, dtype=torch.int32, device=device)
        # The number of a call whose wait gave up, set by the kernel; the host reads it at the next call.
        self.gave_up = torch.zeros(1, dtype=torch.int32, device=device)
        on_gpu = device.type == "cuda"
        self.gave_up_here = torch.zeros(1, dtype=torch.int32, pin_memory=on_gpu)
        self.copied = torch.cuda.Event() if on_gpu else None
        self.last_call = ""

    @classmethod
    def allocate(cls, rows: int, cols: int, dtype: torch.dtype, device: torch.device, group_name: str) -> PeerBuffers:
        tiles = triton.cdiv(rows, TILE[0]) * triton.cdiv(cols, TILE[1])
        handle, recv = symmetric_tensor((rows, cols), dtype, device, group_name)
        _, flags = symmetric_tensor((tiles,), torch.int32, device, group_name)
        rank, sms = handle.rank, torch.cuda.get_device_properties(device).multi_processor_count
        buffers = cls(recv[rank], flags[rank].zero_(), recv[1 - rank], flags[1 - rank], rank, sms, group_name)
        _meet(device, group_name)  # the flags are zero on both ranks before either raises one
        return buffers

    def __call__(
        self, x: torch.Tensor, w: torch.Tensor, w_kn: bool, bias: Optional[torch.Tensor], out: torch.Tensor
    ) -> torch.Tensor:
        capturing = self.copied is not None and torch.cuda.is_current_stream_capturing()
        if not capturing:
            self._check_the_peer_came()
        M, N = out.shape
        self.counter += 1
        tiles = triton.cdiv(M, TILE[0]) * triton.cdiv(N, TILE[1])
        launch(
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
            self.gave_up,
            self.rank,
            programs_for(tiles, self.sms),
            TILE,
            MAX_FLAG_READS,
        )
        self.last_call = f"x [{M}, {x.shape[1]}] times weight [{N}, {x.shape[1]}]"
        if self.copied is not None and not capturing:  # read at the next call, without waiting for this one now
            self.gave_up_here.copy_(self.gave_up, non_blocking=True)
            self.copied.record()
        return out

    def _check_the_peer_came(self) -> None:
        """Raise where a wait of an earlier call gave up on the peer. It waits for the last call to finish.
        The buffers are out of step after that, so every later call raises too."""
        if self.copied is not None:
            self.copied.synchronize()
            call = int(self.gave_up_here.item())
        else:
            call = int(self.gave_up.item())
        if call:
            raise RuntimeError(
                f"turbo_inductor: gemm_allreduce_fwd impl=push: rank {self.rank} of group {self.group_name!r} gave "
                f"up waiting for rank {1 - self.rank} in its call {call} (this rank's last call: {self.last_call}); "
                "that call's output is NaN. The peer did not make the same call: the ranks disagree on the shapes, "
                "or the peer stopped. The group's push buffers are out of step: restart the ranks"
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
        _BUFFERS[key] = PeerBuffers.allocate(rows, cols, dtype, device, group_name)
    return _BUFFERS[key]


def _weight_form(weight: torch.Tensor) -> tuple[torch.Tensor, bool] | None:
    """``(w, w_kn)``: the row-major weight [N, K], or its row-major transpose [K, N] with ``w_kn``.
    The column-parallel backward passes ``weight.t()``. None when neither is row-major."""
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
    """Why the kernel declines these arguments, or None. Declined calls run GEMM then all-reduce."""
    world = torch.distributed.distributed_c10d._resolve_process_group(group_name).size()
    if world != 2:
        return f"a group of two ranks (the owners' design), got {world}"
    if x.dtype not in (torch.bfloat16, torch.float16):
        return f"bf16 or fp16 (tensor cores without tf32's rounding), got {x.dtype}"
    rows, cols = int(x.shape[0]), weight.shape[0]
    if x.shape[1] % 8 or cols % 8 or _weight_form(weight) is None or x.stride(1) != 1:
        return "row-major x and weight with K and N multiples of 8 (TMA's 16-byte strides)"
    if rows * cols * x.element_size() < MIN_OUTPUT_BYTES:
        return f"outputs of at least {MIN_OUTPUT_BYTES >> 20} MiB"
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
    """The kernel where it takes the arguments, else GEMM then all-reduce. Traced, this is decided per shape."""
    reason = declines(x, weight, bias, group_name)
    if reason is not None:
        log.debug("turbo_inductor: gemm_allreduce_fwd impl=push runs GEMM then all-reduce: it takes %s", reason)
        return sequential.gemm_allreduce_fwd(x, weight, bias, group_name)
    return _fwd(x, weight, bias, group_name)
