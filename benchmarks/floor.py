"""How fast an MoE model's FP8 step could be, from its saved per-kernel table: the floor a target is held against.

    python -m benchmarks.floor RUN.json --quant FP8_QUANT_MOE.json [--column "primus_turbo fp8 rowwise"]

RUN is a ``run_model --hf ... --kernels N`` result (its rows' ``kernels_us``), FP8_QUANT_MOE the same GPU's
``bench_fp8_quant --moe`` result (the copy bandwidth it measured beside its kernels). The step is taken as measured,
then made faster twice, each time generously:

* its FP8 quantization, every kernel of it, replaced by the bytes the experts' quantization moves at least, at the
  copy's bandwidth (``quantization_bytes``; the dense linears' quantization taken as free);
* the experts' grouped GEMMs at the best published FP8 grouped-GEMM rates on Hopper (DeepGEMM: ``BEST_TFLOPS``),
  from the experts' FLOPs in the model's configuration.

A floor below the target says that the target needs more than kernels at those rates.
"""

from __future__ import annotations

import argparse
import json

from .goals import MOE
from .kernel_table import by_kind, kind_of

# DeepGEMM's FP8 grouped GEMM on an H800/H200, TFLOPS: forward (and dgrad, the same problem) and weight gradient.
BEST_TFLOPS = {"forward": 1346.0, "wgrad": 873.0}
# The expert GEMMs in a kernel table: torch's CUTLASS grouped kernels (their problem shape names the group) and ours.
GROUPED_GEMM = ("GroupProblemShape", "_grouped_gemm_kernel", "_grouped_wgrad_kernel")


def expert_tflop(model: dict, batch: int, seq: int) -> float:
    """TFLOP of one training step's expert GEMMs, per pass (forward, dgrad and wgrad each do this much)."""
    _, hidden, intermediate, _, rows = _sizes(model, batch, seq)
    # gate_up [hidden -> 2 x intermediate] and down [intermediate -> hidden], 2 FLOPs a multiply-add
    return 2 * rows * hidden * 3 * intermediate * model["layers"] / 1e12


def _sizes(model: dict, batch: int, seq: int) -> tuple[int, int, int, int, int]:
    """(experts, hidden, intermediate, tokens, routed rows) of an MoE model's configuration."""
    experts = model.get("num_local_experts", model.get("num_experts"))
    intermediate = model.get("moe_intermediate_size", model["intermediate_size"])
    tokens = batch * seq
    return experts, model["hidden_size"], intermediate, tokens, tokens * model["num_experts_per_tok"]


def quantization_bytes(model: dict, batch: int, seq: int) -> float:
    """GB the experts' FP8 quantization moves in a training step at least: every operand read once and written once
    in FP8 per layout it is used in. Each expert weight W: the forward's copy and the dgrad's, 4 bytes an element (the
    rowwise recipe's dgrad copy, with a scale per column, reads W twice; with the forward's row scales folded into
    dy's quantization instead, the two copies share scales and one read writes both). Each activation (gate_up's x,
    quantized before the permute, and dy; down's x and dy): 3 bytes an element."""
    experts, hidden, intermediate, tokens, rows = _sizes(model, batch, seq)
    weights = experts * hidden * 3 * intermediate
    activations = tokens * hidden + rows * (2 * intermediate + intermediate + hidden)
    return model["layers"] * (4 * weights + 3 * activations) / 1e9


def copy_tbps(quant: dict) -> float:
    """The fastest copy the quantization bench measured, TB/s (each row's rate over its fraction of a copy's)."""
    return max(100 * row["rate"] / row["copy_pct"] for row in quant["rows"])


def floor(run: dict, quant: dict, model: str, column: str) -> dict:
    """The step of ``column`` for ``model`` as measured, with quantization at copy bandwidth, and also with the
    experts' GEMMs at ``BEST_TFLOPS``; ms, and as ratios to Inductor in the same run."""
    rows = {row["column"]: row for row in run["rows"] if row["model"] == model}
    inductor, fp8 = rows["inductor"]["step_ms"], rows[column]
    kernels = fp8["kernels_us"]
    quant_us = sum(us for kernel, us in kernels.items() if kind_of(kernel) == "FP8 quantization")
    grouped_us = sum(us for kernel, us in kernels.items() if any(name in kernel for name in GROUPED_GEMM))
    configuration = run["configuration"]
    sizes = (configuration["models"][model], configuration["batch"], configuration["seq"])
    gigabytes, bandwidth, tflop = quantization_bytes(*sizes), copy_tbps(quant), expert_tflop(*sizes)
    quant_floor_us = 1e3 * gigabytes / bandwidth
    best_grouped_us = 1e6 * tflop * (2 / BEST_TFLOPS["forward"] + 1 / BEST_TFLOPS["wgrad"])
    at_bandwidth = fp8["step_ms"] - (quant_us - quant_floor_us) / 1e3
    at_best = at_bandwidth - max(grouped_us - best_grouped_us, 0.0) / 1e3
    target = next(goal for recipe, goal in MOE[model].fp8.items() if recipe in column)
    return {
        "model": model,
        "column": column,
        "inductor_ms": inductor,
        "bf16_ms": rows["primus_turbo"]["step_ms"],
        "measured_ms": fp8["step_ms"],
        "kinds_ms": {kind: us / 1e3 for kind, us in by_kind(kernels).items()},
        "quantization_ms": quant_us / 1e3,
        "quantization_gb": gigabytes,
        "copy_tbps": bandwidth,
        "quantization_at_copy_ms": quant_floor_us / 1e3,
        "expert_gemms_ms": grouped_us / 1e3,
        "expert_gemms_at_best_ms": best_grouped_us / 1e3,
        "expert_tflop_per_pass": tflop,
        "measured": inductor / fp8["step_ms"],
        "quantization_at_copy": inductor / at_bandwidth,
        "and_gemms_at_best": inductor / at_best,
        "target": target,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="run_model --hf results JSON with kernel tables (--kernels)")
    parser.add_argument("--quant", required=True, help="bench_fp8_quant --moe results JSON of the same GPU")
    parser.add_argument(
        "--column", default="primus_turbo fp8 rowwise experts", help="an FP8 column with FP8 experts (%(default)s)"
    )
    parser.add_argument("--out", help="write the floors here as JSON")
    args = parser.parse_args()
    run, quant = (json.loads(open(path).read()) for path in (args.run, args.quant))
    models = [model for model in run["configuration"]["models"] if model in MOE]
    floors = [floor(run, quant, model, args.column) for model in models]
    for f in floors:
        print(
            f"{f['model']} {f['column']}: measured {f['measured']:.3f}x ({f['measured_ms']:.2f} ms, Inductor "
            f"{f['inductor_ms']:.2f}); quantization {f['quantization_ms']:.2f} ms -> {f['quantization_gb']:.1f} GB at "
            f"{f['copy_tbps']:.2f} TB/s, {f['quantization_at_copy_ms']:.2f} ms: {f['quantization_at_copy']:.3f}x; "
            f"expert GEMMs {f['expert_gemms_ms']:.2f} ms -> "
            f"{f['expert_gemms_at_best_ms']:.2f} at {BEST_TFLOPS}: {f['and_gemms_at_best']:.3f}x; target "
            f"{f['target']:.2f}x"
        )
    if args.out:
        environment = {"run": run["environment"], "quant": quant["environment"]}
        payload = {"benchmark": "floor", "sources": [args.run, args.quant], "rows": floors, "environment": environment}
        with open(args.out, "w") as handle:
            json.dump(payload, handle, indent=1)


if __name__ == "__main__":
    main()
