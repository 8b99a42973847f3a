"""Probe for issue #6: can a GEMM that pushes its output tiles into the peer's memory from its epilogue reach
1.35x over mm then all-reduce? Not wired into the backend: this measures designs before one is built.

The kernels are persistent Triton GEMMs (one program per SM, tiles in grouped order, x and w loaded by TMA
descriptors; y = x @ w^T) on two ranks, moving data by stores from the SMs into the peer's symmetric buffers
(NVLink), with a flag per tile raised in the peer's flags (release, system scope) one tile after the tile's stores,
when they have landed, so that raising it does not wait on NVLink. Flags hold the number of the call that raised
them (waits are for "at least this call"); two sets of receive buffers are used in turn by successive calls: a rank
that finishes call c has every peer tile of call c, so the peer is past its call c - 1 and no longer reads the
buffers that call c + 1 writes.

- design "all": every tile's partial is stored locally and pushed; two tiles later the program adds the peer's
  partial of that tile into its output. Measured (eleventh session, 8192x4096x7168): 1.13-1.16x over mm then
  NCCL all-reduce. The epilogue's stores and adds stall the SMs: the same kernel pushing into its own buffer (no
  NVLink) is as slow, and pushing without the add (a timing variant since removed) costs 0.11 ms over the GEMM
  alone (0.60-0.62 ms, cuBLAS's speed).
- design "owner": rank 1 runs the tiles from half-way, so each tile is computed early by one rank and half a kernel
  later by the other, its owner. The early rank only pushes its partial; the owner finds it landed, adds it into
  its own tile in registers and pushes the sum back. Each rank sends half its output twice (a reduce-scatter and an
  all-gather). Measured (twelfth session): 1.10-1.13x at 8192x4096x7168, as "all": the stall is the stores.
- design "comm": the GEMM's programs only store their tiles (a plain GEMM's epilogue) and COMM_PROGRAMS programs
  more move them to the peer as they are produced (reduce-scatter by tile ownership, add, all-gather). Measured
  (twelfth session, 8192x4096x7168): 2.27 ms with 4 comm programs, 1.25 with 8, 0.76 with 16 (1.15x): an SM moves
  about 7 GB/s into the peer's memory this way (a flag raised per tile), so hiding the 64 MiB each rank sends
  under 0.6 ms takes 16 SMs, and a GEMM on the other 116 needs a ninth wave of tiles. Stores from the SMs cannot
  carry this all-reduce under the GEMM's time: the copy engines or TMA stores would have to.
- design "owner" with TMA pushes (``tma=True``; written in the twelfth session after its last call, CPU-tested and
  compiled for sm_90, not measured): the pushes are the TMA engine's bulk copies from shared memory into the peer's
  memory, asynchronous, so the program computes its next tile while they fly; each flag waits for its copies'
  completion. The staging takes 64 KB of shared memory: 213 KB in all with 3 stages of 128x256 tiles (4 do not fit).
- the copy engines (``CopyEnginePipeline``): chunked cuBLAS GEMMs, each chunk copied to the peer by a copy engine,
  issued from Python and replayed as a CUDA graph, for the design's GPU time without the host's.

    torchrun --nproc-per-node 2 benchmarks/probe_gemm_push.py [--shapes 8192x4096x7168,...]
    TRITON_INTERPRET=1 python benchmarks/probe_gemm_push.py --selftest   # CPU (the CI runs it)

Rank 0 prints, per shape M x N x K and per form (a linear's forward x @ w^T, w [N, K]; its input gradient's x @ w,
w [K, N], as the column-parallel backward reduces it): cuBLAS mm, the Triton GEMM alone (each tile configuration,
for the first form), mm then NCCL all-reduce, and each design, in ms (median per call of calls issued back to
back), with the speedup over mm then all-reduce, and the designs' largest difference from it.
"""
from __future__ import annotations

import argparse
import functools
import os
import time

import torch
import triton
import triton.language as tl

# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps): Hopper bf16 tilings from Triton's matmul tutorials. The first
# call measured a kernel loading through pointer tensors too: 1.3x cuBLAS's time at best, so x and w are loaded by
# TMA descriptors. A TMA store for the push did not fit in shared memory beside 4 stages of 128x256 tiles.
CONFIGS = [(128, 256, 64, 3, 8), (128, 128, 64, 4, 8), (256, 128, 64, 3, 8), (128, 256, 64, 4, 8)]
GROUP_M = 8  # row tiles per group: consecutive programs share x's rows and w's columns in L2
INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")
# Arguments whose values change between calls. Triton compiles a kernel anew for an int argument equal to 1 or
# divisible by 16: the call counter reached those inside timing loops, and each such compile (seconds) made that
# loop's calls take 10-40 ms on average (the eleventh and twelfth sessions' "not understood" slow runs).
CHANGING = ["call", "rank"]


@triton.jit
def _tile_offsets(tile_id, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr):
    """A tile's first row and column (tiles in grouped order), its offsets into [M, N] and their mask."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    group_size = GROUP * tiles_n
    first_m = (tile_id // group_size) * GROUP
    rows_in_group = min(tiles_m - first_m, GROUP)
    first_row = (first_m + (tile_id % group_size) % rows_in_group) * BLOCK_M
    first_col = ((tile_id % group_size) // rows_in_group) * BLOCK_N
    rows = first_row + tl.arange(0, BLOCK_M)
    cols = first_col + tl.arange(0, BLOCK_N)
    return first_row, first_col, rows[:, None] * N + cols[None, :], (rows[:, None] < M) & (cols[None, :] < N)


@triton.jit
def _descriptors(x_ptr, w_ptr, M, N, K, W_KN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    """TMA descriptors of x [M, K] and of w: [N, K] (y = x @ w^T, a linear's forward) or, with ``W_KN``, [K, N]
    (y = x @ w: a linear's input gradient dy @ W, the column-parallel backward's GEMM)."""
    x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
    if W_KN:
        w_desc = tl.make_tensor_descriptor(w_ptr, shape=[K, N], strides=[N, 1], block_shape=[BLOCK_K, BLOCK_N])
    else:
        w_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[K, 1], block_shape=[BLOCK_N, BLOCK_K])
    return x_desc, w_desc


@triton.jit
def _tile_product(x_desc, w_desc, first_row, first_col, K, W_KN: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        if W_KN:
            acc = tl.dot(x_desc.load([first_row, k]), w_desc.load([k, first_col]), acc)
        else:
            acc = tl.dot(x_desc.load([first_row, k]), w_desc.load([first_col, k]).T, acc)
    return acc


@triton.jit
def _raise(flag_ptr, call):
    """Raise a flag to this call's number, after every thread's earlier stores (release, system scope). A maximum,
    so that a late flag of an earlier call never lowers it."""
    tl.debug_barrier()
    tl.atomic_max(flag_ptr, call, sem="release", scope="sys")


@triton.jit
def _wait(flag_ptr, call):
    """Wait until a flag says this call (or a later one) has raised it (acquire, system scope). The read is a
    compare-and-swap that never swaps (flags are never -1): it writes nothing, so it cannot undo a raise."""
    while tl.atomic_cas(flag_ptr, -1, -1, sem="acquire", scope="sys") < call:
        pass


@triton.jit
def _pushes_landed(call, TMA: tl.constexpr):
    """With TMA pushes, wait until this program's bulk copies have completed (their writes performed), so that a
    flag raised next covers them: a release orders the SM's own stores, not the TMA engine's. The interpreter has
    no PTX and completes every store at once."""
    if TMA and not INTERPRETED:
        tl.inline_asm_elementwise("cp.async.bulk.wait_group 0;\n\tfence.proxy.async.global;\n\tmov.u32 $0, $1;",
                                  "=r,r", [call], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _add_peer_tile(tile_id, out_ptr, recv_ptr, flags_ptr, call, M, N,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr):
    """out[tile] += the peer's partial of the tile, once the peer's flag says it has landed."""
    _, _, offs, mask = _tile_offsets(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP)
    _wait(flags_ptr + tile_id, call)
    mine = tl.load(out_ptr + offs, mask=mask)
    theirs = tl.load(recv_ptr + offs, mask=mask, cache_modifier=".cg")
    tl.store(out_ptr + offs, (mine.to(tl.float32) + theirs.to(tl.float32)).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=CHANGING)
def gemm_push_all_kernel(x_ptr, w_ptr, out_ptr, recv_ptr, flags_ptr, peer_recv_addr, peer_flags_addr, call,
                         M, N, K, PUSH: tl.constexpr, W_KN: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr, STAGES: tl.constexpr,
                         PROGRAMS: tl.constexpr):
    """Design 1: every tile's partial pushed to the peer; the peer's added two tiles later (a tile's flag is raised
    one tile after its stores, when they have landed, so the release does not wait on NVLink)."""
    dtype = out_ptr.dtype.element_ty
    peer_recv = peer_recv_addr.to(tl.pointer_type(dtype))
    peer_flags = peer_flags_addr.to(tl.pointer_type(tl.int32))
    x_desc, w_desc = _descriptors(x_ptr, w_ptr, M, N, K, W_KN, BLOCK_M, BLOCK_N, BLOCK_K)
    previous = -1
    before = -1
    for tile_id in range(tl.program_id(0), tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N), PROGRAMS):
        first_row, first_col, offs, mask = _tile_offsets(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP)
        partial = _tile_product(x_desc, w_desc, first_row, first_col, K, W_KN, BLOCK_M, BLOCK_N, BLOCK_K,
                                STAGES).to(dtype)
        if PUSH:
            if previous >= 0:
                _raise(peer_flags + previous, call)
        tl.store(out_ptr + offs, partial, mask=mask)
        if PUSH:
            tl.store(peer_recv + offs, partial, mask=mask)
            if before >= 0:
                _add_peer_tile(before, out_ptr, recv_ptr, flags_ptr, call, M, N, BLOCK_M, BLOCK_N, GROUP)
            before = previous
            previous = tile_id
    if PUSH:
        if previous >= 0:
            _raise(peer_flags + previous, call)
        if before >= 0:
            _add_peer_tile(before, out_ptr, recv_ptr, flags_ptr, call, M, N, BLOCK_M, BLOCK_N, GROUP)
        if previous >= 0:
            _add_peer_tile(previous, out_ptr, recv_ptr, flags_ptr, call, M, N, BLOCK_M, BLOCK_N, GROUP)


@triton.jit(do_not_specialize=CHANGING)
def gemm_push_owner_kernel(x_ptr, w_ptr, out_ptr, recv_ptr, finals_ptr, flags_ptr, peer_recv_addr,
                           peer_finals_addr, peer_flags_addr, call, rank, M, N, K, W_KN: tl.constexpr,
                           BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
                           STAGES: tl.constexpr, PROGRAMS: tl.constexpr, TMA: tl.constexpr):
    """Design 2, two ranks: rank 1 runs the tiles starting half-way, so each tile is computed early by one rank and
    late by the other, which owns it. The early rank pushes its partial (flags[t]); the owner, half a kernel later,
    finds it landed, adds it to its own (each rounded first, as mm then all-reduce does), stores the sum and pushes
    it into the early rank's finals (flags[T + t]). After its tiles, a rank copies the finals it was sent into its
    output. Each rank sends half its output twice (a reduce-scatter and an all-gather), and no wait stalls a tile:
    only the last finals' flight and the copy are left after the GEMM. With ``TMA`` the pushes are the TMA
    engine's bulk copies from shared memory: the program computes its next tile while they fly."""
    dtype = out_ptr.dtype.element_ty
    peer_recv = peer_recv_addr.to(tl.pointer_type(dtype))
    peer_finals = peer_finals_addr.to(tl.pointer_type(dtype))
    peer_flags = peer_flags_addr.to(tl.pointer_type(tl.int32))
    x_desc, w_desc = _descriptors(x_ptr, w_ptr, M, N, K, W_KN, BLOCK_M, BLOCK_N, BLOCK_K)
    if TMA:
        recv_desc = tl.make_tensor_descriptor(peer_recv, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_M, BLOCK_N])
        finals_desc = tl.make_tensor_descriptor(peer_finals, shape=[M, N], strides=[N, 1],
                                                block_shape=[BLOCK_M, BLOCK_N])
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    shift = tiles // 2 * rank  # rank 1 starts half-way
    # the index from which this rank computes its tiles second, and owns them: half, and for rank 1 tiles - half
    owned_from = tiles // 2 + rank * (tiles % 2)
    previous = -1  # the flag of the previous tile, raised one tile late (its stores have landed by then)
    for index in range(tl.program_id(0), tiles, PROGRAMS):
        tile_id = (index + shift) % tiles
        first_row, first_col, offs, mask = _tile_offsets(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP)
        partial = _tile_product(x_desc, w_desc, first_row, first_col, K, W_KN, BLOCK_M, BLOCK_N, BLOCK_K,
                                STAGES).to(dtype)
        if previous >= 0:
            _pushes_landed(call, TMA)
            _raise(peer_flags + previous, call)
        if index < owned_from:
            if TMA:
                recv_desc.store([first_row, first_col], partial)
            else:
                tl.store(peer_recv + offs, partial, mask=mask)
            previous = tile_id
        else:
            _wait(flags_ptr + tile_id, call)
            theirs = tl.load(recv_ptr + offs, mask=mask, cache_modifier=".cg")
            total = (partial.to(tl.float32) + theirs.to(tl.float32)).to(dtype)
            tl.store(out_ptr + offs, total, mask=mask)
            if TMA:
                finals_desc.store([first_row, first_col], total)
            else:
                tl.store(peer_finals + offs, total, mask=mask)
            previous = tiles + tile_id
    if previous >= 0:
        _pushes_landed(call, TMA)
        _raise(peer_flags + previous, call)
    for index in range(tl.program_id(0), owned_from, PROGRAMS):  # the finals of the tiles the peer owns
        tile_id = (index + shift) % tiles
        _, _, offs, mask = _tile_offsets(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP)
        _wait(flags_ptr + tiles + tile_id, call)
        tl.store(out_ptr + offs, tl.load(finals_ptr + offs, mask=mask, cache_modifier=".cg"), mask=mask)


@triton.jit(do_not_specialize=CHANGING)
def gemm_push_comm_kernel(x_ptr, w_ptr, out_ptr, recv_ptr, finals_ptr, flags_ptr, peer_recv_addr,
                          peer_finals_addr, peer_flags_addr, call, rank, M, N, K, W_KN: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
                          STAGES: tl.constexpr, GEMM_PROGRAMS: tl.constexpr, COMM_PROGRAMS: tl.constexpr,
                          LAG: tl.constexpr):
    """Design 3, two ranks: the GEMM's programs only store their tiles into the output and raise a local flag per
    tile (a plain GEMM's epilogue); COMM_PROGRAMS more programs, on SMs of their own, move the tiles as they are
    produced. Tile t is owned by rank t % 2: the other rank's comm program pushes its partial
    into the owner's receive buffer; the owner's adds the two (each rounded first, as mm then all-reduce does),
    stores the sum and pushes it into the other's finals, which the other's comm program copies into its output LAG
    tiles later. Comm program j moves tiles j, j + COMM_PROGRAMS, ... on both ranks, so it waits only on its twin.
    A peer flag is raised one step late (before the next step's stores or waits), when the stores it covers have
    landed.
    Flags: [0, T) the local partials, [T, 2T) the peer's partials, [2T, 3T) the peer's finals."""
    dtype = out_ptr.dtype.element_ty
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    pid = tl.program_id(0)
    if pid < GEMM_PROGRAMS:
        x_desc, w_desc = _descriptors(x_ptr, w_ptr, M, N, K, W_KN, BLOCK_M, BLOCK_N, BLOCK_K)
        for tile_id in range(pid, tiles, GEMM_PROGRAMS):
            first_row, first_col, offs, mask = _tile_offsets(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP)
            partial = _tile_product(x_desc, w_desc, first_row, first_col, K, W_KN, BLOCK_M, BLOCK_N, BLOCK_K,
                                    STAGES)
            tl.store(out_ptr + offs, partial.to(dtype), mask=mask)
            tl.debug_barrier()
            tl.atomic_max(flags_ptr + tile_id, call, sem="release", scope="gpu")
    else:
        peer_recv = peer_recv_addr.to(tl.pointer_type(dtype))
        peer_finals = peer_finals_addr.to(tl.pointer_type(dtype))
        peer_flags = peer_flags_addr.to(tl.pointer_type(tl.int32))
        previous = -1
        for step in range(pid - GEMM_PROGRAMS, tiles + LAG * COMM_PROGRAMS, COMM_PROGRAMS):
            if step < tiles:
                _, _, offs, mask = _tile_offsets(step, M, N, BLOCK_M, BLOCK_N, GROUP)
                _wait(flags_ptr + step, call)
                mine = tl.load(out_ptr + offs, mask=mask, cache_modifier=".cg")
                if step % 2 == rank:
                    if previous >= 0:  # before waiting: the twin may be waiting for it
                        _raise(peer_flags + previous, call)
                    _wait(flags_ptr + tiles + step, call)
                    theirs = tl.load(recv_ptr + offs, mask=mask, cache_modifier=".cg")
                    total = (mine.to(tl.float32) + theirs.to(tl.float32)).to(dtype)
                    tl.store(out_ptr + offs, total, mask=mask)
                    tl.store(peer_finals + offs, total, mask=mask)
                    previous = 2 * tiles + step
                else:
                    if previous >= 0:
                        _raise(peer_flags + previous, call)
                    tl.store(peer_recv + offs, mine, mask=mask)
                    previous = tiles + step
            late = step - LAG * COMM_PROGRAMS
            if late >= 0 and late % 2 != rank:
                if previous >= 0:  # before waiting, as above
                    _raise(peer_flags + previous, call)
                    previous = -1
                _, _, offs, mask = _tile_offsets(late, M, N, BLOCK_M, BLOCK_N, GROUP)
                _wait(flags_ptr + 2 * tiles + late, call)
                tl.store(out_ptr + offs, tl.load(finals_ptr + offs, mask=mask, cache_modifier=".cg"), mask=mask)
        if previous >= 0:
            _raise(peer_flags + previous, call)


class PushBuffers:
    """A rank's receive buffers for partials and for finals (two of each, used in turn by successive calls), its
    flags, the peer's addresses of the same, and the call counter. Symmetric memory on GPUs; on the CPU, plain
    tensors, with the peer's addresses given (``pair``) or this rank's own (one rank pushing to itself)."""

    def __init__(self, rows: int, cols: int, dtype, device, max_tiles: int, group_name: str | None = None):
        if group_name is None:
            allocate = functools.partial(torch.empty, device=device)
        else:
            from torch.distributed import _symmetric_memory as symm_mem

            allocate = functools.partial(symm_mem.empty, device=device)
        self.recv = allocate(2, rows, cols, dtype=dtype)
        self.finals = allocate(2, rows, cols, dtype=dtype)
        self.flags = allocate(3 * max_tiles, dtype=torch.int32).zero_()
        self.rank, self.calls = 0, 0
        device = torch.device(device)
        self.sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
        self.peer = {name: getattr(self, name).data_ptr() for name in ("recv", "finals", "flags")}
        if group_name is not None:
            import torch.distributed as dist

            for name in self.peer:
                handle = symm_mem.rendezvous(getattr(self, name), group_name)
                self.rank = handle.rank
                self.peer[name] = handle.buffer_ptrs[1 - handle.rank]
            torch.cuda.synchronize()
            dist.barrier()

    def peer_with(self, peer: "PushBuffers", rank: int) -> None:
        """Make ``peer`` (its buffers mapped in this process) this rank's peer: the CPU test's two processes."""
        self.rank = rank
        self.peer = {name: getattr(peer, name).data_ptr() for name in self.peer}

    def address(self, name: str, parity: int, own: bool = False) -> int:
        base = getattr(self, name).data_ptr() if own else self.peer[name]
        return base + parity * getattr(self, name)[0].nbytes

    def __call__(self, x, w, config, design: str = "owner", push: bool = True, loopback: bool = False,
                 programs: int | None = None, w_kn: bool = False, comm: int = 4,
                 lag: int = 2, tma: bool = False):
        """y = all_reduce(x @ w^T) (``w_kn``: all_reduce(x @ w)) by ``design`` "all", "owner" (``tma``: its pushes
        by the TMA engine) or "comm" (``comm`` programs moving the tiles, copying finals ``lag`` steps late). For
        "all" only: ``push=False`` (the GEMM alone), ``loopback`` (push into this rank's own buffer: the CPU test's
        one rank)."""
        block_m, block_n, block_k, stages, warps = config
        (M, K), N = x.shape, w.shape[1 if w_kn else 0]
        out = torch.empty(M, N, dtype=x.dtype, device=x.device)
        self.calls += 1
        parity = self.calls % 2
        tiles = triton.cdiv(M, block_m) * triton.cdiv(N, block_n)
        programs = min(tiles, programs or self.sms)
        meta = dict(W_KN=w_kn, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP=GROUP_M, STAGES=stages,
                    PROGRAMS=programs, num_warps=warps)
        if design == "all":
            gemm_push_all_kernel[(programs,)](
                x, w, out, self.recv[parity], self.flags, self.address("recv", parity, own=loopback),
                self.address("flags", 0, own=loopback), self.calls, M, N, K, PUSH=push, **meta)
        elif design == "comm":
            del meta["PROGRAMS"]
            gemm_programs = programs - comm  # the comm programs take SMs of the grid's
            gemm_push_comm_kernel[(gemm_programs + comm,)](
                x, w, out, self.recv[parity], self.finals[parity], self.flags, self.address("recv", parity),
                self.address("finals", parity), self.address("flags", 0), self.calls, self.rank, M, N, K,
                GEMM_PROGRAMS=gemm_programs, COMM_PROGRAMS=comm, LAG=lag, **meta)
        else:
            gemm_push_owner_kernel[(programs,)](
                x, w, out, self.recv[parity], self.finals[parity], self.flags, self.address("recv", parity),
                self.address("finals", parity), self.address("flags", 0), self.calls, self.rank, M, N, K, TMA=tma,
                **meta)
        return out


class CopyEnginePipeline:
    """The copy engines' design, for its GPU time: row chunks of cuBLAS GEMMs, each chunk's partial copied into the
    peer's symmetric buffer by a device-to-device copy (copy engines, no SMs) on a side stream, a barrier with the
    peer, and the peer's partial added; the next chunk's GEMM computes meanwhile. ``impl="symm_mem"`` in the backend
    issues these steps from Python, 0.12 ms of host time per chunk; here they are also captured once as a CUDA graph
    (static x, w and output) and replayed, which leaves the host out: what the steps cost the GPU."""

    def __init__(self, x: torch.Tensor, w: torch.Tensor, chunks: int, group_name: str):
        from torch.distributed import _symmetric_memory as symm_mem

        (M, _), N = x.shape, w.shape[0]
        self.x, self.w, self.out = x, w, torch.empty(M, N, dtype=x.dtype, device=x.device)
        self.recv = symm_mem.empty(M, N, dtype=x.dtype, device=x.device)
        self.handle = symm_mem.rendezvous(self.recv, group_name)
        self.peer_recv = self.handle.get_buffer(1 - self.handle.rank, (M, N), x.dtype)
        step = -(-M // chunks)
        self.chunks = [(start, min(start + step, M)) for start in range(0, M, step)]
        self.side = torch.cuda.Stream(x.device)
        self.graph = None

    def __call__(self) -> torch.Tensor:
        main = torch.cuda.current_stream()
        for start, stop in self.chunks:
            torch.mm(self.x[start:stop], self.w.t(), out=self.out[start:stop])
            self.side.wait_stream(main)
            with torch.cuda.stream(self.side):
                self.peer_recv[start:stop].copy_(self.out[start:stop])
                self.handle.barrier(channel=0)  # the peer's copy into this rank's buffer has landed
                self.out[start:stop] += self.recv[start:stop]
        main.wait_stream(self.side)
        return self.out

    def replay(self) -> torch.Tensor:
        if self.graph is None:
            self()  # warm: cuBLAS's workspace and the barrier's state exist before the capture
            torch.cuda.synchronize()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self()
        self.graph.replay()
        return self.out


def _two_ranks(rank, ranks, xs, w, config, outs):
    """One rank of the CPU test of designs "owner" and "comm": a process of its own (the interpreter runs one kernel
    at a time per process, and a grid's programs one after another: "owner" gets one program per rank; "comm" gets
    its GEMM programs first and one comm program or two, each waiting only on its twin)."""
    ranks[rank].peer_with(ranks[1 - rank], rank)
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8))
    calls = [("owner", False, {}), ("owner", True, {}), ("comm", False, {"programs": 3, "comm": 1}),
             ("comm", True, {"programs": 5, "comm": 2, "lag": 1}), ("owner", False, {"tma": True}),
             ("owner", True, {"tma": True})]  # both parities, both layouts of w
    for call, (design, w_kn, kwargs) in enumerate(calls):
        outs[call, rank] = ranks[rank](xs[rank], w.t().contiguous() if w_kn else w, config, design=design,
                                       w_kn=w_kn, **{"programs": 1, **kwargs})


def selftest():
    """CPU, interpreter: design "all" with one rank pushing to itself gives twice its product; design "owner" with
    two ranks in two processes sharing their buffers gives the sum of theirs, the same on both; w in either
    layout."""
    import torch.multiprocessing as mp

    torch.manual_seed(0)
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8))
    M, N, K = 96, 80, 48
    xs, w = torch.randn(2, M, K), torch.randn(N, K)
    want = (xs.double() @ w.double().t()).sum(0)
    for config in [(32, 32, 16, 1, 4), (64, 32, 32, 2, 4)]:
        tiles = triton.cdiv(M, config[0]) * triton.cdiv(N, config[1])
        alone = PushBuffers(M, N, torch.float32, xs.device, tiles)
        for programs in (1, 3):
            for push, w_kn in ((False, False), (True, False), (True, True)):
                got = alone(xs[0], w.t().contiguous() if w_kn else w, config, design="all", push=push,
                            loopback=True, programs=programs, w_kn=w_kn)
                err = (got.double() - xs[0].double() @ w.double().t() * (2 if push else 1)).abs().max()
                assert err < 1e-4, (config, programs, push, w_kn, err)
        ranks = [PushBuffers(M, N, torch.float32, xs.device, tiles) for _ in range(2)]
        for rank in ranks:
            for name in ("recv", "finals", "flags"):
                getattr(rank, name).share_memory_()
        outs = torch.zeros(6, 2, M, N).share_memory_()
        context = mp.start_processes(_two_ranks, args=(ranks, xs, w, config, outs), nprocs=2, join=False,
                                     start_method="fork")
        deadline = time.monotonic() + 120
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                for process in context.processes:
                    process.kill()
                raise AssertionError(f"design 'owner' or 'comm' hung with tiles {config[:2]}")
        assert (outs.double() - want).abs().max() < 1e-4, config
        assert torch.equal(outs[:, 0], outs[:, 1])
    print("selftest passed")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="8192x4096x7168,8192x4096x2048,4096x4096x7168")
    parser.add_argument("--selftest", action="store_true")
    args = parser.parse_args()
    if args.selftest:
        return selftest()

    import torch.distributed as dist

    from bench_gemm_allreduce import time_ms

    dist.init_process_group("nccl")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device=device))
    group_name = dist.group.WORLD.group_name
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    max_rows, max_cols = max(s[0] for s in shapes), max(s[1] for s in shapes)
    pushing = PushBuffers(max_rows, max_cols, torch.bfloat16, device,
                          triton.cdiv(max_rows, 128) * triton.cdiv(max_cols, 128), group_name)
    for M, N, K in shapes:
        torch.manual_seed(rank)
        x = torch.randn(M, K, device=device, dtype=torch.bfloat16)
        w = torch.randn(N, K, device=device, dtype=torch.bfloat16) / K ** 0.5
        best = None
        # the forward's x @ w^T, then the input gradient's form x @ w (w as [K, N]), with the tiles best for the first
        for form, w_kn in (("x @ w^T", False), ("x @ w", True)):
            operand = w.t().contiguous() if w_kn else w

            def mm():
                return x @ operand if w_kn else x @ operand.t()

            def mm_then_all_reduce():
                y = mm()
                dist.all_reduce(y)
                return y

            times = {"cuBLAS mm": time_ms(mm)[2]}
            for config in CONFIGS if best is None else [best]:
                times[f"Triton GEMM {config}"] = time_ms(
                    lambda: pushing(x, operand, config, design="all", push=False, w_kn=w_kn))[2]
            best = best or min(CONFIGS, key=lambda c: times[f"Triton GEMM {c}"])
            times["mm then all-reduce (NCCL)"] = time_ms(mm_then_all_reduce)[2]
            variants = {"design 'all'": {"design": "all"}, "design 'owner'": {"design": "owner"}}
            variants.update({f"design 'comm', {comm} SMs": {"design": "comm", "comm": comm} for comm in (8, 16)})
            # a TMA push stages its tile in shared memory: 64 KB beside the stages, which 3 stages leave room for
            variants["design 'owner', TMA pushes"] = {"design": "owner", "tma": True}
            variants["design 'owner', TMA pushes, 3 stages"] = {"design": "owner", "tma": True,
                                                               "config": (128, 256, 64, 3, 8)}
            want, diffs = mm_then_all_reduce(), []

            def measure(name, run):
                try:  # a variant that does not compile fails alike on every rank
                    times[name] = time_ms(run)[2]
                    difference = (run().float() - want.float()).abs().max() / want.float().abs().max()
                    diffs.append(f"{name} {difference.item():.1e}")
                except Exception as error:  # noqa: BLE001 (a probe: report and go on)
                    print(f"{name}: {type(error).__name__}: {str(error)[:1500]}")

            for name, kwargs in variants.items():
                config = kwargs.pop("config", best)
                measure(name, functools.partial(pushing, x, operand, config, w_kn=w_kn, **kwargs))
            if not w_kn:
                for chunks in (4, 8):
                    pipeline = CopyEnginePipeline(x, w, chunks, group_name)
                    measure(f"copy engines, {chunks} chunks, from Python", pipeline)
                    measure(f"copy engines, {chunks} chunks, CUDA graph", pipeline.replay)
            if rank == 0:
                base = times["mm then all-reduce (NCCL)"]
                print(f"\n{M}x{N}x{K}, {form}, tiles {best}; largest difference from mm then all-reduce, of its "
                      f"largest value: {', '.join(diffs)}")
                for name, ms in times.items():
                    print(f"  {name:42s} {ms:8.4f} ms  {base / ms:5.2f}x mm then all-reduce")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
