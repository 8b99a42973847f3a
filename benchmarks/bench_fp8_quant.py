"""FP8 quantization (tensorwise and rowwise, row-major and transposed) of the operands a Llama-3-8B layer's FP8
linears quantize (batch 2 x seq 4096), on the GPU: the reference implementation eager and compiled by Inductor, our
Triton kernels (under launch-heuristic variants on request) and the native kernels where built, in one run. TB/s
counts reading x (2 bytes per element) and writing q (1 byte), or both layouts (2 bytes); a two-pass quantization
reads x twice and cannot reach it.
python benchmarks/bench_fp8_quant.py [--heuristics default,...]"""

from __future__ import annotations

import argparse

import torch
from common import available_impls, bench_ms, report

# [rows, cols] of x, activations' gradients and weights (K: 4096 and 14336; N: 6144, 4096, 28672).
SHAPES = ((8192, 4096), (8192, 14336), (8192, 28672), (28672, 4096), (4096, 14336))
# Launch-heuristic variants (module constants of kernels.triton.fp8_quant).
HEURISTICS = {
    "default": {},
    "long rows in two passes (MAX_TILE_ELEMENTS=8192)": {"MAX_TILE_ELEMENTS": 8192},
    "bigger tiles (TILE_ELEMENTS=8192)": {"TILE_ELEMENTS": 8192},
    "8 elements per thread": {"ELEMENTS_PER_THREAD": 8},
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--heuristics", default="default", help="comma-separated names of HEURISTICS")
    args = parser.parse_args()
    from turbo_inductor.kernels import registry
    from turbo_inductor.kernels.reference import fp8_quant as reference
    from turbo_inductor.kernels.triton import fp8_quant as triton_fp8

    compiled_reference = torch.compile(reference.fp8_quantize)
    defaults = {name: getattr(triton_fp8, name) for variant in HEURISTICS.values() for name in variant}
    rows = []
    for M, K in SHAPES:
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        whole = max(M, K)  # the whole dimension in either layout
        # mode: (blocks, transpose, both layouts); a transposed operand's rowwise blocks are x's columns.
        modes = {
            "tensorwise": ((M, K), False, False),
            "tensorwise transposed": ((M, K), True, False),
            "rowwise": ((1, K), False, False),
            "rowwise transposed": ((M, 1), True, False),
            "tensorwise both layouts": ((whole, whole), False, True),
            "rowwise both layouts": ((1, whole), False, True),
        }
        for mode, (blocks, transpose, both) in modes.items():
            args_ = (x, torch.float8_e4m3fn, *blocks, transpose)
            variants = [("eager", {}, reference.fp8_quantize), ("inductor", {}, compiled_reference)]
            variants += [(name, HEURISTICS[name], triton_fp8.fp8_quantize) for name in args.heuristics.split(",")]
            variants += [
                ("native", {}, registry.implementations("fp8_quantize")["native"].fn)
                for _ in available_impls("fp8_quantize", ("native",))
            ]
            for name, constants, quantize in variants:
                for constant, value in {**defaults, **constants}.items():
                    setattr(triton_fp8, constant, value)
                ms = bench_ms(lambda: quantize(*args_, both_layouts=both))
                rows.append(
                    {
                        "shape": f"{M}x{K}",
                        "mode": mode,
                        "backend": name,
                        "ms": ms,
                        "rate": (4 if both else 3) * x.numel() / ms / 1e9,
                    }
                )
        copy_ms = bench_ms(lambda: x.clone())
        print(f"copy {M}x{K}: {copy_ms:.4f} ms, {2 * x.nbytes / copy_ms / 1e9:.2f} TB/s")
    report("fp8_quant", rows)


if __name__ == "__main__":
    main()
