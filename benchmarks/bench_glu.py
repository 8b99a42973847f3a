"""SwiGLU (two inputs, a fused gate/up input, and weighted by router probabilities) forward and forward+backward
on the GPU: eager, Inductor, primus_turbo and the op called directly. ``python -m benchmarks.bench_glu [--shapes]``"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from benchmarks import record
from benchmarks.common import bench_backends, print_table


def swiglu(g, u):
    return F.silu(g) * u


def swiglu_fused(x):
    g, u = x.chunk(2, -1)
    return F.silu(g) * u


def swiglu_probs(x, probs):
    """The MoE form: act(x[:, :F]) * x[:, F:] * probs[:, None]."""
    half = x.shape[-1] // 2
    return F.silu(x[:, :half]) * x[:, half:] * probs[:, None].to(x.dtype)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("``")[0])
    parser.add_argument("--shapes", default="8192x14336", help="tokens x intermediate width, comma-separated")
    parser.add_argument("--out", default=None, help="folder for the JSON (default: $OUT, else benchmarks/out)")
    args = parser.parse_args(argv)
    import turbo_inductor

    rows = []
    for shape in args.shapes.split(","):
        tokens, width = map(int, shape.split("x"))
        g = torch.randn(tokens, width, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        u = torch.randn_like(g, requires_grad=True)
        x = torch.randn(tokens, 2 * width, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        probs = torch.rand(tokens, device="cuda", requires_grad=True)
        n = g.numel() * g.element_size()
        cases = {  # name: (function, inputs, direct op call); bytes: fwd reads 2n writes n, bwd reads 3n writes 2n
            "swiglu": (swiglu, (g, u), lambda g, u: turbo_inductor.ops.swiglu(g, u)),
            "swiglu fused gate/up": (swiglu_fused, (x,), lambda x: turbo_inductor.ops.glu_fused(x)),
            "swiglu probs (MoE)": (swiglu_probs, (x, probs), lambda x, p: turbo_inductor.ops.glu_fused(x, p)),
        }
        for name, (fn, inputs, direct) in cases.items():
            bench_backends(rows, f"{name} {tokens}x{width}", fn, inputs, direct, 3 * n, 8 * n)
        print("rewrites:", turbo_inductor.rewrite_counts(), "kernels:", turbo_inductor.kernel_calls())
    print_table("glu", rows)
    record.write("glu", record.changed_options(parser, args, ignore={"out"}), vars(args), rows, args.out)


if __name__ == "__main__":
    main()
