"""Where a compiled forward+backward's time goes, primus_turbo beside Inductor: GPU and host time per step, and the
profiler's top kernels and host entries. ``python -m benchmarks.profile_compiled``"""

import time

import torch

from benchmarks.bench_glu import swiglu
from benchmarks.bench_rmsnorm import hf_rmsnorm
from benchmarks.common import device_us, fwd_bwd_step

STEPS = 10


def profile(name, fn, *inputs):
    for backend in ("inductor", "primus_turbo"):
        step = fwd_bwd_step(torch.compile(fn, backend=backend), *inputs)
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(STEPS):
            step()
        host_us = (time.perf_counter() - start) / STEPS * 1e6  # the GPU queue is deep enough for STEPS steps
        torch.cuda.synchronize()
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        ) as prof:
            for _ in range(STEPS):
                step()
            torch.cuda.synchronize()
        events = prof.key_averages()
        gpu_us = sum(device_us(prof, STEPS).values())
        print(
            f"\n== {name} fwd+bwd x{STEPS}, backend={backend}: GPU time per step {gpu_us:.1f} us, "
            f"host time per step {host_us:.1f} us"
        )
        print(events.table(sort_by="self_cuda_time_total", row_limit=8, max_name_column_width=60))
        print(events.table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=60))


if __name__ == "__main__":
    x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    profile("rmsnorm 8192x4096", hf_rmsnorm, x, w)
    g = torch.randn(8192, 14336, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    profile("swiglu 8192x14336", swiglu, g, torch.randn_like(g, requires_grad=True))
