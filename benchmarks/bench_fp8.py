"""FP8 linears on the GPU against Inductor: the forward per recipe, after a producer writing FP8, with frozen weights,
and a training step by size (where FP8 starts to pay). ``python -m benchmarks.bench_fp8 [--sizes 2048,4096,8192]``"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import turbo_inductor
from benchmarks import record
from benchmarks.common import bench_ms, fwd_bwd_step, gpu_ms, kernel_us, print_table

E4M3_MAX = 448.0


def inductor_fp8_linear(x, w):
    """Tensorwise dynamic scaling written by hand, as torchao-style code does (fast accumulation, as torchao's and
    our forward GEMM)."""
    sx = x.abs().amax().float().clamp(min=1e-12) / E4M3_MAX
    sw = w.abs().amax().float().clamp(min=1e-12) / E4M3_MAX
    x8 = (x.float() / sx).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    w8 = (w.float() / sw).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16, use_fast_accum=True)


def bare_fp8_gemm(x8: torch.Tensor, w8: torch.Tensor) -> torch.Tensor:
    """The FP8 GEMM alone on operands already quantized (unit scales), accumulating fast as our forward GEMM does."""
    one = torch.ones((), device=x8.device)
    return torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True)


def producer_then_linear(x: torch.Tensor, w: torch.Tensor, producer: str) -> list[dict]:
    """Rows of a producer ("rmsnorm" of x, or "swiglu" of x's halves) then the FP8 linear by w, with the producer
    writing FP8 and without; Inductor runs the hand-written tensorwise linear. Prints what the linear adds to the
    producer alone, in GPU time, against the bare FP8 GEMM's."""
    norm_weight = torch.rand(x.shape[1], device="cuda", dtype=x.dtype) + 0.5

    def produce(x):
        if producer == "rmsnorm":
            return F.rms_norm(x, (x.shape[1],), norm_weight, 1e-5)
        gate, up = x.chunk(2, -1)
        return F.silu(gate) * up

    fusion = {"rmsnorm": "rmsnorm_fp8", "swiglu": "glu_fp8"}[producer]
    # The columns share their code objects with the other producer's: without a reset, Dynamo would recompile them
    # for the new shapes with dynamic sizes, and a symbolic weight is no FP8 linear.
    torch._dynamo.reset()
    columns = {
        "inductor": torch.compile(lambda x, w: inductor_fp8_linear(produce(x), w)),
        f"primus_turbo {producer} alone": torch.compile(lambda x, w: produce(x), backend="primus_turbo"),
    }
    for recipe in ("rowwise", "blockwise"):
        for fuse in (True, False):
            name = f"primus_turbo fp8 {recipe}" + ("" if fuse else f" ({producer} not writing FP8)")
            columns[name] = torch.compile(
                lambda x, w: F.linear(produce(x), w), backend="primus_turbo", options={"fp8": recipe, fusion: fuse}
            )
    k = w.shape[1]
    x8 = torch.randn(x.shape[0], k, device="cuda").to(torch.float8_e4m3fn)  # the bare GEMM's pre-quantized operands
    w8 = w.to(torch.float8_e4m3fn)
    rows, shape = [], f"{producer} -> fp8 linear fwd {x.shape[0]}x{k}->{w.shape[0]}"
    with torch.no_grad():
        bare_gpu_ms = gpu_ms(lambda: bare_fp8_gemm(x8, w8))
        for name, fn in columns.items():
            kernels = kernel_us(lambda: fn(x, w))
            rows.append(
                {
                    "shape": shape,
                    "mode": "fwd",
                    "backend": name,
                    "ms": bench_ms(lambda: fn(x, w)),
                    "gpu_ms": sum(kernels.values()) / 1e3,
                    "rate": 2 * x.shape[0] * k * w.shape[0],
                }
            )
            rows[-1]["rate"] /= rows[-1]["ms"] * 1e9
            print(
                f"{name}: "
                + ", ".join(f"{k[:60]} {us:.1f} us" for k, us in sorted(kernels.items(), key=lambda kv: -kv[1]))
            )
    producer_gpu_ms = rows[1]["gpu_ms"]
    for row in rows[2:]:
        added = row["gpu_ms"] - producer_gpu_ms
        print(
            f"{row['backend']}: the linear adds {added:.4f} ms of GPU time to the {producer} alone = "
            f"{added / bare_gpu_ms:.3f}x the bare GEMM ({bare_gpu_ms:.4f} ms)"
        )
    print("rewrites:", turbo_inductor.rewrite_counts())
    return rows


class _ParameterLinear(torch.nn.Module):
    """``fn(x, weight)`` with the weight a parameter: what freezing makes a constant (a plain argument it leaves)."""

    def __init__(self, weight: torch.Tensor, fn):
        super().__init__()
        self.weight, self.fn = torch.nn.Parameter(weight, requires_grad=False), fn

    def forward(self, x):
        return self.fn(x, self.weight)


def frozen_inference(x: torch.Tensor, w: torch.Tensor) -> list[dict]:
    """The forward under ``torch._inductor.config.freezing``: constant folding quantizes W once when compiling (our
    ``quantize_weight`` node; Inductor's hand-written amax, scale and cast), so a call quantizes x alone. Wall and
    GPU time against the bare FP8 GEMM's."""
    torch._dynamo.reset()
    columns = {"inductor": _ParameterLinear(w, inductor_fp8_linear)}
    columns.update(
        {
            f"primus_turbo fp8 {recipe}": _ParameterLinear(w, F.linear)
            for recipe in ("tensorwise", "rowwise", "blockwise")
        }
    )
    x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    (tokens, k), n = x.shape, w.shape[0]
    shape, flops = f"frozen fp8 linear fwd {tokens}x{k}->{n}", 2 * tokens * k * n

    def row(name: str, fn) -> dict:
        kernels = kernel_us(fn)
        ms = bench_ms(fn)
        print(
            f"{name}: "
            + ", ".join(f"{kernel[:50]} {us:.1f} us" for kernel, us in sorted(kernels.items(), key=lambda kv: -kv[1]))
        )
        return {
            "shape": shape,
            "mode": "fwd",
            "backend": name,
            "ms": ms,
            "gpu_ms": sum(kernels.values()) / 1e3,
            "rate": flops / ms / 1e9,
        }

    with torch.no_grad(), torch._inductor.config.patch(freezing=True):
        rows = [row("bare fp8 GEMM (_scaled_mm, pre-quantized)", lambda: bare_fp8_gemm(x8, w8))]
        for name, module in columns.items():
            backend, _, recipe = name.partition(" fp8 ")
            fn = torch.compile(module, backend=backend, options={"fp8": recipe} if recipe else None)
            rows.append(row(name, lambda: fn(x)))
    for r in rows[1:]:
        print(
            f"{r['backend']} (frozen): {r['ms'] / rows[0]['ms']:.3f}x the bare GEMM's wall time "
            f"({rows[0]['ms']:.4f} ms), {r['gpu_ms'] / rows[0]['gpu_ms']:.3f}x its GPU time "
            f"({rows[0]['gpu_ms']:.4f} ms)"
        )
    return rows


def training_by_size(sizes: list[int], tokens: int = 8192) -> list[dict]:
    rows = []
    for d in sizes:
        torch._dynamo.reset()  # each size compiles afresh, static: no recompile limit, no dynamic-shape fallback
        x = torch.randn(tokens, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = (torch.randn(d, d, device="cuda", dtype=torch.bfloat16) * d**-0.5).requires_grad_()
        columns = {"inductor": torch.compile(F.linear, backend="inductor")}
        for recipe in ("tensorwise", "rowwise"):
            columns[f"primus_turbo fp8 {recipe}"] = torch.compile(
                lambda x, w: F.linear(x, w), backend="primus_turbo", options={"fp8": recipe}
            )
        for name, fn in columns.items():
            step = fwd_bwd_step(fn, x, w)
            ms = bench_ms(step)
            rows.append(
                {
                    "shape": f"linear {tokens}x{d}->{d}",
                    "mode": "fwd+bwd",
                    "backend": name,
                    "ms": ms,
                    "gpu_ms": gpu_ms(step),
                    "rate": 3 * 2 * tokens * d * d / ms / 1e9,
                }
            )
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("``")[0])
    parser.add_argument(
        "--sizes",
        default="2048,4096,8192",
        help="d of the training step's d x d linears (comma-separated; empty: none)",
    )
    parser.add_argument("--out", default=None, help="folder for the JSON (default: $OUT, else benchmarks/out)")
    args = parser.parse_args(argv)

    tokens, k, n = 8192, 4096, 14336
    x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    flops = 2 * tokens * k * n
    x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    compiled = torch.compile(inductor_fp8_linear)
    variants = {
        "bare fp8 GEMM (_scaled_mm, pre-quantized)": lambda: bare_fp8_gemm(x8, w8),
        "inductor": lambda: compiled(x, w),
        "bf16 linear": lambda: x @ w.t(),
    }
    for recipe in ("tensorwise", "rowwise", "blockwise", "mxfp8"):
        linear = torch.compile(lambda x, w: F.linear(x, w), backend="primus_turbo", options={"fp8": recipe})
        variants[f"primus_turbo fp8 {recipe}"] = (lambda f: lambda: f(x, w))(linear)
    # our Triton FP8 GEMM in place of cuBLASLt's block scaling (MXFP8 runs on it by default on Hopper)
    linear = torch.compile(
        lambda x, w: F.linear(x, w), backend="primus_turbo", options={"fp8": "blockwise", "impl": "fp8_gemm=triton"}
    )
    variants["primus_turbo fp8 blockwise (Triton GEMM)"] = lambda: linear(x, w)
    rows = []
    with torch.no_grad():
        for name, fn in variants.items():
            ms = bench_ms(fn)
            rows.append(
                {
                    "shape": f"fp8 linear fwd {tokens}x{k}->{n}",
                    "mode": "fwd",
                    "backend": name,
                    "ms": ms,
                    "rate": flops / ms / 1e9,
                }
            )
    print("rewrites:", turbo_inductor.rewrite_counts())
    print_table("fp8 linear", rows, rate_unit="TFLOP/s")
    gate_up = torch.randn(tokens, 2 * n, device="cuda", dtype=torch.bfloat16)
    w_down = torch.randn(k, n, device="cuda", dtype=torch.bfloat16) * 0.02
    sections = {
        "a producer writing FP8, then the fp8 linear": producer_then_linear(x, w, "rmsnorm")
        + producer_then_linear(gate_up, w_down, "swiglu"),
        "fp8 linear, frozen weights": frozen_inference(x, w),
    }
    if args.sizes:
        sections["training step by size"] = training_by_size([int(d) for d in args.sizes.split(",")])
    for name, section in sections.items():
        print_table(name, section, rate_unit="TFLOP/s")
        rows += section
    record.write("fp8", record.changed_options(parser, args, ignore={"out"}), vars(args), rows, args.out)


if __name__ == "__main__":
    main()
