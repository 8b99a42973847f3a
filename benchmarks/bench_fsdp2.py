"""FP8 training under FSDP2 as torchtitan composes it (each layer compiled, then sharded): step time, peak memory and
SNR against Inductor per column, on N GPUs through NCCL, or N CPU processes on gloo (the tiny config, a smoke run).
``torchrun --nproc-per-node 2 -m benchmarks.bench_fsdp2 [--config llama3-8b] [--layers 2] [--fp8 rowwise]``"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import statistics
import time

import torch
import torch.distributed as dist

import turbo_inductor
from benchmarks import record
from benchmarks.columns import TORCHAO_RECIPES, torchao_recipes
from benchmarks.measure import snr_db
from turbo_inductor.testing.llama import CONFIGS, LlamaDecoder

WARMUP = 2  # steps before timing (the first compiles)


def main(argv=None):
    # One GPU per rank through NCCL; with fewer GPUs than ranks, every rank on the CPU through gloo.
    on_gpu = torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ.get("WORLD_SIZE", 1))
    parser = argparse.ArgumentParser(description=__doc__.split("``")[0])
    parser.add_argument("--config", default="llama3-8b" if on_gpu else "tiny", choices=sorted(CONFIGS))
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2, help="sequences per rank")
    parser.add_argument("--seq", type=int, default=4096 if on_gpu else 32)
    parser.add_argument("--fp8", default="tensorwise,rowwise", help="FP8 recipes (comma-separated; empty: none)")
    parser.add_argument("--steps", type=int, default=20 if on_gpu else 2, help="timed steps, the same on every rank")
    parser.add_argument("--out", default=None, help="folder for the JSON (default: $OUT, else benchmarks/out)")
    parser.add_argument(
        "--snapshot",
        default="",
        help="columns (comma-separated) whose one extra step rank 0 "
        "records as a CUDA memory snapshot, snapshot_<column>.pickle beside the JSON (pytorch.org/memory_viz)",
    )
    args = parser.parse_args(argv)

    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("nccl" if on_gpu else "gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank))) if on_gpu else torch.device("cpu")
        if on_gpu:
            torch.cuda.set_device(device)
        mesh = init_device_mesh(device.type, (world,))
        table = run_columns(args, device, mesh)
        if rank == 0:
            print_table(args, world, table)
            parts = [args.config, f"{world}ranks"]
            parts += record.changed_options(parser, args, {"config", "out", "snapshot"})
            record.write("fsdp2", parts, {**vars(args), "world": world}, table, args.out)
    finally:
        dist.destroy_process_group()


def columns(recipes: list[str], device: str) -> list[tuple[str, str, dict | None, str | None]]:
    """(name, backend, options, torchao recipe) of every column."""
    result = [("inductor", "inductor", None, None), ("primus_turbo", "primus_turbo", None, None)]
    result += [(f"primus_turbo fp8 {recipe}", "primus_turbo", {"fp8": recipe}, None) for recipe in recipes]
    # the backward quantizing W^T again from the weight FSDP2 all-gathers for it, instead of keeping it from the
    # forward: a layer's weights in FP8 less memory per layer, one more read of W
    result += [
        (
            f"primus_turbo fp8 {recipe}, W^T not saved",
            "primus_turbo",
            {"fp8": {"recipe": recipe, "save_weight_t": False}},
            None,
        )
        for recipe in recipes
    ]
    result += [
        (f"torchao fp8 {recipe}", "inductor", None, recipe)
        for recipe in torchao_recipes(recipes, device, TORCHAO_RECIPES)
    ]
    return result


def sharded(base: torch.nn.Module, backend: str, options: dict | None, torchao: str | None, mesh) -> torch.nn.Module:
    """A copy of ``base`` with each layer compiled, then each layer and the root sharded (torchtitan's order)."""
    from torch.distributed.fsdp import fully_shard

    model = copy.deepcopy(base)
    if torchao:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(torchao))
    for i, layer in enumerate(model.layers):
        compiled = torch.compile(layer, backend=backend, options=options)
        model.layers.register_module(str(i), compiled)
        fully_shard(compiled, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def run_columns(args, device: torch.device, mesh) -> list[dict]:
    config = CONFIGS[args.config]
    config = type(config)(**{**config.__dict__, "layers": args.layers})
    torch.manual_seed(0)  # the same weights on every rank
    base = LlamaDecoder(config).to(device, torch.bfloat16)
    generator = torch.Generator(device).manual_seed(1 + dist.get_rank())  # each rank its own batch
    x = torch.randn(args.batch, args.seq, config.hidden, device=device, dtype=torch.bfloat16, generator=generator)
    cotangent = torch.randn(x.shape, device=device, dtype=x.dtype, generator=generator)
    recipes = [recipe for recipe in args.fp8.split(",") if recipe]
    results = {}
    allocated_before = torch.cuda.memory_allocated() if device.type == "cuda" else 0
    for name, backend, options, torchao in columns(recipes, device.type):
        torch._dynamo.reset()
        turbo_inductor.reset_records()
        # The last column's model is garbage only once its reference cycles (FSDP's hooks) are collected; whatever
        # earlier columns still leave allocated is no part of this one's peak (as in run_model).
        gc.collect()
        left_over = torch.cuda.memory_allocated() - allocated_before if device.type == "cuda" else 0
        model = sharded(base, backend, options, torchao, mesh)

        def step():
            model.zero_grad(set_to_none=True)
            out = model(x)
            out.backward(cotangent)
            return out

        for _ in range(WARMUP):
            out = step()
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(args.steps):
            dist.barrier()
            start = time.perf_counter()
            step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append((time.perf_counter() - start) * 1e3)
        if device.type == "cuda" and name in args.snapshot.split(","):
            record_snapshot(step, str(record.output_dir(args.out) / f"snapshot_{record.slug(name)}.pickle"))
        grads = {n: p.grad.full_tensor().float().cpu() for n, p in model.named_parameters() if p.grad is not None}
        peak = (torch.cuda.max_memory_allocated() - left_over) / 2**30 if device.type == "cuda" else None
        results[name] = {
            "step_ms": statistics.median(times),
            "out": out.detach().float().cpu(),
            "grads": grads,
            "peak_gib": peak,
            "rewrites": turbo_inductor.rewrite_counts() if backend == "primus_turbo" else {},
        }
        model = None  # freed before the next column builds its own
    ref = results["inductor"]
    table = []
    for name, r in results.items():
        # compiled layers' parameters are named through the compiled module (_orig_mod); match by position
        pairs = zip(r["grads"].values(), ref["grads"].values())
        worst = min((snr_db([g], [w]) for g, w in pairs), default=float("inf"))
        table.append(
            {
                "column": name,
                "step_ms": r["step_ms"],
                "speedup_vs_inductor": ref["step_ms"] / r["step_ms"],
                "peak_gib": r["peak_gib"],
                "out_snr_db": snr_db([r["out"]], [ref["out"]]),
                "worst_grad_snr_db": worst,
                "rewrites": {k: v for k, v in r["rewrites"].items() if v},
            }
        )
    return table


def record_snapshot(step, path: str) -> None:
    """One step with the allocator's history recorded (each block's Python and C++ stack), saved by rank 0: where
    a column's peak memory goes."""
    torch.cuda.memory._record_memory_history(max_entries=200_000)
    step()
    torch.cuda.synchronize()
    if dist.get_rank() == 0:
        torch.cuda.memory._dump_snapshot(path)
    torch.cuda.memory._record_memory_history(enabled=None)


def print_table(args, world: int, table: list[dict]) -> None:
    print(f"{args.config} x{args.layers} layers, FSDP2 on {world} ranks, batch {args.batch} x seq {args.seq} per rank")
    print(f"{'column':40s} {'step ms':>9s} {'vs inductor':>11s} {'peak GiB':>9s} {'out SNR':>8s} {'grad SNR':>8s}")
    for row in table:
        peak = f"{row['peak_gib']:9.2f}" if row["peak_gib"] is not None else f"{'-':>9s}"
        print(
            f"{row['column']:40s} {row['step_ms']:9.3f} {row['speedup_vs_inductor']:10.2f}x {peak} "
            f"{row['out_snr_db']:8.1f} {row['worst_grad_snr_db']:8.1f}  {row['rewrites']}"
        )


if __name__ == "__main__":
    main()
