"""The kernels aiter implements, each timed under every implementation that runs on this GPU and takes the call
(aiter, Triton, native, the vendor BLAS, the reference), at a Llama-3-8B layer's sizes (batch 2 x seq 4096).
ms per call: the median of triton.testing.do_bench. Writes impls.json (benchmarks/record.py).
python benchmarks/bench_impls.py [--tokens 8192]"""

from __future__ import annotations

import argparse

import torch

from benchmarks import record
from benchmarks.common import bench_ms

HIDDEN, FFN = 4096, 14336


def cases(tokens: int, device: torch.device):
    """(kernel, case, arguments) of the calls to time."""
    from turbo_inductor.kernels import registry
    from turbo_inductor.kernels.reference.fp8_quant import device_formats

    e4m3 = device_formats(device)[0]
    x, r = (torch.randn(tokens, HIDDEN, device=device, dtype=torch.bfloat16) for _ in range(2))
    w = (torch.rand(HIDDEN, device=device) + 0.5).to(torch.bfloat16)
    yield "rmsnorm_fwd", f"{tokens}x{HIDDEN}", (x, w, None, 1e-6)
    yield "rmsnorm_fwd", f"{tokens}x{HIDDEN} + residual", (x, w, r, 1e-6)
    for name, block in (("tensorwise", (tokens, HIDDEN)), ("rowwise", (1, HIDDEN)), ("1x128", (1, 128))):
        yield "fp8_quantize", f"{name} {tokens}x{HIDDEN}", (x, e4m3, *block, False)
    quantize = registry.select("fp8_quantize", device)
    for n, k in ((FFN, HIDDEN), (HIDDEN, FFN)):
        a_in, b_in = torch.randn(tokens, k, device=device), torch.randn(n, k, device=device)
        for name, a_block, b_block in (("rowwise", (1, k), (1, k)), ("blockwise", (1, 128), (128, 128))):
            a, a_scale = quantize(a_in, e4m3, *a_block, False)
            b, b_scale = quantize(b_in, e4m3, *b_block, False)
            yield "fp8_gemm", f"{name} {tokens}x{k} -> {n}", (a, a_scale, b, b_scale, torch.bfloat16)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=8192)
    args = parser.parse_args()
    from turbo_inductor.kernels import registry

    device = torch.device("cuda", torch.cuda.current_device())
    env = record.environment()
    print(f"{env['machine']}, torch {env['torch']}, triton {env['triton']}")
    print("| kernel | case | implementation | ms | speedup vs triton |\n|---|---|---|---|---|")
    rows = []
    for kernel, case, call in cases(args.tokens, device):
        times = {}
        for name, impl in sorted(registry.implementations(kernel).items()):
            why_not = impl.unavailable_reason(device) or impl.declines(*call)
            if why_not is None:
                try:
                    impl.fn(*call)  # the first call builds what it needs (aiter's JIT: minutes)
                    times[name] = bench_ms(lambda impl=impl: impl.fn(*call))
                except Exception as error:  # noqa: BLE001  (reported, and the others still run)
                    why_not = f"failed: {type(error).__name__}: {error}"
            rows.append(dict(kernel=kernel, case=case, implementation=name, ms=times.get(name), why_not=why_not))
        for name, ms in sorted(times.items(), key=lambda item: item[1]):
            ratio = f"{times['triton'] / ms:.2f}x" if "triton" in times else ""
            print(f"| {kernel} | {case} | {name} | {ms:.4f} | {ratio} |")
    skipped = {(r["kernel"], r["implementation"], r["why_not"]) for r in rows if r["why_not"]}
    for kernel, name, why_not in sorted(skipped):
        print(f"not timed: {kernel} {name}: {why_not}")
    record.write("impls", [], {}, rows)


if __name__ == "__main__":
    main()
