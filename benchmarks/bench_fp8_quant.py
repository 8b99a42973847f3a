"""FP8 quantization (tensorwise and rowwise, row-major, transposed and both layouts) of a Llama-3-8B layer's operands
on the GPU: the reference eager and compiled by Inductor, the Triton kernels and the native ones where built.
``python -m benchmarks.bench_fp8_quant [--shapes 8192x4096,...] [--heuristics default,...]``"""

from __future__ import annotations

import argparse

import torch

from benchmarks import record
from benchmarks.common import available_impls, bench_ms, print_table

# [rows, cols] of operands at batch 2 x seq 4096: x and dy (K 4096), the down projection's x (K 14336), a weight.
SHAPES = "8192x4096,8192x14336,4096x14336"
# Launch-heuristic variants (module constants of kernels.triton.fp8_quant).
HEURISTICS = {
    "default": {},
    "long rows in two passes (MAX_TILE_ELEMENTS=8192)": {"MAX_TILE_ELEMENTS": 8192},
    "bigger tiles (TILE_ELEMENTS=8192)": {"TILE_ELEMENTS": 8192},
    "8 elements per thread": {"ELEMENTS_PER_THREAD": 8},
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("``")[0])
    parser.add_argument("--shapes", default=SHAPES, help="rows x columns, comma-separated")
    parser.add_argument("--heuristics", default="default", help=f"comma-separated, of {sorted(HEURISTICS)}")
    parser.add_argument("--out", default=None, help="folder for the JSON (default: $OUT, else benchmarks/out)")
    args = parser.parse_args(argv)
    from turbo_inductor.kernels import registry
    from turbo_inductor.kernels.reference import fp8_quant as reference
    from turbo_inductor.kernels.triton import fp8_quant as triton_fp8

    compiled_reference = torch.compile(reference.fp8_quantize)
    defaults = {name: getattr(triton_fp8, name) for variant in HEURISTICS.values() for name in variant}
    rows = []
    for M, K in (map(int, shape.split("x")) for shape in args.shapes.split(",")):
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
            variants += [
                ("triton" if name == "default" else f"triton: {name}", HEURISTICS[name], triton_fp8.fp8_quantize)
                for name in args.heuristics.split(",")
            ]
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
    print_table("fp8_quant", rows)
    record.write("fp8_quant", record.changed_options(parser, args, ignore={"out"}), vars(args), rows, args.out)


if __name__ == "__main__":
    main()
