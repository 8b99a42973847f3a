"""A step's GPU time by what its kernels do, from the per-kernel table a results row holds (``kernels_us``, written by
``run_model --kernels N`` and ``bench_grouped_mm``): the table a floor argument starts from.

    python -m benchmarks.kernel_table benchmarks/results/RUN.json [...] [--launches KIND]
"""

from __future__ import annotations

import argparse
import json
import re

# The first pattern a kernel's name matches names its kind. Inductor's names start with "triton_" and then name the
# ops they fused (index, gather, ...); attention before the GEMMs, for cuDNN's names carry GEMM words.
KINDS = (
    ("Inductor's kernels", r"^triton_"),
    ("attention", r"flash|fmha|sdpa|attention"),
    (
        "FP8 quantization",
        r"_fp8_tile_kernel|_fp8_scale_kernel|_grouped_transposed_kernel|_grouped_rows_kernel|_fp8_transpose_kernel"
        r"|_dispatch_fp8_kernel|::fp8_row_kernel|::fp8_cast_kernel|::amax_\w+_kernel|::scale_(one_)?kernel",
    ),
    ("GEMM", r"cutlass|gemm|nvjet|xmma|cublas|_grouped_wgrad_kernel"),
    ("MoE routing", r"_route_kernel|_dispatch_kernel|_gather_sum_kernel|sort|topk|histc|scatter|gather|index"),
    ("our row kernels", r"_rmsnorm|::rmsnorm|_dw_reduce|::dw_reduce|_glu_|_rotary|_cross_entropy|_embedding"),
    ("copies and fills", r"copy|fill|zero"),
)
OTHER = "other"


def kind_of(kernel: str) -> str:
    return next((kind for kind, pattern in KINDS if re.search(pattern, kernel, re.IGNORECASE)), OTHER)


def by_kind(kernels_us: dict[str, float]) -> dict[str, float]:
    """GPU time per step (us) of each kind of kernel, largest first."""
    totals: dict[str, float] = {}
    for kernel, us in kernels_us.items():
        kind = kind_of(kernel)
        totals[kind] = totals.get(kind, 0.0) + us
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def print_run(path: str, kind: str | None = None) -> None:
    """Each row's GPU time by kind; with ``kind``, that kind's launches (kernel and grid) too, slowest first."""
    result = json.loads(open(path).read())
    print(f"== {path} ({result['environment'].get('machine')}, torch {result['environment'].get('torch')})")
    for row in result["rows"]:
        if "kernels_us" not in row:
            continue
        total = sum(row["kernels_us"].values())
        name = " ".join(str(row[key]) for key in ("model", "shape", "mode", "column") if key in row)
        kinds = ", ".join(
            f"{kind} {us / 1e3:.2f} ms ({us / total:.0%})" for kind, us in by_kind(row["kernels_us"]).items()
        )
        print(f"{name}: {total / 1e3:.2f} ms = {kinds}")
        launches = [(launch, us) for launch, us in row.get("launches_us", {}).items() if kind_of(launch) == kind]
        for launch, us in sorted(launches, key=lambda item: -item[1]):
            print(f"    {us:9.1f} us  {launch[:140]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", help="results JSON files")
    parser.add_argument("--launches", metavar="KIND", help='that kind\'s launches by grid, e.g. "FP8 quantization"')
    args = parser.parse_args()
    for path in args.results:
        print_run(path, args.launches)


if __name__ == "__main__":
    main()
