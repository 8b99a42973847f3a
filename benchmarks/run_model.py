"""The main job: a Llama-style decoder trained (forward+backward) under eager, backend="inductor" and
backend="primus_turbo"; prints what the backend fused and a table of step time, compile time and the difference
to Inductor. Defaults: the tiny config on CPU, one Llama-3-8B layer at batch 2 x seq 4096 on a GPU.

    python -m benchmarks.run_model [--config llama3-8b] [--layers 1] [--batch 2] [--seq 4096]
"""
from __future__ import annotations

import argparse
import copy
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

    results = {}
    for backend in ("eager", "inductor", "primus_turbo"):
        torch._dynamo.reset()
        turbo_inductor.reset_records()
        model = copy.deepcopy(base)
        run = model if backend == "eager" else torch.compile(model, backend=backend)

        def step():
            x.grad = None
            model.zero_grad(set_to_none=True)
            out = run(x)
            out.backward(cotangent)
            return out

        start = time.perf_counter()
        out = step().detach()
        if device == "cuda":
            torch.cuda.synchronize()
        compile_s = time.perf_counter() - start
        results[backend] = {"ms": time_ms(step, device), "compile_s": compile_s, "out": out,
                            "grad": x.grad.detach().clone()}
        if backend == "primus_turbo":
            print("fused:", turbo_inductor.rewrite_counts())

    ref = results["inductor"]
    print(f"{'backend':14s} {'step ms':>9s} {'vs inductor':>12s} {'compile s':>10s} {'max|out-ind|':>13s} "
          f"{'max|dx-ind|':>12s}")
    for backend, r in results.items():
        print(f"{backend:14s} {r['ms']:9.3f} {ref['ms'] / r['ms']:11.2f}x {r['compile_s']:10.1f} "
              f"{(r['out'] - ref['out']).abs().max().item():13.4f} {(r['grad'] - ref['grad']).abs().max().item():12.4f}")


if __name__ == "__main__":
    main()
