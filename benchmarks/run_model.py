"""The main job: a Llama-style decoder trained (forward+backward) under eager, backend="inductor" and
backend="primus_turbo"; prints what the backend fused and a table of step time, compile time and the difference
to Inductor. Defaults: the tiny config on CPU, one Llama-3-8B layer at batch 2 x seq 4096 on a GPU.

    python -m benchmarks.run_model [--config llama3-8b] [--layers 1] [--batch 2] [--seq 4096] [--fp8 rowwise]
"""
from __future__ import annotations

import argparse
import copy
import math
import statistics
import time

import torch

import turbo_inductor
from benchmarks.llama import CONFIGS, LlamaDecoder


def time_ms(step, device: str) -> float:
    if device == "cuda":
        from triton.testing import do_bench

        return do_bench(step, warmup=25, rep=200, return_mode="median")
    times = []
    for _ in range(5):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main(argv=None):
    on_gpu = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="llama3-8b" if on_gpu else "tiny", choices=sorted(CONFIGS))
    parser.add_argument("--layers", type=int, default=None, help="default: 1 on GPU, the config's on CPU")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=4096 if on_gpu else 64)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--fp8", default="tensorwise,rowwise" if on_gpu else "",
                        help="FP8 recipes to add as primus_turbo columns (comma-separated; empty: none)")
    args = parser.parse_args(argv)
    device, dtype = ("cuda" if on_gpu else "cpu"), getattr(torch, args.dtype)
    config = CONFIGS[args.config]
    if args.layers or on_gpu:
        config = type(config)(**{**config.__dict__, "layers": args.layers or 1})

    torch.manual_seed(0)
    base = LlamaDecoder(config).to(device, dtype)
    x = torch.randn(args.batch, args.seq, config.hidden, device=device, dtype=dtype, requires_grad=True)
    cotangent = torch.randn_like(x)
    print(f"{args.config} x{config.layers} layer(s), batch {args.batch} x seq {args.seq}, {args.dtype}, {device}")

    columns = [("eager", "eager", None), ("inductor", "inductor", None), ("primus_turbo", "primus_turbo", None)]
    columns += [(f"primus_turbo fp8 {recipe}", "primus_turbo", {"fp8": recipe})
                for recipe in args.fp8.split(",") if recipe]
    results = {}
    for name, backend, options in columns:
        torch._dynamo.reset()
        turbo_inductor.reset_records()
        model = copy.deepcopy(base)
        run = model if backend == "eager" else torch.compile(model, backend=backend, options=options)

        def step():
            x.grad = None
            model.zero_grad(set_to_none=True)
            out = run(x)
            out.backward(cotangent)
            return out

        try:
            results[name] = measure(step, x, device)
        except Exception as error:  # a column that fails is reported, the others still run
            cause = getattr(error, "inner_exception", None) or error  # Dynamo wraps backend errors
            results[name] = {"error": f"{type(cause).__name__}: {str(cause).strip()[:160]}"}
            continue
        if backend == "primus_turbo":
            print(f"{name} fused:", turbo_inductor.rewrite_counts())

    ref = results["inductor"]
    print(f"{'backend':28s} {'step ms':>9s} {'vs inductor':>12s} {'compile s':>10s} {'peak GiB':>9s} "
          f"{'out SNR dB':>11s} {'dx SNR dB':>10s}")
    for name, r in results.items():
        if "error" in r:
            print(f"{name:28s} failed: {r['error']}")
            continue
        print(f"{name:28s} {r['ms']:9.3f} {ref['ms'] / r['ms']:11.2f}x {r['compile_s']:10.1f} {r['peak_gib']:9.2f} "
              f"{snr_db(r['out'], ref['out']):11.1f} {snr_db(r['grad'], ref['grad']):10.1f}")


def measure(step, x, device: str) -> dict:
    """Compile (first step), then time the step; outputs and input gradient for the numerical comparison."""
    start = time.perf_counter()
    out = step().detach()
    if device == "cuda":
        torch.cuda.synchronize()
    compile_s = time.perf_counter() - start
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    ms = time_ms(step, device)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
    return {"ms": ms, "compile_s": compile_s, "out": out, "grad": x.grad.detach().clone(), "peak_gib": peak}


def snr_db(out, ref) -> float:
    """10 log10(|ref|^2 / |out - ref|^2): the numerical difference to Inductor (inf when identical)."""
    noise = (out.double() - ref.double()).pow(2).sum().item()
    return math.inf if noise == 0 else 10 * math.log10(ref.double().pow(2).sum().item() / noise)


if __name__ == "__main__":
    main()
