"""Probe for issue #6: designs of GEMM + all-reduce on two ranks beside mm then NCCL all-reduce, at sizes the
benchmark (``bench_gemm_allreduce.py``) does not reach into: the backend's pushing kernel called directly (so its
shape threshold does not apply) with and without SMs left free, and the copy engines' pipeline as a CUDA graph.

Designs measured here in earlier sessions (benchmarks/README.md, eleventh to thirteenth sessions; their kernels are
in the git history of this file):
- design "all": every tile's partial stored locally and pushed by the SMs' stores, the peer's added two tiles
  later: 1.13-1.16x over mm then NCCL all-reduce at 8192x4096x7168. The epilogue's stores and adds stall the SMs.
- design "owner" with the SMs' stores for pushes: 1.10-1.15x at 8192x4096x7168, 1.25-1.27x at 8192x4096x2048.
- design "comm": COMM_PROGRAMS programs of their own moving the tiles a plain GEMM stores: an SM moves about
  7 GB/s into the peer's memory that way, so 16 of them are needed (0.76 ms, 1.15-1.21x) and lose at 2048.
- design "owner" with TMA pushes (the backend's ``impl="push"``, ``turbo_inductor/kernels/symm_mem/gemm_push.py``):
  1.18-1.19x at 8192x4096x7168, 1.43-1.48x at 8192x4096x2048 (thirteenth session).
- the copy engines (``CopyEnginePipeline`` below): chunked cuBLAS GEMMs, each chunk copied to the peer by a copy
  engine; 1.2-1.25x at 8192x4096x7168 as a CUDA graph, 1.05-1.15x at 2048.

    torchrun --nproc-per-node 2 benchmarks/probe_gemm_push.py [--shapes 8192x4096x7168,...]

Rank 0 prints, per shape M x N x K and per form (a linear's forward x @ w^T, w [N, K]; its input gradient's x @ w,
as the column-parallel backward reduces it): cuBLAS mm, mm then NCCL all-reduce, and each design, in ms (median per
call of calls issued back to back), with the speedup over mm then all-reduce and the designs' largest difference
from it.
"""
from __future__ import annotations

import argparse
import os

import torch

from turbo_inductor.kernels.symm_mem import gemm_push

RESERVED_SMS = gemm_push.RESERVED_SMS  # the backend's; the probe also measures none

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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="8192x4096x7168,8192x4096x2048,4096x4096x7168,256x4096x7168")
    args = parser.parse_args()

    import torch.distributed as dist

    from bench_gemm_allreduce import time_ms

    dist.init_process_group("nccl")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    group_name = dist.group.WORLD.group_name
    for M, N, K in [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]:
        torch.manual_seed(rank)
        x = torch.randn(M, K, device=device, dtype=torch.bfloat16)
        w = torch.randn(N, K, device=device, dtype=torch.bfloat16) / K ** 0.5
        pushing = gemm_push.peer_buffers(M, N, x.dtype, device, group_name)
        for form, w_kn in (("x @ w^T", False), ("x @ w", True)):
            operand = w.t().contiguous() if w_kn else w

            def mm():
                return x @ operand if w_kn else x @ operand.t()

            def mm_then_all_reduce():
                y = mm()
                dist.all_reduce(y)
                return y

            def push(reserved):
                gemm_push.RESERVED_SMS = reserved
                return pushing(x, operand, w_kn, None, x.new_empty(M, N))

            times = {"cuBLAS mm": time_ms(mm)[2], "mm then all-reduce (NCCL)": time_ms(mm_then_all_reduce)[2]}
            want, diffs = mm_then_all_reduce(), []

            def measure(name, run):
                times[name] = time_ms(run)[2]
                difference = (run().float() - want.float()).abs().max() / want.float().abs().max()
                diffs.append(f"{name} {difference.item():.1e}")

            for reserved in (RESERVED_SMS, 0):
                measure(f"push kernel, {reserved} SMs left free", lambda: push(reserved))
            if not w_kn:
                for chunks in (4, 8):
                    pipeline = CopyEnginePipeline(x, w, chunks, group_name)
                    measure(f"copy engines, {chunks} chunks, CUDA graph", pipeline.replay)
            if rank == 0:
                base = times["mm then all-reduce (NCCL)"]
                print(f"\n{M}x{N}x{K}, {form}; largest difference from mm then all-reduce, of its largest value: "
                      f"{', '.join(diffs)}")
                for name, ms in times.items():
                    print(f"  {name:42s} {ms:8.4f} ms  {base / ms:5.2f}x mm then all-reduce", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
