"""RMSNorm, alone and after a residual add, forward and forward+backward on the GPU: eager, Inductor, primus_turbo
and the op called directly, in one run. ``python -m benchmarks.bench_rmsnorm [--shapes 8192x4096,...] [--impls]``"""

from __future__ import annotations

import argparse

import torch

from benchmarks import record
from benchmarks.common import available_impls, bench_backends, gpu_ms, print_table


def hf_rmsnorm(x, weight, eps=1e-5):
    """The Hugging Face spelling, as models write it."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def hf_residual_rmsnorm(x, residual, weight, eps=1e-5):
    total = x + residual
    return hf_rmsnorm(total, weight, eps), total


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("``")[0])
    parser.add_argument("--shapes", default="8192x4096", help="tokens x hidden, comma-separated")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument(
        "--impls", action="store_true", help="also a column per kernel implementation available on this GPU"
    )
    parser.add_argument("--out", default=None, help="folder for the JSON (default: $OUT, else benchmarks/out)")
    args = parser.parse_args(argv)
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
            "rmsnorm": (
                hf_rmsnorm,
                (x, w),
                2 * n,
                5 * n,
                lambda x, w, impl="auto": turbo_inductor.ops.rmsnorm(x, w, eps=1e-5, impl=impl),
            ),
            # fwd reads x, r and writes y, sum; bwd reads dy, dsum, sum and writes one dx (shared by x and r)
            "rmsnorm+residual": (
                hf_residual_rmsnorm,
                (x, r, w),
                4 * n,
                8 * n,
                lambda x, r, w, impl="auto": turbo_inductor.ops.rmsnorm_residual(x, r, w, eps=1e-5, impl=impl),
            ),
        }
        for name, (fn, inputs, fwd_bytes, total_bytes, direct) in cases.items():
            bench_backends(
                rows,
                f"{name} {tokens}x{hidden}",
                fn,
                inputs,
                direct,
                fwd_bytes,
                total_bytes,
                impls=tuple(available_impls("rmsnorm_fwd")) if args.impls else (),
            )
        copy_ms = gpu_ms(lambda: x.detach().clone())
        print(f"copy {tokens}x{hidden}: {copy_ms:.4f} ms GPU, {2 * n / copy_ms / 1e9:.2f} TB/s")
        print("rewrites:", turbo_inductor.rewrite_counts(), "kernels:", turbo_inductor.kernel_calls())
    print_table("rmsnorm", rows)
    record.write("rmsnorm", record.changed_options(parser, args, ignore={"out"}), vars(args), rows, args.out)


if __name__ == "__main__":
    main()
