"""Shared by the op benchmarks: timing, environment facts, the result table."""
from __future__ import annotations

import datetime
import json
import os

import torch

# Each benchmark compiles the same function for several backends, grad modes and shapes: keep all of them compiled
# (past the default limit Dynamo silently falls back to eager and the numbers would be eager's).
torch._dynamo.config.recompile_limit = 64
torch._dynamo.config.accumulated_recompile_limit = 1024


def bench_ms(fn) -> float:
    """Median time of ``fn`` in ms (CUDA events through triton's do_bench)."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=50, rep=300, return_mode="median")


def fwd_bwd_step(fn, *inputs):
    """A closure that runs forward and backward of ``fn(*inputs)`` with a fixed random cotangent."""
    out = fn(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    cotangents = [torch.randn_like(o) for o in outs]

    def step():
        for t in inputs:
            t.grad = None
        result = fn(*inputs)
        torch.autograd.backward(result if isinstance(result, tuple) else (result,), cotangents)

    return step


def bench_backends(rows: list, label: str, fn, inputs, direct, fwd_bytes: int, total_bytes: int) -> None:
    """Forward (no grad) and forward+backward of ``fn(*inputs)``: eager, the op called directly (``direct``), and
    ``fn`` compiled with backend="inductor" and "primus_turbo"; one row each in ``rows``, rate in TB/s. Plain
    launches: host time counts wherever the host cannot stay ahead of the GPU, as a user without CUDA graphs sees."""
    variants = [("eager", fn), ("op (eager call)", direct)]
    variants += [(backend, torch.compile(fn, backend=backend)) for backend in ("inductor", "primus_turbo")]
    for backend, f in variants:
        # Dynamo checks the guards of every earlier compilation of fn's code on each call: start each variant
        # with none, so that no variant pays for the others' (fn is compiled for grad and no-grad below).
        torch._dynamo.reset()
        with torch.no_grad():
            ms = bench_ms(lambda: f(*inputs))
        rows.append({"shape": label, "mode": "fwd", "backend": backend, "ms": ms, "rate": fwd_bytes / ms / 1e9})
        ms = bench_ms(fwd_bwd_step(f, *inputs))
        rows.append({"shape": label, "mode": "fwd+bwd", "backend": backend, "ms": ms, "rate": total_bytes / ms / 1e9})


def environment() -> dict:
    import triton

    return {"date": datetime.date.today().isoformat(), "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__, "triton": triton.__version__}


def report(name: str, rows: list[dict], rate_unit: str = "TB/s") -> None:
    """Print a markdown table (ratio to Inductor of the same shape and mode) and write $OUT/<name>.json.
    Each row: shape, mode, backend, ms, rate (in ``rate_unit``)."""
    env = environment()
    print(f"\n{name}: {env['gpu']}, torch {env['torch']}, triton {env['triton']}, {env['date']}")
    print(f"| shape | mode | backend | ms | {rate_unit} | speedup vs inductor |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        base = next(r["ms"] for r in rows if r["shape"] == row["shape"] and r["mode"] == row["mode"]
                    and r["backend"] == "inductor")
        row["speedup_vs_inductor"] = base / row["ms"]
        print(f"| {row['shape']} | {row['mode']} | {row['backend']} | {row['ms']:.4f} | {row['rate']:.2f} "
              f"| {row['speedup_vs_inductor']:.2f}x |")
    out = os.environ.get("OUT", ".")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump({"environment": env, "rows": rows}, f, indent=1)
