"""Where RMSNorm's time goes on the GPU: the Triton kernels alone under launch variants, the op call, the compiled
call, and a profile of the compiled forward+backward. python benchmarks/tune_rmsnorm.py"""
from __future__ import annotations

import itertools

import torch

from common import bench_ms, fwd_bwd_step
from bench_rmsnorm import hf_rmsnorm
from turbo_inductor.kernels.triton import rmsnorm as k


def main():
    import turbo_inductor

    for tokens, hidden in [(8192, 4096), (16384, 8192)]:
        x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
        n = x.numel() * 2
        copy_ms = bench_ms(lambda: x.clone())
        y, _, rstd = k.rmsnorm_fwd(x, w, None, 1e-5)
        dy = torch.randn_like(y)
        print(f"\n{tokens}x{hidden}: clone {copy_ms:.4f} ms ({2 * n / copy_ms / 1e9:.2f} TB/s)")
        ms = bench_ms(lambda: k.rmsnorm_fwd(x, w, None, 1e-5))
        print(f"  triton fwd              {ms:.4f} ms {2 * n / ms / 1e9:.2f} TB/s")
        defaults = (k.BWD_PROGRAMS_PER_SM, k.BWD_PIPELINE_MAX_TILE_BYTES, k.BWD_ELEMENTS_PER_THREAD)
        for per_sm, pipeline, per_thread in itertools.product((1, 2, 4), (0, 1 << 20), (8, 16, 32)):
            k.BWD_PROGRAMS_PER_SM, k.BWD_PIPELINE_MAX_TILE_BYTES, k.BWD_ELEMENTS_PER_THREAD = per_sm, pipeline, per_thread
            ms = bench_ms(lambda: k.rmsnorm_bwd(dy, x, w, rstd, None))
            print(f"  triton bwd per_sm={per_sm} pipelined={bool(pipeline)} elems/thread={per_thread:2d} "
                  f"{ms:.4f} ms {3 * n / ms / 1e9:.2f} TB/s")
        k.BWD_PROGRAMS_PER_SM, k.BWD_PIPELINE_MAX_TILE_BYTES, k.BWD_ELEMENTS_PER_THREAD = defaults
        xr = x.clone().requires_grad_()
        wr = w.clone().requires_grad_()
        for name, f in [("op", lambda a, b: turbo_inductor.ops.rmsnorm(a, b, eps=1e-5)),
                        ("compiled", torch.compile(hf_rmsnorm, backend="primus_turbo"))]:
            with torch.no_grad():
                ms = bench_ms(lambda: f(xr, wr))
            step = fwd_bwd_step(f, xr, wr)
            print(f"  {name:8s} fwd {ms:.4f} ms   fwd+bwd {bench_ms(step):.4f} ms")
        if hidden == 4096:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                    torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    step()
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=60))
            print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=8, max_name_column_width=60))


if __name__ == "__main__":
    main()
