"""FP8 linear forward with dynamic quantization of x and W (8192x4096 -> 14336, bf16 in and out) on the GPU:
the bare FP8 GEMM, Inductor's compilation of the same math (amax, scale, cast, torch._scaled_mm), F.linear compiled
with backend="primus_turbo" and options={"fp8": recipe} per recipe, and the bf16 linear, in one run.
python benchmarks/bench_fp8.py"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from common import bench_ms, report

E4M3_MAX = 448.0


def inductor_fp8_linear(x, w):
    """Tensorwise dynamic scaling written by hand, as torchao-style code does."""
    sx = x.abs().amax().float().clamp(min=1e-12) / E4M3_MAX
    sw = w.abs().amax().float().clamp(min=1e-12) / E4M3_MAX
    x8 = (x.float() / sx).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    w8 = (w.float() / sw).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)


def main():
    import turbo_inductor

    tokens, k, n = 8192, 4096, 14336
    x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    flops = 2 * tokens * k * n
    x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    compiled = torch.compile(inductor_fp8_linear)
    variants = {
        "bare fp8 GEMM (_scaled_mm, pre-quantized)": lambda: torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one,
                                                                             out_dtype=torch.bfloat16),
        "inductor": lambda: compiled(x, w),
        "bf16 linear": lambda: x @ w.t(),
    }
    for recipe in ("tensorwise", "rowwise", "blockwise", "mxfp8"):
        linear = torch.compile(lambda x, w: F.linear(x, w), backend="primus_turbo", options={"fp8": recipe})
        variants[f"primus_turbo fp8 {recipe}"] = (lambda f: lambda: f(x, w))(linear)
    for recipe in ("blockwise", "mxfp8"):  # the opt-in Triton FP8 GEMM instead of the emulation
        linear = torch.compile(lambda x, w: F.linear(x, w), backend="primus_turbo",
                               options={"fp8": recipe, "impl": "fp8_gemm=triton"})
        variants[f"primus_turbo fp8 {recipe} (Triton GEMM)"] = (lambda f: lambda: f(x, w))(linear)
    rows = []
    with torch.no_grad():
        for name, fn in variants.items():
            ms = bench_ms(fn)
            rows.append({"shape": f"fp8 linear fwd {tokens}x{k}->{n}", "mode": "fwd", "backend": name, "ms": ms,
                         "rate": flops / ms / 1e9})
    print("rewrites:", turbo_inductor.rewrite_counts())
    report("fp8_linear", rows, rate_unit="TFLOP/s")


if __name__ == "__main__":
    main()
