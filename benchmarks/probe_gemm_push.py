"""Probe for issue #6: can a GEMM that pushes its output tiles into the peer's memory from its epilogue reach
1.35x over mm then all-reduce? Not wired into the backend: this measures the design before it is built.

The kernel is a persistent Triton GEMM (one program per SM, tiles in grouped order; y = x @ w^T). Per tile, the
epilogue stores the rank's partial locally and into the peer's symmetric receive buffer (NVLink stores from the
SMs), then raises the tile's flag in the peer's flags (release, system scope). One tile later, the program waits
for the peer's flag of its previous tile (acquire), which arrived while this tile computed, and adds the peer's
partial into that tile of the output. So the reduction runs behind the GEMM, a tile late, and only the last tile's
wait and add are left after it. Both ranks run the same tiles in the same order; the sum is own + peer's on each
rank (equal bit for bit on both: addition commutes).

Two receive buffers are used in turn by successive calls, and a flag holds the number of the call that raised it
(waits are for "at least this call"): a rank that finishes call c has every peer tile of call c, so the peer is past
its call c - 1 and no longer reads the buffer that call c + 1 writes.

    torchrun --nproc-per-node 2 benchmarks/probe_gemm_push.py [--shapes 8192x4096x7168,...]
    TRITON_INTERPRET=1 python benchmarks/probe_gemm_push.py --selftest   # CPU: one rank pushing to itself

Rank 0 prints, per shape: cuBLAS mm, the Triton GEMM alone (each tile configuration), mm then NCCL all-reduce, and
the pushing GEMM, in ms (median per call of calls issued back to back), with the pushing GEMM's speedup over mm then
all-reduce, and its largest difference from it.
"""
from __future__ import annotations

import argparse
import os

import torch
import triton
import triton.language as tl

# (TMA, BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps): Hopper bf16 tilings from Triton's matmul tutorials
# (the first call measured the pointer-load kernel too: 1.3x cuBLAS's time at best, and 11-15 ms with 128x256 tiles)
CONFIGS = [(True, 128, 256, 64, 3, 8), (True, 128, 128, 64, 4, 8), (True, 256, 128, 64, 3, 8),
           (True, 128, 256, 64, 4, 8)]
GROUP_M = 8  # row tiles per group: consecutive programs share x's rows and w's columns in L2


@triton.jit
def _tile_offsets(tile_id, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr):
    """A tile's first row and column (tiles in grouped order), its rows and columns, its offsets into [M, N] and
    their mask."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    group_size = GROUP * tiles_n
    first_m = (tile_id // group_size) * GROUP
    rows_in_group = min(tiles_m - first_m, GROUP)
    tile_m = first_m + (tile_id % group_size) % rows_in_group
    tile_n = (tile_id % group_size) // rows_in_group
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs = rows[:, None] * N + cols[None, :]
    return tile_m * BLOCK_M, tile_n * BLOCK_N, rows, cols, offs, (rows[:, None] < M) & (cols[None, :] < N)


@triton.jit
def _add_peer_tile(tile_id, out_ptr, recv_ptr, flags_ptr, call, M, N,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr):
    """out[tile] += the peer's partial of the tile, once the peer's flag says it has landed."""
    _, _, _, _, offs, mask = _tile_offsets(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP)
    while tl.atomic_add(flags_ptr + tile_id, 0, sem="acquire", scope="sys") < call:
        pass
    mine = tl.load(out_ptr + offs, mask=mask)
    theirs = tl.load(recv_ptr + offs, mask=mask, cache_modifier=".cg")
    tl.store(out_ptr + offs, (mine.to(tl.float32) + theirs.to(tl.float32)).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gemm_push_kernel(x_ptr, w_ptr, out_ptr, recv_ptr, flags_ptr, peer_recv_addr, peer_flags_addr, call, M, N, K,
                     PUSH: tl.constexpr, PUSH_TMA: tl.constexpr, ADD: tl.constexpr, TMA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, GROUP: tl.constexpr, STAGES: tl.constexpr, PROGRAMS: tl.constexpr):
    dtype = out_ptr.dtype.element_ty
    peer_recv = peer_recv_addr.to(tl.pointer_type(dtype))
    peer_flags = peer_flags_addr.to(tl.pointer_type(tl.int32))
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    if TMA:  # the operands' tiles loaded by the Tensor Memory Accelerator (Hopper): no pointer tensors in registers
        x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
        w_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[K, 1], block_shape=[BLOCK_N, BLOCK_K])
    if PUSH_TMA:  # the push as an asynchronous bulk copy (TMA store into the peer's buffer)
        peer_desc = tl.make_tensor_descriptor(peer_recv, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_M, BLOCK_N])
    # A tile's flag is raised one tile after its stores (they have landed by then, so the release does not wait
    # on NVLink), and the peer's partial of a tile is added two tiles after it (its flag is up by then).
    previous = -1
    before = -1
    for tile_id in range(tl.program_id(0), num_tiles, PROGRAMS):
        first_row, first_col, rows, cols, offs, mask = _tile_offsets(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if TMA:
            for k in tl.range(0, K, BLOCK_K, num_stages=STAGES):
                acc = tl.dot(x_desc.load([first_row, k]), w_desc.load([first_col, k]).T, acc)
        else:
            x_tile = x_ptr + rows[:, None] * K + ks[None, :]
            w_tile = w_ptr + cols[:, None] * K + ks[None, :]
            for k in tl.range(0, K, BLOCK_K, num_stages=STAGES):
                a = tl.load(x_tile, mask=(rows[:, None] < M) & (ks[None, :] < K - k), other=0.0)
                b = tl.load(w_tile, mask=(cols[:, None] < N) & (ks[None, :] < K - k), other=0.0)
                acc = tl.dot(a, tl.trans(b), acc)
                x_tile += BLOCK_K
                w_tile += BLOCK_K
        if PUSH:
            if previous >= 0:
                tl.debug_barrier()  # every thread's stores of the previous tile precede its flag
                tl.atomic_max(peer_flags + previous, call, sem="release", scope="sys")
        partial = acc.to(dtype)
        tl.store(out_ptr + offs, partial, mask=mask)
        if PUSH:
            if PUSH_TMA:
                peer_desc.store([first_row, first_col], partial)
            else:
                tl.store(peer_recv + offs, partial, mask=mask)
            if ADD and before >= 0:
                _add_peer_tile(before, out_ptr, recv_ptr, flags_ptr, call, M, N, BLOCK_M, BLOCK_N, GROUP)
            before = previous
            previous = tile_id
    if PUSH:
        tl.debug_barrier()
        if previous >= 0:
            tl.atomic_max(peer_flags + previous, call, sem="release", scope="sys")
        if ADD and before >= 0:
            _add_peer_tile(before, out_ptr, recv_ptr, flags_ptr, call, M, N, BLOCK_M, BLOCK_N, GROUP)
        if ADD and previous >= 0:
            _add_peer_tile(previous, out_ptr, recv_ptr, flags_ptr, call, M, N, BLOCK_M, BLOCK_N, GROUP)


class PushingGemm:
    """The host side: this rank's two receive buffers and its flags (symmetric memory, or plain tensors for one
    rank pushing to itself), the peer's addresses, and the call counter."""

    def __init__(self, rows: int, cols: int, dtype, device, group_name: str | None, max_tiles: int):
        if group_name is None:  # one rank, its own peer
            self.recv = torch.empty(2, rows, cols, dtype=dtype, device=device)
            self.flags = torch.zeros(max_tiles, dtype=torch.int32, device=device)
            self.peer_recv, self.peer_flags = self.recv.data_ptr(), self.flags.data_ptr()
        else:
            import torch.distributed as dist
            from torch.distributed import _symmetric_memory as symm_mem

            self.recv = symm_mem.empty(2, rows, cols, dtype=dtype, device=device)
            self.flags = symm_mem.empty(max_tiles, dtype=torch.int32, device=device).zero_()
            recv_handle = symm_mem.rendezvous(self.recv, group_name)
            flags_handle = symm_mem.rendezvous(self.flags, group_name)
            peer = 1 - recv_handle.rank
            self.peer_recv, self.peer_flags = recv_handle.buffer_ptrs[peer], flags_handle.buffer_ptrs[peer]
            torch.cuda.synchronize()
            dist.barrier()
        self.calls = 0

    def __call__(self, x, w, config, push: bool = True, programs: int | None = None, push_tma: bool = False,
                 add: bool = True, loopback: bool = False):
        """``push_tma``: the push as a TMA store; ``add=False``: no add (timing only); ``loopback``: push into this
        rank's own buffer (no NVLink; timing only)."""
        tma, block_m, block_n, block_k, stages, warps = config
        (M, K), N = x.shape, w.shape[0]
        out = torch.empty(M, N, dtype=x.dtype, device=x.device)
        self.calls += 1
        parity = self.calls % 2
        tiles = triton.cdiv(M, block_m) * triton.cdiv(N, block_n)
        programs = min(tiles, programs or torch.cuda.get_device_properties(x.device).multi_processor_count)
        gemm_push_kernel[(programs,)](
            x, w, out, self.recv[parity], self.flags,
            (self.recv.data_ptr() if loopback else self.peer_recv) + parity * self.recv[0].nbytes,
            self.flags.data_ptr() if loopback else self.peer_flags,
            self.calls, M, N, K, PUSH=push, PUSH_TMA=push_tma, ADD=add, TMA=tma, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP=GROUP_M,
            STAGES=stages, PROGRAMS=programs, num_warps=warps)
        return out


def selftest():
    """CPU, interpreter: one rank pushing to itself gives twice its product, through the push, flag and add."""
    torch.manual_seed(0)
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8))
    M, N, K = 96, 80, 48
    x, w = torch.randn(M, K), torch.randn(N, K)
    pushing = PushingGemm(M, N, torch.float32, x.device, None, max_tiles=64)
    for config in [(False, 32, 32, 16, 1, 4), (True, 64, 32, 32, 1, 4), (True, 32, 32, 16, 2, 4)]:
        for programs in (1, 3):
            for push, push_tma in ((False, False), (True, False), (True, config[0])):
                got = pushing(x, w, config, push=push, programs=programs, push_tma=push_tma)
                want = (x.double() @ w.double().t()) * (2 if push else 1)
                err = ((got.double() - want).abs().max() / want.abs().max()).item()
                assert err < 1e-5, (config, programs, push, err)
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
    pushing = PushingGemm(max_rows, max_cols, torch.bfloat16, device, group_name,
                          max_tiles=triton.cdiv(max_rows, 128) * triton.cdiv(max_cols, 128))
    rows = []
    for M, N, K in shapes:
        torch.manual_seed(rank)
        x = torch.randn(M, K, device=device, dtype=torch.bfloat16)
        w = torch.randn(N, K, device=device, dtype=torch.bfloat16) / K ** 0.5

        def mm_then_all_reduce():
            y = x @ w.t()
            dist.all_reduce(y)
            return y

        times = {"cuBLAS mm": time_ms(lambda: x @ w.t())[2]}
        for config in CONFIGS:
            times[f"Triton GEMM {config}"] = time_ms(lambda: pushing(x, w, config, push=False))[2]
        best = min(CONFIGS, key=lambda c: times[f"Triton GEMM {c}"])
        times["mm then all-reduce (NCCL)"] = time_ms(mm_then_all_reduce)[2]
        variants = {f"pushing GEMM {best}": {},
                    "  the same, no add (timing only)": {"add": False},
                    "  the same, into its own buffer (timing only)": {"loopback": True}}
        want, diff = mm_then_all_reduce(), {}
        for name, kwargs in variants.items():
            try:  # a variant that does not compile fails alike on every rank
                times[name] = time_ms(lambda: pushing(x, w, best, **kwargs))[2]
                got = pushing(x, w, best, **kwargs)
                diff[name] = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
            except Exception as error:  # noqa: BLE001 (a probe: report and go on)
                print(f"{name}: {type(error).__name__}: {str(error)[:1500]}")
        diff = max(diff[name] for name in list(variants)[:1] if name in diff)
        if rank == 0:
            base = times["mm then all-reduce (NCCL)"]
            print(f"\n{M}x{N}x{K}: largest difference from mm then all-reduce {diff:.2e} of its largest value")
            for name, ms in times.items():
                print(f"  {name:40s} {ms:8.4f} ms  {base / ms:5.2f}x mm then all-reduce")
        rows.append((M, N, K, times, diff))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
