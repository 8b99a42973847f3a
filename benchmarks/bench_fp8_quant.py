"""FP8 quantization on the GPU, each kernel's GPU time against a copy of the same tensor: a Llama-3-8B layer's
operands (tensorwise and rowwise, row-major, transposed and both layouts) and, with ``--moe``, an MoE layer's expert
operands (x and dy grouped and transposed per expert, and their FP8 rowwise copies transposed per expert; dy per row by
expert, W in both per-expert layouts). Backends: the reference eager and compiled by Inductor, the Triton kernels (with
launch-heuristic variants) and the native ones where built. ``python -m benchmarks.bench_fp8_quant [--shapes
8192x4096,...] [--heuristics default,...] [--moe mixtral-8x7b]``"""

from __future__ import annotations

import argparse

import torch

from benchmarks import record
from benchmarks.bench_grouped_mm import CONFIGS, TOKENS, projections, routing
from benchmarks.common import available_impls, bench_ms, gpu_ms, module_constants, print_table

# [rows, cols] of operands at batch 2 x seq 4096: x and dy (K 4096), the down projection's x (K 14336), a weight.
SHAPES = "8192x4096,8192x14336,4096x14336"
# Launch-heuristic variants: module constants of kernels.triton.fp8_quant (HEURISTICS) and of
# kernels.triton.fp8_quant_grouped (GROUPED_HEURISTICS).
# Both layouts, x^T's blocks a column of x, by two calls (x read three times): the baseline of the column maxima.
BY_TWO_CALLS = "both layouts by two calls (COLUMN_MAXIMA_PROGRAMS=0)"
HEURISTICS = {
    "default": {},
    "long rows in two passes (MAX_TILE_ELEMENTS=8192)": {"MAX_TILE_ELEMENTS": 8192},
    "bigger tiles (TILE_ELEMENTS=8192)": {"TILE_ELEMENTS": 8192},
    "8 elements per thread": {"ELEMENTS_PER_THREAD": 8},
    BY_TWO_CALLS: {"COLUMN_MAXIMA_PROGRAMS": 0},
    "column maxima over 512 programs": {"COLUMN_MAXIMA_PROGRAMS": 512},
    "column maxima over 2048 programs": {"COLUMN_MAXIMA_PROGRAMS": 2048},
    "looping programs, one tile in flight (LOOP_STAGES=1)": {"LOOP_STAGES": 1},
}
GROUPED_HEURISTICS = {
    "default": {},
    "256 rows a step at 8 warps": {"BLOCK_ROWS": 256, "NUM_WARPS": 8},
    "128 rows a step at 8 warps": {"BLOCK_ROWS": 128, "NUM_WARPS": 8},
    "2 programs per SM": {"PROGRAMS_PER_SM": 2},
    "128 columns an item": {"BLOCK_COLS": 128},
    "one tile in flight (STAGES=1)": {"STAGES": 1},
    "two tiles in flight (STAGES=2)": {"STAGES": 2},
    # The cast walk's rows from L2: a group's column block (Mixtral: 4096 rows x 32 columns, 256 KB) per program, 132
    # in flight (34 MB) against the H100's 50 MB; the default's 528 x 512 KB read them from HBM again. Slower on an
    # H100 at every operand (Mixtral down x: 27% and 42% of copy, the default 47%): short rows lose more than L2 gives.
    "L2-resident walks: 1 program per SM, 32 columns, 256 rows a step": {
        "PROGRAMS_PER_SM": 1,
        "BLOCK_COLS": 32,
        "BLOCK_ROWS": 256,
        "NUM_WARPS": 8,
    },
    "2 programs per SM, 32 columns, 128 rows a step": {"PROGRAMS_PER_SM": 2, "BLOCK_COLS": 32, "BLOCK_ROWS": 128},
    "4 programs per SM": {"PROGRAMS_PER_SM": 4},
}


def measure(rows: list, shape: str, mode: str, module, variants, call, moved_bytes: int, copy_tbps: float) -> None:
    """Appends a row per (backend, fn, constants of ``module`` it sets) of ``variants``: ``call(fn)`` timed, its GPU
    time as TB/s of the bytes an ideal kernel moves (each input read once, each output written once), and that as %
    of the copy's."""
    for name, fn, constants in variants:
        with module_constants(module, constants):
            run = lambda: call(fn)  # noqa: E731
            ms, gpu = bench_ms(run), gpu_ms(run)
        rate = moved_bytes / gpu / 1e9
        rows.append(
            {"shape": shape, "mode": mode, "backend": name, "ms": ms, "gpu_ms": gpu, "rate": rate}
            | {"copy_pct": 100 * rate / copy_tbps}
        )


def triton_variants(fn, table: dict, names: list[str]) -> list[tuple]:
    """The Triton kernel ``fn`` under each named launch-heuristic variant of ``table``."""
    return [("triton" if name == "default" else f"triton: {name}", fn, table[name]) for name in names]


def native_quantize() -> list[tuple]:
    """The native quantization kernel, where built."""
    from turbo_inductor.kernels import registry

    return [
        ("native", registry.implementations("fp8_quantize")["native"].fn, {})
        for _ in available_impls("fp8_quantize", ("native",))
    ]


def copy_rate(x: torch.Tensor) -> float:
    """TB/s of a copy of ``x`` in GPU time (it reads and writes x's bytes once)."""
    return 2 * x.nbytes / gpu_ms(lambda: x.clone()) / 1e9


def layer_rows(shapes: str, heuristics: list[str]) -> list[dict]:
    from turbo_inductor.kernels.reference import fp8_quant as reference
    from turbo_inductor.kernels.triton import fp8_quant as triton_fp8

    backends = [("eager", reference.fp8_quantize, {}), ("inductor", torch.compile(reference.fp8_quantize), {})]
    backends += triton_variants(triton_fp8.fp8_quantize, HEURISTICS, heuristics) + native_quantize()
    rows = []
    for M, K in (map(int, shape.split("x")) for shape in shapes.split(",")):
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        copy_tbps = copy_rate(x)
        print(f"copy {M}x{K}: {copy_tbps:.2f} TB/s")
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
            call = lambda fn, blocks=blocks, transpose=transpose, both=both: fn(  # noqa: E731
                x, torch.float8_e4m3fn, *blocks, transpose, both_layouts=both
            )
            measure(rows, f"{M}x{K}", mode, triton_fp8, backends, call, (4 if both else 3) * x.numel(), copy_tbps)
    return rows


def moe_rows(configs: list[str], grouped_heuristics: list[str], heuristics: list[str]) -> list[dict]:
    """Per MoE config and projection, as the FP8 grouped GEMM quantizes in training: x [rows, K] and dy [rows, N]
    grouped and transposed per expert (the wgrad's operands), and instead their FP8 rowwise copies transposed into that
    layout (a byte read and one written per element); dy per row, times its expert's multiplier (the dgrad's,
    beside a plain rowwise quantization of it); W [E, K, N] once for both layouts, the forward's copy transposed for
    the dgrad, beside the two per-layout quantizations it replaces (the rowwise pass with column maxima; two calls)."""
    from turbo_inductor.kernels.reference.fp8_quant_grouped import padded_columns
    from turbo_inductor.kernels.triton import fp8_quant as triton_fp8
    from turbo_inductor.kernels.triton import fp8_quant_grouped as triton_grouped
    from turbo_inductor.kernels.triton import fp8_transpose as triton_transpose
    from turbo_inductor.ops.fp8_operands import weight_operands

    e4m3 = torch.float8_e4m3fn
    # No eager or Inductor rows: at these sizes the reference's compile and run cost more than every kernel measured.
    grouped = triton_variants(triton_grouped.fp8_quantize_grouped, GROUPED_HEURISTICS, grouped_heuristics)
    grouped_rows = triton_variants(triton_grouped.fp8_quantize_grouped_rows, {"default": {}}, ["default"])
    transposed = triton_variants(triton_transpose.fp8_transpose_grouped, {"default": {}}, ["default"])
    per_layout = triton_variants(triton_fp8.fp8_quantize, HEURISTICS, ["default", BY_TWO_CALLS])
    # No native row: its kernels cut x^T's columns whole, not per expert.
    row_heuristics = [h for h in heuristics if "COLUMN_MAXIMA_PROGRAMS" not in HEURISTICS[h]]
    once = triton_variants(
        triton_fp8.fp8_quantize, HEURISTICS, ["default"] + [h for h in row_heuristics if h != "default"]
    )
    rows = []
    for config in configs:
        experts, top_k, _, _ = CONFIGS[config]
        torch.manual_seed(0)
        offs = routing(TOKENS, experts, top_k)
        for projection, (k, n) in projections(config).items():
            for operand, cols in (("x", k), ("dy", n)):
                t = torch.randn(TOKENS * top_k, cols, device="cuda", dtype=torch.bfloat16)
                shape = f"{config} {projection} {operand} [{t.shape[0]}, {cols}]"
                call = lambda fn, t=t: fn(t, offs, e4m3)  # noqa: E731
                measure(rows, shape, "grouped transposed", triton_grouped, grouped, call, 3 * t.numel(), copy_rate(t))
                q = triton_fp8.fp8_quantize(t, e4m3, 1, cols, False)[0]  # the rowwise copy, quantized untimed
                call = lambda fn, q=q: fn(q, offs)  # noqa: E731
                moved = q.numel() + cols * padded_columns(q.shape[0], experts)
                measure(rows, shape, "grouped transpose", triton_transpose, transposed, call, moved, copy_rate(q))
                if operand == "dy":
                    m = torch.rand(experts, n, device="cuda").to(torch.bfloat16)
                    call = lambda fn, t=t, m=m: fn(t, offs, m, e4m3)  # noqa: E731
                    measure(
                        rows, shape, "rows by expert", triton_grouped, grouped_rows, call, 3 * t.numel(), copy_rate(t)
                    )
                    call = lambda fn, t=t: fn(t, e4m3, 1, n, False)  # noqa: E731
                    measure(rows, shape, "rowwise", triton_fp8, once[:1], call, 3 * t.numel(), copy_rate(t))
            # The parameter as transformers and bench_grouped_mm hold it, [E, N, K], read as W [E, K, N].
            weight = torch.randn(experts, n, k, device="cuda", dtype=torch.bfloat16).transpose(-2, -1)
            shape, rate = f"{config} {projection} W [{experts}, {k}, {n}]", copy_rate(weight)
            call = lambda fn, w=weight: weight_operands(w, "rowwise", fn, True, True, impl="triton")  # noqa: E731
            measure(rows, shape, "rowwise both layouts", triton_fp8, once, call, 4 * weight.numel(), rate)
            flat = weight.transpose(-2, -1).reshape(-1, k)  # W^T's rows, [E * N, K]
            call = lambda fn, f=flat: fn(f, e4m3, 1, k, False, both_layouts=True, block_cols_t=n)  # noqa: E731
            measure(
                rows, shape, "rowwise both layouts, per layout", triton_fp8, per_layout, call, 4 * flat.numel(), rate
            )
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("``")[0])
    parser.add_argument("--shapes", default=SHAPES, help="rows x columns, comma-separated (empty: none)")
    parser.add_argument(
        "--heuristics", default="default", help=f"comma-separated, of {sorted(HEURISTICS | GROUPED_HEURISTICS)}, or all"
    )
    parser.add_argument(
        "--moe", default="", help=f"MoE configs' expert operands, comma-separated, of {sorted(CONFIGS)}"
    )
    parser.add_argument("--out", default=None, help="folder for the JSON (default: $OUT, else benchmarks/out)")
    args = parser.parse_args(argv)
    every = HEURISTICS | GROUPED_HEURISTICS
    heuristics = list(every) if args.heuristics == "all" else [name for name in args.heuristics.split(",") if name]
    unknown = [name for name in heuristics if name not in every]
    configs = [config for config in args.moe.split(",") if config]
    if unknown or not set(configs) <= CONFIGS.keys():
        parser.error(f"unknown heuristics {unknown} or MoE configs {sorted(set(configs) - CONFIGS.keys())}")
    rows = layer_rows(args.shapes, [h for h in heuristics if h in HEURISTICS]) if args.shapes else []
    rows += moe_rows(
        configs, [h for h in heuristics if h in GROUPED_HEURISTICS], [h for h in heuristics if h in HEURISTICS]
    )
    print_table("fp8_quant", rows)
    record.write("fp8_quant", record.changed_options(parser, args, ignore={"out"}), vars(args), rows, args.out)


if __name__ == "__main__":
    main()
