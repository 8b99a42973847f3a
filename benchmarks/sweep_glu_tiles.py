"""The SwiGLU Triton kernels' tilings swept on the GPU: forward and backward kernel time per tiling, against
Inductor's kernels for the same math. ``python -m benchmarks.sweep_glu_tiles [--shapes 8192x14336]``"""

from __future__ import annotations

import argparse
import itertools

import torch

from benchmarks.bench_glu import swiglu
from benchmarks.common import fwd_bwd_step, gpu_ms
from benchmarks.record import environment

# (TILE_ELEMENTS, TILE_ELEMENTS_PER_THREAD, MAX_BLOCK_F) tried; the module's own values are always included.
CANDIDATES = list(itertools.product((2048, 4096, 8192), (8, 16, 32), (2048, 4096)))


def inductor_ms(g, u) -> tuple[float, float]:
    """Inductor's compiled silu(g) * u: forward, and forward+backward, GPU ms."""
    compiled = torch.compile(swiglu, backend="inductor")
    with torch.no_grad():
        fwd = gpu_ms(lambda: compiled(g, u))
    return fwd, gpu_ms(fwd_bwd_step(compiled, g.requires_grad_(), u.requires_grad_()))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="8192x14336,16384x14336")
    args = parser.parse_args()
    from turbo_inductor.kernels.triton import glu

    default = (glu.TILE_ELEMENTS, glu.TILE_ELEMENTS_PER_THREAD, glu.MAX_BLOCK_F)
    print(f"# glu tiles: {environment()}; module default {default}")
    print(
        "| shape | tile elements | per thread | max block F | fwd GPU ms | fwd+bwd GPU ms | fwd vs inductor | "
        "fwd+bwd vs inductor |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        rows, width = map(int, shape.split("x"))
        g, u, dout = (torch.randn(rows, width, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        ind_fwd, ind_bwd = inductor_ms(g.clone(), u.clone())
        print(f"| {shape} | inductor | | | {ind_fwd:.4f} | {ind_bwd:.4f} | 1.00x | 1.00x |")
        for tile, per_thread, max_f in sorted(set(CANDIDATES) | {default}):
            glu.TILE_ELEMENTS, glu.TILE_ELEMENTS_PER_THREAD, glu.MAX_BLOCK_F = tile, per_thread, max_f
            fwd = gpu_ms(lambda: glu.glu_fwd(g, u, None, None, "silu"))
            bwd = fwd + gpu_ms(lambda: glu.glu_bwd(dout, g, u, None, None, "silu", False))
            mark = " (default)" if (tile, per_thread, max_f) == default else ""
            print(
                f"| {shape} | {tile}{mark} | {per_thread} | {max_f} | {fwd:.4f} | {bwd:.4f} | "
                f"{ind_fwd / fwd:.3f}x | {ind_bwd / bwd:.3f}x |",
                flush=True,
            )
        glu.TILE_ELEMENTS, glu.TILE_ELEMENTS_PER_THREAD, glu.MAX_BLOCK_F = default


if __name__ == "__main__":
    main()
