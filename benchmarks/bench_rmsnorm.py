"""RMSNorm forward and forward+backward on the GPU: eager, backend="inductor", backend="primus_turbo" (and the
op called directly), in one run. Usage: python benchmarks/bench_rmsnorm.py [--shapes 8192x4096,16384x8192]"""
from __future__ import annotations

import argparse

import torch

from common import bench_ms, fwd_bwd_step, report


def hf_rmsnorm(x, weight, eps=1e-5):
    """The Hugging Face spelling, as models write it."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def hf_residual_rmsnorm(x, residual, weight, eps=1e-5):
    total = x + residual
    return hf_rmsnorm(total, weight, eps), total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="8192x4096,16384x8192")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    import turbo_inductor

    dtype = getattr(torch, args.dtype)
    rows = []
    for shape in args.shapes.split(","):
        tokens, hidden = map(int, shape.split("x"))
        x = torch.randn(tokens, hidden, device="cuda", dtype=dtype, requires_grad=True)
        r = torch.randn_like(x, requires_grad=True)
        w = torch.randn(hidden, device="cuda", dtype=dtype, requires_grad=True)
        n = tokens * hidden * x.element_size()
        cases = {
            "rmsnorm": (hf_rmsnorm, (x, w), 2 * n, 5 * n,
                        lambda x, w: turbo_inductor.ops.rmsnorm(x, w, eps=1e-5)),
            # fwd reads x, r and writes y, sum; bwd reads dy, dsum, sum and writes one dx (shared by x and r)
            "rmsnorm+residual": (hf_residual_rmsnorm, (x, r, w), 4 * n, 8 * n,
                                 lambda x, r, w: turbo_inductor.ops.rmsnorm_residual(x, r, w, eps=1e-5)),
        }
        for name, (fn, inputs, fwd_bytes, total_bytes, direct) in cases.items():
            # Plain launches (CPU launch overhead included, as a user without CUDA graphs sees it) and CUDA graphs
            # (kernel time only: what the GPU does).
            variants = [("", "eager", fn), ("", "op (eager call)", direct)]
            for graphs in (False, True):
                options = {"triton.cudagraphs": graphs}
                variants += [(" (cudagraphs)" if graphs else "", backend,
                              torch.compile(fn, backend=backend, options=options))
                             for backend in ("inductor", "primus_turbo")]
            for suffix, backend, f in variants:
                with torch.no_grad():
                    ms = bench_ms(lambda: f(*inputs))
                rows.append({"shape": f"{name} {tokens}x{hidden}", "mode": "fwd" + suffix, "backend": backend,
                             "ms": ms, "rate": fwd_bytes / ms / 1e9})
                ms = bench_ms(fwd_bwd_step(f, *inputs))
                rows.append({"shape": f"{name} {tokens}x{hidden}", "mode": "fwd+bwd" + suffix, "backend": backend,
                             "ms": ms, "rate": total_bytes / ms / 1e9})
        print("rewrites:", turbo_inductor.rewrite_counts(), "kernels:", turbo_inductor.kernel_calls())
    report("rmsnorm", rows)


if __name__ == "__main__":
    main()
