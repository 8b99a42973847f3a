"""GEMM + all-reduce (a row-parallel linear's forward) on every GPU of the host: mm then NCCL all-reduce, Inductor
and primus_turbo with each gemm_allreduce implementation, in one run.
``torchrun --nproc-per-node 2 -m benchmarks.bench_gemm_allreduce [--shapes 8192x4096x7168,...] [--cudagraphs]``"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F

from benchmarks import record
from benchmarks.common import print_table

WARMUP, ITERATIONS = 10, 50
PUSH = {"impl": "gemm_allreduce_fwd=push"}  # the pushing kernel (opt-in) where it takes the shape


def time_ms(fn) -> tuple[float, float, float]:
    """Medians of the time per call after a barrier (CUDA events) and of the host's time to issue it, and the time
    per call of ITERATIONS calls back to back. Every rank runs the same number of calls: others would hang."""
    for _ in range(WARMUP):
        fn()
    dist.barrier()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(ITERATIONS):
        fn()
    end.record()
    torch.cuda.synchronize()
    back_to_back = start.elapsed_time(end) / ITERATIONS
    times, host = [], []
    for _ in range(ITERATIONS):
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        issued = time.perf_counter()
        fn()
        host.append((time.perf_counter() - issued) * 1e3)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), statistics.median(host), back_to_back


def _with_chunks(module, chunks, fn, *args):
    module.CHUNKS = chunks
    return fn(*args)


def _push_kernel_calls() -> int:
    from turbo_inductor.kernels.symm_mem import gemm_push

    return sum(buffers.calls() for buffers in gemm_push._BUFFERS.values())


def _replayed(graphed, *args):
    torch.compiler.cudagraph_mark_step_begin()  # a new iteration: the last call's outputs may be overwritten
    return graphed(*args)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("``")[0])
    parser.add_argument(
        "--shapes",
        default="8192x4096x7168,8192x4096x2048,4096x4096x7168,16x4096x7168",
        help="M x N x K per rank (K is this rank's shard of the input features)",
    )
    parser.add_argument(
        "--symm-chunks",
        default="4,8,16",
        help="row chunks per call of impl=symm_mem to measure (its CHUNKS), one row each",
    )
    parser.add_argument(
        "--cudagraphs", action="store_true", help="also Inductor and primus_turbo replayed as CUDA graphs"
    )
    parser.add_argument("--out", default=None, help="folder for the JSON (default: $OUT, else benchmarks/out)")
    args = parser.parse_args(argv)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    group = dist.group.WORLD
    import turbo_inductor
    from turbo_inductor.kernels.symm_mem import gemm_allreduce as symm_mem_impl

    def row_parallel(x, w):
        return funcol.all_reduce(F.linear(x, w), "sum", group)

    def sequential(x, w):
        y = F.linear(x, w)
        dist.all_reduce(y, group=group)
        return y

    rows = []
    for shape in args.shapes.split(","):
        # Each shape compiled afresh, static, as a model of fixed shapes is: one function compiled for many
        # backends and shapes would otherwise turn dynamic, and past Dynamo's recompile limit run eagerly.
        torch._dynamo.reset()
        m, n, k = map(int, shape.split("x"))
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
        variants = {
            "mm then all-reduce": sequential,
            "inductor": torch.compile(row_parallel, backend="inductor"),
            "primus_turbo": torch.compile(row_parallel, backend="primus_turbo"),
            "primus_turbo impl=overlap": torch.compile(
                row_parallel, backend="primus_turbo", options={"impl": "overlap"}
            ),
            "primus_turbo impl=push": torch.compile(row_parallel, backend="primus_turbo", options=PUSH),
        }
        if args.cudagraphs:
            for name, backend, options in (
                ("inductor", "inductor", {}),
                ("primus_turbo", "primus_turbo", {}),
                ("primus_turbo impl=push", "primus_turbo", PUSH),
            ):
                variants[f"{name} (CUDA graphs)"] = functools.partial(
                    _replayed,
                    torch.compile(row_parallel, backend=backend, options={"triton.cudagraphs": True, **options}),
                )
        symm_mem = torch.compile(row_parallel, backend="primus_turbo", options={"impl": "symm_mem"})
        for chunks in map(int, args.symm_chunks.split(",")):  # read by each call: one compiled function serves all
            variants[f"primus_turbo impl=symm_mem chunks={chunks}"] = functools.partial(
                _with_chunks, symm_mem_impl, chunks, symm_mem
            )
        for name, fn in variants.items():
            pushed = _push_kernel_calls()
            try:
                with torch.no_grad():
                    ms, host_ms, back_to_back_ms = time_ms(lambda: fn(x, w))
            except Exception as error:  # noqa: BLE001  (an opt-in implementation failing costs its rows only; it
                # fails the same way on every rank, so no rank is left waiting in a collective)
                print(f"rank {rank}: {name} at {shape} failed: {type(error).__name__}: {error}"[:400])
                continue
            if _push_kernel_calls() > pushed and rank == 0:  # impl=push ran its kernel, not GEMM then all-reduce
                print(f"{name} at {shape}: the pushing kernel ran {_push_kernel_calls() - pushed} calls")
            rows += [
                {
                    "shape": f"{m}x{n}x{k}",
                    "mode": "fwd",
                    "backend": name,
                    "ms": ms,
                    "rate": 2 * m * n * k / ms / 1e9,
                    "host_ms": host_ms,
                },
                {
                    "shape": f"{m}x{n}x{k}",
                    "mode": "fwd back-to-back",
                    "backend": name,
                    "ms": back_to_back_ms,
                    "rate": 2 * m * n * k / back_to_back_ms / 1e9,
                },
            ]
    if rank == 0:
        print("rewrites:", turbo_inductor.rewrite_counts())
        print_table("gemm_allreduce", rows, rate_unit="TFLOP/s")
        configuration = {**vars(args), "world": dist.get_world_size()}
        parts = [f"{dist.get_world_size()}ranks", *record.changed_options(parser, args, ignore={"out"})]
        record.write("gemm_allreduce", parts, configuration, rows, args.out)
        print(
            "host time to issue one call, ms:",
            ", ".join(f"{r['shape']} {r['backend']}: {r['host_ms']:.3f}" for r in rows if "host_ms" in r),
        )
    # With CUDA graphs that captured NCCL collectives still alive, destroy_process_group hangs at exit: every rank
    # leaves together without tearing the group down.
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
