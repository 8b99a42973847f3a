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

    torchrun --nproc-per-node 2 benchmarks/probe_gemm_push.py [--shapes 8192x4096x7168,...] [--breakdown]
                                                               [--interference] [--host]

Rank 0 prints, per shape M x N x K and per form (a linear's forward x @ w^T, w [N, K]; its input gradient's x @ w,
as the column-parallel backward reduces it): cuBLAS mm, mm then NCCL all-reduce, and each design, in ms (median per
call of calls issued back to back), with the speedup over mm then all-reduce and the designs' largest difference
from it. ``--breakdown`` adds the backend's kernel with parts of its work left out (wrong sums, for time only):
"GEMM only" (each tile stored locally by TMA, as a plain persistent GEMM), "pushes only" (each tile pushed to the
peer, no waits, sums or copies) and "no final copies"; built from the kernel's own source, so they follow it.
``--interference`` times cuBLAS's GEMM and the kernel's "GEMM only" alone and while the copy engines move 32 MiB
into the peer's memory (and the peer's into this one): what NVLink traffic costs a GEMM that issues none of it.
``--host`` prints the host's time per call of the op and of its parts (the GPU synchronized before each call).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import tempfile
import time

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


# (text in the kernel's source, its replacement): a constexpr PART leaving out work. 0: the whole kernel; 1: GEMM only;
# 2: no final copies; 3: pushes only.
_PARTS_EDITS = [
    ("PROGRAMS: tl.constexpr):\n", "PROGRAMS: tl.constexpr, PART: tl.constexpr):\n"),
    (
        """        if previous >= 0:
            _proxy_fence(call, WAIT_PUSHES=True)
            _raise(peer_flags_ptr + previous, call)
        if index < owned_from:
            peer_recv_desc.store([first_row, first_col], partial)
        else:""",
        """        if PART == 1:
            out_desc.store([first_row, first_col], partial)
        elif PART == 3:
            peer_recv_desc.store([first_row, first_col], partial)
        elif index < owned_from:
            if previous >= 0:
                _proxy_fence(call, WAIT_PUSHES=True)
                _raise(peer_flags_ptr + previous, call)
            peer_recv_desc.store([first_row, first_col], partial)
        else:
            if previous >= 0:
                _proxy_fence(call, WAIT_PUSHES=True)
                _raise(peer_flags_ptr + previous, call)""",
    ),
    ("            if pending < owned_from:", "            if pending < owned_from and PART == 0:"),
    (
        "    if previous >= 0:\n        _proxy_fence",
        "    if previous >= 0 and (PART == 0 or PART == 2):\n        _proxy_fence",
    ),
    (
        "    for index in range(pending, owned_from, PROGRAMS):",
        "    for index in range(pending, owned_from if PART == 0 else 0, PROGRAMS):",
    ),
    ("PROGRAMS=programs, num_warps=warps)", "PROGRAMS=programs, PART=PART, num_warps=warps)"),
    ("RESERVED_SMS = 4\n", "RESERVED_SMS = 4\nPART = 0\n"),
    ("from ..reference import gemm_allreduce as sequential\n", ""),
    ("from ..registry import implementation\n", ""),
    ("from ..triton import", "from turbo_inductor.kernels.triton import"),
    ("from . import symmetric_tensor", "from turbo_inductor.kernels.symm_mem import symmetric_tensor"),
]


def kernel_parts():
    """The backend's pushing kernel as a module of its own whose ``PART`` leaves out work (``_PARTS_EDITS``), from
    the kernel's source up to its op registration. Triton reads a kernel's source from its file: a temporary one."""
    with open(gemm_push.__file__) as source:
        text = source.read().split("def _weight_form(")[0]
    for old, new in _PARTS_EDITS:
        if old not in text:
            raise RuntimeError(f"the pushing kernel changed: the breakdown's edit of {old[:60]!r} no longer applies")
        text = text.replace(old, new)
    path = os.path.join(tempfile.mkdtemp(), "gemm_push_parts.py")
    with open(path, "w") as module_file:
        module_file.write(text)
    spec = importlib.util.spec_from_file_location("gemm_push_parts", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def interference(group_name: str, device: torch.device, rank: int, time_ms) -> None:
    """cuBLAS's GEMM and the kernel's "GEMM only" at 8192x4096x7168, alone and beside a 32 MiB peer copy."""
    from turbo_inductor.kernels.symm_mem import symmetric_tensor

    M, N, K = 8192, 4096, 7168
    x = torch.randn(M, K, device=device, dtype=torch.bfloat16)
    w = torch.randn(N, K, device=device, dtype=torch.bfloat16) / K**0.5
    _, peer = symmetric_tensor((M // 2, N), torch.bfloat16, device, group_name)
    sent = torch.randn(M // 2, N, device=device, dtype=torch.bfloat16)
    parts = kernel_parts()
    parts.PART = 1
    gemm_only = parts.peer_buffers(M, N, x.dtype, device, group_name)
    side = torch.cuda.Stream(device)

    def copy():
        peer[1 - rank].copy_(sent)

    def beside_copy(gemm):
        def run():
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                copy()
            out = gemm()
            torch.cuda.current_stream().wait_stream(side)
            return out

        return run

    gemms = {
        "cuBLAS mm": lambda: x @ w.t(),
        "the kernel, GEMM only": lambda: gemm_only(x, w, False, None, x.new_empty(M, N)),
    }
    runs = {"32 MiB peer copy (copy engines)": copy}
    for name, gemm in gemms.items():
        runs[name], runs[f"{name} beside the copy"] = gemm, beside_copy(gemm)
    times = {name: time_ms(run)[2] for name, run in runs.items()}
    if rank == 0:
        print(f"\n{M}x{N}x{K}, interference of NVLink traffic the GEMM does not issue:")
        for name, ms in times.items():
            print(f"  {name:42s} {ms:8.4f} ms", flush=True)


def host_time(group_name: str, device: torch.device, rank: int) -> None:
    """The host's time (us, median) to issue one call of the op and of its parts, at 8192x4096x2048."""
    import torch.distributed as dist
    from triton.tools.tensor_descriptor import TensorDescriptor

    M, N, K = 8192, 4096, 2048
    x = torch.randn(M, K, device=device, dtype=torch.bfloat16)
    w = torch.randn(N, K, device=device, dtype=torch.bfloat16) / K**0.5
    out = x.new_empty(M, N)
    pushing = gemm_push.peer_buffers(M, N, x.dtype, device, group_name)
    block_m, block_n, block_k, stages, warps = gemm_push.TILE

    def descriptors():
        return [
            TensorDescriptor.from_tensor(t, block)
            for t, block in (
                (x, [block_m, block_k]),
                (w, [block_n, block_k]),
                (out, [block_m, block_n]),
                (pushing.recv[:M], [block_m, block_n]),
                (pushing.peer_recv[:M], [block_m, block_n]),
            )
        ]

    x_desc, w_desc, out_desc, recv_desc, peer_desc = descriptors()

    def triton_launch():  # the kernel's launch alone, its descriptors made beforehand
        pushing.counter += 1
        gemm_push.gemm_push_kernel[(128,)](
            x_desc,
            w_desc,
            out,
            out_desc,
            recv_desc,
            pushing.flags,
            peer_desc,
            pushing.peer_flags,
            pushing.counter,
            pushing.rank,
            M,
            N,
            K,
            HAS_BIAS=False,
            W_KN=False,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            BLOCK_K=block_k,
            GROUP=gemm_push.GROUP_M,
            STAGES=stages,
            PROGRAMS=128,
            num_warps=warps,
        )

    op = torch.ops.turbo_inductor_symm_mem.gemm_push_fwd
    parts = {
        "torch.ops.turbo_inductor_symm_mem.gemm_push_fwd": lambda: op(x, w, None, group_name),
        "PeerBuffers.__call__": lambda: pushing(x, w, False, None, out),
        "the Triton launch alone": triton_launch,
        "five TensorDescriptor.from_tensor": descriptors,
        "the call counter's add": lambda: pushing.counter.add_(0),
    }
    times = {}
    for name, run in parts.items():  # every rank the same calls: the kernel waits for its peer's
        for _ in range(5):
            run()
        torch.cuda.synchronize()
        dist.barrier()
        samples = []
        for _ in range(50):
            torch.cuda.synchronize()
            start = time.perf_counter()
            run()
            samples.append((time.perf_counter() - start) * 1e6)
        times[name] = statistics.median(samples)
    if rank == 0:
        print(f"\nhost time per call, us ({M}x{N}x{K}):")
        for name, us in times.items():
            print(f"  {name:50s} {us:8.1f}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="8192x4096x7168,8192x4096x2048,4096x4096x7168,256x4096x7168")
    parser.add_argument("--breakdown", action="store_true", help="the kernel with parts of its work left out")
    parser.add_argument("--interference", action="store_true", help="a GEMM beside a peer copy")
    parser.add_argument("--host", action="store_true", help="the host's time per call of the op and its parts")
    args = parser.parse_args()

    import torch.distributed as dist
    from bench_gemm_allreduce import time_ms

    dist.init_process_group("nccl")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    group_name = dist.group.WORLD.group_name
    parts = kernel_parts() if args.breakdown else None
    for M, N, K in [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]:
        torch.manual_seed(rank)
        x = torch.randn(M, K, device=device, dtype=torch.bfloat16)
        w = torch.randn(N, K, device=device, dtype=torch.bfloat16) / K**0.5
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
            if parts is not None:
                partial_kernel = parts.peer_buffers(M, N, x.dtype, device, group_name)
                for part, name in ((1, "GEMM only"), (3, "pushes only"), (2, "no final copies")):

                    def run(part=part):
                        parts.PART = part
                        return partial_kernel(x, operand, w_kn, None, x.new_empty(M, N))

                    times[f"push kernel, {name} (wrong sums)"] = time_ms(run)[2]
            if not w_kn:
                for chunks in (4, 8):
                    pipeline = CopyEnginePipeline(x, w, chunks, group_name)
                    measure(f"copy engines, {chunks} chunks, CUDA graph", pipeline.replay)
            if rank == 0:
                base = times["mm then all-reduce (NCCL)"]
                print(
                    f"\n{M}x{N}x{K}, {form}; largest difference from mm then all-reduce, of its largest value: "
                    f"{', '.join(diffs)}"
                )
                for name, ms in times.items():
                    print(f"  {name:42s} {ms:8.4f} ms  {base / ms:5.2f}x mm then all-reduce", flush=True)
    if args.interference:
        interference(group_name, device, rank, time_ms)
    if args.host:
        host_time(group_name, device, rank)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
