"""Grouped GEMMs of MoE experts on the GPU, in one run: bf16 ``torch._grouped_mm`` (the baseline of every ratio),
our ``grouped_mm`` per implementation, ``fp8_grouped_mm`` rowwise and blockwise per implementation (quantization
included), and the FP8 grouped GEMM alone on operands already quantized. Forward and forward + backward, at the
expert shapes of Mixtral-8x7B (E 8, top 2) and Qwen3-30B-A3B (E 128, top 8), tokens 2 x 4096 (--tokens), each projection
(gate_up [E, 2I, H] and down [E, H, I] parameters, passed transposed as transformers 5 does). Routing: each token's
top-k of uniform random router scores (balanced on average, uneven per expert).
python -m benchmarks.bench_grouped_mm [--configs mixtral-8x7b,qwen3-30b-a3b] [--modes fwd,fwd+bwd] [--kernels]
    [--tokens N] [--heuristics NAME,...|all] [--columns PREFIX,...]
Prints a table (median ms by triton's do_bench, TFLOP/s, ratio to bf16 torch._grouped_mm) and writes
grouped_mm.json (benchmarks/record.py). With ``--kernels``, the GPU time of each kernel per step of the FP8 fwd+bwd
columns and of the baseline (``kernels_us`` in their rows), to show where the time goes."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import re
from collections.abc import Callable

import torch

import turbo_inductor
from benchmarks import record
from benchmarks.common import bench_ms, fwd_bwd_step, kernel_us, module_constants
from turbo_inductor.kernels import registry
from turbo_inductor.kernels.triton import grouped_mm as triton_grouped_mm
from turbo_inductor.ops.fp8_operands import kernel_block, weight_operands
from turbo_inductor.recipes import RECIPES

# name: (experts, top k, hidden, expert intermediate)
CONFIGS = {"mixtral-8x7b": (8, 2, 4096, 14336), "qwen3-30b-a3b": (128, 8, 2048, 768)}
TOKENS = 2 * 4096
BASELINE = "bf16 torch._grouped_mm"
# A row's shape, "<config> <projection> [S, K] x [E, K, N]": the groups capture S, K, E, K, N.
SHAPE = re.compile(r"\[(\d+), (\d+)\] x \[(\d+), (\d+), (\d+)\]")
DEVICE = "cuda"
# Characters of a kernel's name printed by --kernels (CUTLASS's template names run to thousands).
KERNEL_NAME_CHARS = 110
# Launch-heuristic variants of the FP8 GEMMs, each a column "fp8 rowwise: NAME" with --heuristics: the
# implementations it runs and the module constants it runs under (no comma in a name: --heuristics and --columns
# split on commas). Tiles are (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages). The promoted tiles (PROMOTED_CONFIG) run the
# Triton dgrad without FAST_ACCUM_DGRAD and its wgrad without FAST_ACCUM_WGRAD; the fast-accumulation ones
# (GPU_CONFIGS[1]) the forward, the fast dgrad and the fast wgrad. 3 stages of 128 x 128 x 128 FP8 tiles take 96 KB
# of shared memory: two programs an SM. 256-deep promoted chunks wait on the MMA half as often.
_TRITON = "fp8_grouped_gemm=triton,fp8_grouped_gemm_wgrad=triton"
_TORCH_WGRAD = "fp8_grouped_gemm=triton,fp8_grouped_gemm_wgrad=vendor"
_FAST = triton_grouped_mm.GPU_CONFIGS
# The op's module (the package's ops attribute of that name is the op).
_OP_MODULE = importlib.import_module("turbo_inductor.ops.fp8_grouped_mm")
_PROMOTED_DGRAD = {_OP_MODULE: {"FAST_ACCUM_DGRAD": False}}
_PROMOTED_WGRAD = {_OP_MODULE: {"FAST_ACCUM_WGRAD": False}}


def _tiles(**constants) -> dict:
    return {triton_grouped_mm: constants}


HEURISTICS = {
    "triton GEMMs promoted in 3 stages": (_TRITON, _tiles(PROMOTED_CONFIG=(128, 128, 128, 8, 3))),
    "triton GEMMs promoted 256-deep chunks": (_TRITON, _tiles(PROMOTED_CONFIG=(128, 128, 256, 8, 3))),
    "triton GEMMs fast accumulation in 4 stages": (_TRITON, _tiles(GPU_CONFIGS=_FAST | {1: (128, 256, 128, 8, 4)})),
    "triton GEMMs fast accumulation in 128 x 128 tiles": (
        _TRITON,
        _tiles(GPU_CONFIGS=_FAST | {1: (128, 128, 128, 8, 3)}),
    ),
    "triton GEMMs dgrad promoted": (_TRITON, _PROMOTED_DGRAD),
    "triton GEMMs wgrad promoted": (_TRITON, _PROMOTED_WGRAD),
    "torch's wgrad promoted": (_TORCH_WGRAD, _PROMOTED_WGRAD),
}


def routing(tokens: int, experts: int, top_k: int) -> torch.Tensor:
    """offs [E] int32 of a routing of ``tokens`` to their top-k experts by uniform random scores."""
    chosen = torch.rand(tokens, experts, device=DEVICE).topk(top_k, dim=1).indices
    return torch.bincount(chosen.flatten(), minlength=experts).cumsum(0).to(torch.int32)


def projections(config: str) -> dict[str, tuple[int, int]]:
    """Projection -> (K, N) of its grouped GEMM y = x W, W [E, K, N]."""
    _, _, hidden, intermediate = CONFIGS[config]
    return {"gate_up": (hidden, 2 * intermediate), "down": (intermediate, hidden)}


def heuristic_variants(names: list[str]) -> dict[str, tuple[Callable, dict]]:
    """Column -> (fn(x, parameter, offs), {module: constants} its forward and backward run under): FP8 rowwise under
    each named variant of HEURISTICS."""
    columns = {}
    for name in names:
        impl, constants = HEURISTICS[name]

        def fn(x, parameter, offs, impl=impl):
            return turbo_inductor.ops.fp8_grouped_mm(x, parameter.transpose(-2, -1), offs, "rowwise", impl=impl)

        columns[f"fp8 rowwise: {name}"] = (fn, constants)
    return columns


def variants() -> dict[str, Callable]:
    """Column -> fn(x, parameter, offs): the grouped GEMM of x by the parameter [E, N, K] passed transposed."""
    ops = turbo_inductor.ops
    columns = {BASELINE: lambda x, p, offs: torch._grouped_mm(x, p.transpose(-2, -1), offs=offs)}
    on_gpu = ["auto"] + [
        name
        for name, impl in registry.implementations("grouped_gemm").items()
        if name != "reference" and impl.unavailable_reason(torch.device(DEVICE)) is None
    ]
    for impl in on_gpu:
        columns[f"grouped_mm impl={impl}"] = lambda x, p, offs, impl=impl: ops.grouped_mm(
            x, p.transpose(-2, -1), offs, impl=impl
        )
    fp8_impls = {
        "auto": "auto",
        "triton GEMMs": "fp8_grouped_gemm=triton,fp8_grouped_gemm_wgrad=triton",
        "triton TMA GEMMs": "fp8_grouped_gemm=triton_tma,fp8_grouped_gemm_wgrad=triton_tma",
    }
    # Every recipe the cost table may choose for experts (benchmarks/cost_table.py reads the "auto" columns).
    for recipe in ("tensorwise", "rowwise", "rowwise_with_gw_hp", "blockwise"):
        for label, impl in fp8_impls.items():
            if label != "auto" and recipe not in ("rowwise", "blockwise"):
                continue
            columns[f"fp8 {recipe} {label}"] = lambda x, p, offs, recipe=recipe, impl=impl: ops.fp8_grouped_mm(
                x, p.transpose(-2, -1), offs, recipe, impl=impl
            )
    return columns


def bare_fp8_gemms(x: torch.Tensor, parameter: torch.Tensor, offs: torch.Tensor) -> dict[str, Callable]:
    """Column -> fn(x, parameter, offs) running the forward FP8 grouped GEMM alone on rowwise operands quantized
    beforehand (the arguments unread), per implementation that takes them."""
    quantize = registry.select("fp8_quantize", x.device)
    r = RECIPES["rowwise"]
    x_q = quantize(x, torch.float8_e4m3fn, *kernel_block(r.activation_block, *x.shape), False)
    w_q = weight_operands(parameter.transpose(-2, -1), "rowwise", quantize, True, False)[0]
    columns = {}
    for name, impl in registry.implementations("fp8_grouped_gemm").items():
        if name == "reference" or impl.unavailable_reason(x.device) is not None:
            continue
        reason = impl.declines(*x_q, *w_q, offs, torch.bfloat16)
        if reason is None:
            columns[f"fp8 rowwise GEMM alone ({name})"] = lambda *_, fn=impl.fn: fn(
                *x_q, *w_q, offs, torch.bfloat16, fast_accum=True
            )
        else:
            print(f"fp8 rowwise GEMM alone ({name}): declined: {reason}")
    return columns


def print_kernels(label: str, times_us: dict[str, float]) -> None:
    """Each kernel's GPU time per step, longest first, and their sum."""
    print(f"{label}: {sum(times_us.values()):.0f} us of GPU time per step")
    for name, us in sorted(times_us.items(), key=lambda item: -item[1]):
        print(f"  {us:10.1f} us  {name[:KERNEL_NAME_CHARS]}")


def run(
    configs: list[str],
    modes: list[str],
    kernels: bool = False,
    tokens: int = TOKENS,
    heuristics: list[str] = (),
    columns_from: tuple[str, ...] = ("",),
) -> list[dict]:
    """The rows of each config's projections, mode and column (those whose name starts with one of
    ``columns_from``)."""
    rows = []
    for config in configs:
        experts, top_k, _, _ = CONFIGS[config]
        torch.manual_seed(0)
        offs = routing(tokens, experts, top_k)
        sizes = torch.diff(offs, prepend=offs.new_zeros(1))
        print(f"\n{config}: {tokens * top_k} routed rows, rows per expert {sizes.min().item()}..{sizes.max().item()}")
        for projection, (k, n) in projections(config).items():
            shape = f"{config} {projection} [{tokens * top_k}, {k}] x [{experts}, {k}, {n}]"
            x = torch.randn(tokens * top_k, k, device=DEVICE, dtype=torch.bfloat16)
            parameter = torch.randn(experts, n, k, device=DEVICE, dtype=torch.bfloat16) / k**0.5
            flops = 2 * x.shape[0] * k * n
            for mode in modes:
                columns = variants() | (bare_fp8_gemms(x, parameter, offs) if mode == "fwd" else {})
                columns = {column: (fn, {}) for column, fn in columns.items()} | heuristic_variants(heuristics)
                for column, (fn, constants) in columns.items():
                    if not column.startswith(columns_from):
                        continue
                    row = {"shape": shape, "mode": mode, "column": column}
                    try:
                        with contextlib.ExitStack() as stack:
                            for module, values in constants.items():
                                stack.enter_context(module_constants(module, values))
                            row["ms"], times_us = _measure(fn, x, parameter, offs, mode)
                    except Exception as error:  # one column failing leaves the others measured
                        print(f"{shape} {mode} {column}: failed: {type(error).__name__}: {error}")
                        continue
                    if times_us is not None:
                        row["gpu_ms"] = sum(times_us.values()) / 1e3
                        if kernels and (column == BASELINE or column.startswith("fp8")):
                            row["kernels_us"] = times_us
                            print_kernels(f"{shape} {mode} {column}", times_us)
                    row["tflops"] = flops * (1 if mode == "fwd" else 3) / row["ms"] / 1e9
                    rows.append(row)
                    torch.cuda.empty_cache()
    return rows


def _measure(fn, x, parameter, offs, mode: str) -> tuple[float, dict | None]:
    """(ms, None) of fn's forward, or (ms, each kernel's GPU time per step) of its forward + backward."""
    if mode == "fwd":
        with torch.no_grad():
            return bench_ms(lambda: fn(x, parameter, offs)), None
    inputs = (x.clone().requires_grad_(), parameter.clone().requires_grad_())
    step = fwd_bwd_step(lambda a, p: fn(a, p, offs), *inputs)
    return bench_ms(step), kernel_us(step)


def print_table(rows: list[dict]) -> None:
    """Each row's ratio to bf16 ``torch._grouped_mm`` of the same shape and mode, as a Markdown table."""
    print("| shape | mode | column | ms | TFLOP/s | vs bf16 torch._grouped_mm |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        base = next(
            (r for r in rows if r["shape"] == row["shape"] and r["mode"] == row["mode"] and r["column"] == BASELINE),
            None,
        )
        row["speedup_vs_torch_grouped_mm"] = base["ms"] / row["ms"] if base else None
        ratio = f"{row['speedup_vs_torch_grouped_mm']:.2f}x" if base else "-"
        print(f"| {row['shape']} | {row['mode']} | {row['column']} | {row['ms']:.3f} | {row['tflops']:.0f} | {ratio} |")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--modes", default="fwd,fwd+bwd")
    parser.add_argument(
        "--kernels", action="store_true", help="print each kernel's GPU time per fwd+bwd step (FP8 and baseline)"
    )
    parser.add_argument(
        "--tokens", type=int, default=TOKENS, help="tokens routed (run_model's MoE step: 2 x 2048 = 4096)"
    )
    parser.add_argument("--out", default=None, help="folder for the JSON (default: $OUT, else benchmarks/out)")
    parser.add_argument(
        "--heuristics",
        default="",
        help=f"comma-separated, of {sorted(HEURISTICS)}, or all: FP8 rowwise columns under each",
    )
    parser.add_argument(
        "--columns", default="", help="comma-separated beginnings of the column names to run (default: every column)"
    )
    args = parser.parse_args()
    heuristics = list(HEURISTICS) if args.heuristics == "all" else [h for h in args.heuristics.split(",") if h]
    if unknown := sorted(set(heuristics) - HEURISTICS.keys()):
        parser.error(f"unknown heuristics {unknown}; choose from {sorted(HEURISTICS)} or all")
    columns_from = tuple(args.columns.split(",")) if args.columns else ("",)
    rows = run(args.configs.split(","), args.modes.split(","), args.kernels, args.tokens, heuristics, columns_from)
    print_table(rows)
    record.write("grouped_mm", record.changed_options(parser, args, ignore={"out"}), vars(args), rows, args.out)


if __name__ == "__main__":
    main()
