"""Shared by the op benchmarks: timing on the GPU, the backends side by side, the printed table."""

from __future__ import annotations

import collections
import contextlib
import functools

import torch

# Each benchmark compiles the same function for several backends, grad modes and shapes: keep all of them compiled
# (past the default limit Dynamo silently falls back to eager and the numbers would be eager's).
torch._dynamo.config.recompile_limit = 64
torch._dynamo.config.accumulated_recompile_limit = 1024


@contextlib.contextmanager
def module_constants(module, values: dict):
    """``module``'s constants (a kernel's launch heuristics) set to ``values`` for the block, then restored."""
    saved = {name: getattr(module, name) for name in values}
    for name, value in values.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


def bench_ms(fn) -> float:
    """Median time of ``fn`` in ms (CUDA events through triton's do_bench)."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=50, rep=300, return_mode="median")


def kernel_us(fn, steps: int = 10) -> dict[str, float]:
    """GPU time per call of ``fn``, per kernel name, in us: the profiler's device events only, so host time (Python,
    launches, waiting) never counts. Where a step is host-bound, wall-clock ratios measure the host; these do not."""
    return device_us(profiled(fn, steps), steps)


def profiled(fn, steps: int):
    """A finished ``torch.profiler`` run of the GPU's activity over ``steps`` calls of ``fn``, after one."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    return prof


def launch_us(trace: dict, steps: int) -> dict[str, float]:
    """Device time per step of each kernel per launch grid, in us, from a profiler run's Chrome trace
    (``export_chrome_trace``): "name grid [x, y, z]". A kernel launched for several operands (a quantization of W,
    of x, of dy) has a grid per operand shape, where the kernel table has one name."""
    times: dict[str, float] = collections.defaultdict(float)
    for event in trace.get("traceEvents", []):
        if event.get("cat") == "kernel":
            times[f"{event['name']} grid {event.get('args', {}).get('grid')}"] += event.get("dur", 0.0) / steps
    return dict(times)


def device_us(prof, steps: int) -> dict[str, float]:
    """Device time per step of each kernel a finished ``torch.profiler`` run recorded over ``steps`` steps, in us
    (device events only: a CPU op's own "device time" would count its kernels twice)."""
    times = collections.defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times[event.name] += event.device_time / steps
    return dict(times)


def gpu_ms(fn) -> float:
    """GPU time of one call of ``fn`` in ms: the sum of its kernels' device times."""
    return sum(kernel_us(fn).values()) / 1e3


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


def available_impls(kernel: str, names=("triton", "native")) -> list[str]:
    """Which of ``names`` implement ``kernel`` on this GPU (native: where the extension was built)."""
    from turbo_inductor.kernels import registry

    impls = registry.implementations(kernel)
    return [n for n in names if n in impls and impls[n].unavailable_reason(torch.device("cuda")) is None]


def bench_backends(
    rows: list, label: str, fn, inputs, direct, fwd_bytes: int, total_bytes: int, impls: tuple[str, ...] = ()
) -> None:
    """Appends to ``rows`` the forward and forward+backward of ``fn(*inputs)`` under eager, ``direct`` (the op called
    directly), Inductor and primus_turbo, and per name in ``impls`` the op and primus_turbo with that implementation.
    Each row has the wall-clock time (host time counts), the GPU time (kernels only) and TB/s from the GPU time."""
    variants = [("eager", fn), ("op (eager call)", direct)]
    variants += [(f"op impl={impl}", functools.partial(direct, impl=impl)) for impl in impls]
    variants += [(backend, torch.compile(fn, backend=backend)) for backend in ("inductor", "primus_turbo")]
    variants += [
        (f"primus_turbo impl={impl}", torch.compile(fn, backend="primus_turbo", options={"impl": impl}))
        for impl in impls
    ]
    for backend, f in variants:
        # Dynamo checks the guards of every earlier compilation of fn's code on each call: start each variant
        # with none, so that no variant pays for the others' (fn is compiled for grad and no-grad below).
        torch._dynamo.reset()
        with torch.no_grad():
            forward = lambda: f(*inputs)  # noqa: E731
            ms, gpu = bench_ms(forward), gpu_ms(forward)
        rows.append(
            {"shape": label, "mode": "fwd", "backend": backend, "ms": ms, "gpu_ms": gpu, "rate": fwd_bytes / gpu / 1e9}
        )
        step = fwd_bwd_step(f, *inputs)
        ms, gpu = bench_ms(step), gpu_ms(step)
        rows.append(
            {
                "shape": label,
                "mode": "fwd+bwd",
                "backend": backend,
                "ms": ms,
                "gpu_ms": gpu,
                "rate": total_bytes / gpu / 1e9,
            }
        )


def print_table(name: str, rows: list[dict], rate_unit: str = "TB/s") -> None:
    """Adds to each row its ratio to Inductor's row of the same shape and mode, where one was measured
    (``speedup_vs_inductor``; with GPU times also ``gpu_speedup_vs_inductor``) and prints the rows as a markdown
    table."""
    gpu = all("gpu_ms" in row for row in rows)
    copy = all("copy_pct" in row for row in rows)  # the rate as % of a copy's of the same tensor
    print(f"\n{name}:")
    print(
        f"| shape | mode | backend | ms | {'GPU ms | ' if gpu else ''}{rate_unit} | {'% of copy | ' if copy else ''}"
        "speedup vs inductor |" + (" GPU-time speedup |" if gpu else "")
    )
    print("|---|---|---|---|---|---|" + ("---|" if copy else "") + ("---|---|" if gpu else ""))
    for row in rows:
        base = next(
            (r for r in rows if r["shape"] == row["shape"] and r["mode"] == row["mode"] and r["backend"] == "inductor"),
            None,
        )
        line = f"| {row['shape']} | {row['mode']} | {row['backend']} | {row['ms']:.4f} | "
        if gpu:
            line += f"{row['gpu_ms']:.4f} | "
        line += f"{row['rate']:.2f} | " + (f"{row['copy_pct']:.0f}% | " if copy else "")
        if base is None:
            print(line + " - |" + (" - |" if gpu else ""))
            continue
        row["speedup_vs_inductor"] = base["ms"] / row["ms"]
        line += f"{row['speedup_vs_inductor']:.2f}x |"
        if gpu:
            row["gpu_speedup_vs_inductor"] = base["gpu_ms"] / row["gpu_ms"]
        print(line + (f" {row['gpu_speedup_vs_inductor']:.2f}x |" if gpu else ""))
