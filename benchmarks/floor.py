"""How fast an FP8 MoE step could be, from a saved per-kernel table: the floor a target is held against.

    python -m benchmarks.floor RUN.json --quant FP8_QUANT_MOE.json [--column COLUMN] [--out FLOOR.json]

RUN is a ``run_model --hf ... --kernels N`` result (each model's step against its target), or a
``bench_grouped_mm --modes fwd+bwd --kernels`` result (each expert GEMM's fwd+bwd against ``goals.GROUPED_FP8``);
FP8_QUANT_MOE is the same GPU's ``bench_fp8_quant --moe`` result (the copy bandwidth it measured beside its kernels).
The time is taken as measured, then made faster twice, each time generously:

* its FP8 quantization, every kernel of it, replaced by the bytes the experts' quantization moves at least, at the
  copy's bandwidth (``quantization_bytes``; in a model, the dense linears' quantization taken as free);
* the experts' grouped GEMMs at the best published FP8 grouped-GEMM rates on Hopper (DeepGEMM: ``BEST_TFLOPS``),
  from their FLOPs.

A floor below the target says that the target needs more than kernels at those rates.
"""

from __future__ import annotations

import argparse
import json

from .bench_grouped_mm import BASELINE, SHAPE
from .goals import GROUPED_FP8, MOE
from .kernel_table import by_kind

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
    """GB the experts' FP8 quantization moves in a training step at least: every operand read once and written in FP8
    once per layout, in two layouts, 4 bytes an element. Each expert weight W: the forward's copy and the dgrad's, which
    share scales (the forward's row scales fold into dy's quantization), so one read could write both; the op reads W
    once and transposes the forward's copy, 5 bytes. Each activation (gate_up's x, quantized before the permute, and
    dy; down's x and dy): rowwise and per group transposed for the wgrad."""
    experts, hidden, intermediate, tokens, rows = _sizes(model, batch, seq)
    weights = experts * hidden * 3 * intermediate
    activations = tokens * hidden + rows * (2 * intermediate + intermediate + hidden)
    return model["layers"] * 4 * (weights + activations) / 1e9


def copy_tbps(quant: dict) -> float:
    """The fastest copy the quantization bench measured, TB/s (each row's rate over its fraction of a copy's)."""
    return max(100 * row["rate"] / row["copy_pct"] for row in quant["rows"])


def _floor(measured_ms: float, kernels_us: dict, gigabytes: float, tflop: float, bandwidth: float) -> dict:
    """A step of ``measured_ms`` whose kernels took ``kernels_us``, its quantization replaced by ``gigabytes`` at
    ``bandwidth`` TB/s, then its grouped GEMMs (``tflop`` per pass) by ``BEST_TFLOPS``'s times; ms."""
    kinds = by_kind(kernels_us)
    quant_us = kinds.get("FP8 quantization", 0.0)
    grouped_us = sum(us for kernel, us in kernels_us.items() if any(name in kernel for name in GROUPED_GEMM))
    quant_floor_us = 1e3 * gigabytes / bandwidth
    best_grouped_us = 1e6 * tflop * (2 / BEST_TFLOPS["forward"] + 1 / BEST_TFLOPS["wgrad"])
    at_copy_ms = measured_ms - (quant_us - quant_floor_us) / 1e3
    return {
        "measured_ms": measured_ms,
        "kinds_ms": {kind: us / 1e3 for kind, us in kinds.items()},
        "quantization_ms": quant_us / 1e3,
        "quantization_gb": gigabytes,
        "copy_tbps": bandwidth,
        "quantization_at_copy_ms": quant_floor_us / 1e3,
        "expert_gemms_ms": grouped_us / 1e3,
        "expert_gemms_at_best_ms": best_grouped_us / 1e3,
        "expert_tflop_per_pass": tflop,
        "at_copy_ms": at_copy_ms,
        "and_gemms_at_best_ms": at_copy_ms - max(grouped_us - best_grouped_us, 0.0) / 1e3,
    }


def _ratios(floor: dict, baseline_ms: float) -> dict:
    """The floor's three times as ratios of ``baseline_ms`` to them."""
    times = {
        "measured": "measured_ms",
        "quantization_at_copy": "at_copy_ms",
        "and_gemms_at_best": "and_gemms_at_best_ms",
    }
    return {name: baseline_ms / floor[key] for name, key in times.items()}


def model_floor(run: dict, quant: dict, model: str, column: str) -> dict:
    """``column``'s training step of ``model`` in a run_model run, against Inductor bf16 in the same run."""
    rows = {row["column"]: row for row in run["rows"] if row["model"] == model}
    configuration = run["configuration"]
    sizes = (configuration["models"][model], configuration["batch"], configuration["seq"])
    fp8 = rows[column]
    floor = _floor(
        fp8["step_ms"], fp8["kernels_us"], quantization_bytes(*sizes), expert_tflop(*sizes), copy_tbps(quant)
    )
    inductor = rows["inductor"]["step_ms"]
    target = next(goal for recipe, goal in MOE[model].fp8.items() if recipe in column)
    return {"model": model, "column": column, "baseline": "inductor", "baseline_ms": inductor, **floor,
            **_ratios(floor, inductor), "target": target}  # fmt: skip


def grouped_floor(result: dict, quant: dict, shape: str, column: str) -> dict:
    """``column``'s fwd+bwd of one expert GEMM in a bench_grouped_mm run, against bf16 torch._grouped_mm."""
    rows = {row["column"]: row for row in result["rows"] if row["shape"] == shape and row["mode"] == "fwd+bwd"}
    s, k, experts, _, n = map(int, SHAPE.search(shape).groups())
    # W read once and written in two layouts; x and dy each read once and written rowwise and per group transposed
    gigabytes = 4 * (experts * k * n + s * k + s * n) / 1e9
    fp8 = rows[column]
    floor = _floor(fp8["ms"], fp8["kernels_us"], gigabytes, 2 * s * k * n / 1e12, copy_tbps(quant))
    baseline = rows[BASELINE]["ms"]
    return {"shape": shape, "column": column, "baseline": BASELINE, "baseline_ms": baseline, **floor,
            **_ratios(floor, baseline), "target": GROUPED_FP8}  # fmt: skip


def floors(result: dict, quant: dict, column: str) -> list[dict]:
    """Every MoE model's (run_model) or expert GEMM's (bench_grouped_mm) floor in a results file."""
    if result["benchmark"] == "grouped_mm":
        shapes = dict.fromkeys(
            row["shape"] for row in result["rows"] if row["column"] == column and "kernels_us" in row
        )
        return [grouped_floor(result, quant, shape, column) for shape in shapes]
    models = [model for model in result["configuration"]["models"] if model in MOE]
    return [model_floor(result, quant, model, column) for model in models]


# The FP8 column of each kind of run, FP8 experts in the rowwise recipe.
COLUMNS = {"model": "primus_turbo fp8 rowwise experts", "grouped_mm": "fp8 rowwise auto"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="run_model --hf or bench_grouped_mm results JSON with kernel tables (--kernels)")
    parser.add_argument("--quant", required=True, help="bench_fp8_quant --moe results JSON of the same GPU")
    parser.add_argument("--column", help=f"an FP8 column with FP8 experts (default: {COLUMNS})")
    parser.add_argument("--out", help="write the floors here as JSON")
    args = parser.parse_args()
    run, quant = (json.loads(open(path).read()) for path in (args.run, args.quant))
    found = floors(run, quant, args.column or COLUMNS[run["benchmark"]])
    for f in found:
        print(
            f"{f.get('model', f.get('shape'))} {f['column']}: measured {f['measured']:.3f}x "
            f"({f['measured_ms']:.2f} ms, {f['baseline']} {f['baseline_ms']:.2f}); "
            f"quantization {f['quantization_ms']:.2f} ms -> "
            f"{f['quantization_gb']:.1f} GB at {f['copy_tbps']:.2f} TB/s, {f['quantization_at_copy_ms']:.2f} ms: "
            f"{f['quantization_at_copy']:.3f}x; expert GEMMs {f['expert_gemms_ms']:.2f} ms -> "
            f"{f['expert_gemms_at_best_ms']:.2f} at {BEST_TFLOPS}: {f['and_gemms_at_best']:.3f}x; target "
            f"{f['target']:.2f}x"
        )
    if args.out:
        # The GPU's numbers, so the run's environment; kept beside the runs, out of the README's report.
        configuration = {"sources": [args.run, args.quant], "quant_environment": quant["environment"]}
        payload = {
            "benchmark": "floor",
            "configuration": configuration,
            "rows": found,
            "environment": run["environment"],
        }
        with open(args.out, "w") as handle:
            json.dump(payload, handle, indent=1)


if __name__ == "__main__":
    main()
