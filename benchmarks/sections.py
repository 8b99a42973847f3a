"""The sections of ``benchmarks/README.md``, one per benchmark: its title, script, ``run_gpu.sh`` step, table and
notes; the main job's also the goals each model's newest run meets or misses as they stand now."""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Callable

from benchmarks import goals
from benchmarks.runs import MAX_WIDTH
from benchmarks.tables import Field, pivot, rows_table


def _runs_by_default(row: dict) -> bool:
    """A grouped GEMM column that a user's default gets, bf16 or the FP8 recipes ``auto`` chooses among for experts:
    forced Triton or vendor kernels, tensorwise and blockwise are in the JSON alone."""
    return not any(name in row["column"] for name in ("triton", "vendor", "tensorwise", "blockwise"))


def _in_readme(column: str) -> bool:
    """Eager's row, and torchao's model compiled by primus_turbo, are in the JSON alone."""
    return column != "eager" and not column.endswith(" on primus_turbo")


def goals_lines(result: dict) -> list[str]:
    """The model benchmark's goals (a GPU run's only): per model, how many were met, each missed one with what was
    measured, where a peer peaked below us, and where a peer's loss is off Inductor's."""
    by_model: dict[str, list[dict]] = {}
    for goal in result.get("goals", []):
        by_model.setdefault(goal["model"], []).append(goal)
    lines = []
    for model, held in by_model.items():
        missed = [f"{g['goal'].removeprefix('primus_turbo ')}: {g['measured']}" for g in held if not g["met"]]
        text = f"- {model}: {len(held) - len(missed)} of {len(held)} goals met"
        text += f"; MISSED: {'; '.join(missed)}" if missed else ""
        lighter = goals.lighter_peers([row for row in result["rows"] if row.get("model") == model])
        text += f". Less memory than ours: {'; '.join(lighter)}" if lighter else ""
        wrong = goals.peers_off_inductor([row for row in result["rows"] if row.get("model") == model])
        text += f". A peer's loss off Inductor's, relative: {'; '.join(wrong)}" if wrong else ""
        lines += textwrap.wrap(text, MAX_WIDTH, subsequent_indent="  ", break_on_hyphens=False)
    return lines


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """A section of the README: the benchmark's name in its JSON, title, script, run_gpu.sh step, table and a note
    on what its numbers are."""

    name: str
    title: str
    script: str
    step: str
    render: Callable[[dict], list[str]]
    note: str = ""
    extra: Callable[[dict], list[str]] = lambda result: []
    about: Callable[[dict], str] = lambda result: ""  # what this run measured, after its machine


def _backend_in(*names: str) -> Callable[[dict], bool]:
    return lambda row: row["backend"] in names


def _compiled(row: dict) -> bool:
    return row["backend"] == "inductor" or row["backend"].startswith("primus_turbo")


def _moe_quant_row(row: dict) -> bool:
    return row["backend"] == "triton" and not row["mode"].endswith("per layout")


def _fp8_quant_table(result: dict) -> list[str]:
    """The standard shapes across (few, short); an MoE model's operands down the side (many, long), without the
    both-layouts kernel's comparison against one pass per layout (in the JSON)."""
    if result["configuration"].get("moe"):
        return pivot(("shape",), "mode", _moe_quant_row, True, ratio_key="copy_pct", ratio_format=(".0f", "%"))(result)
    return pivot(("mode",), "shape", _backend_in("triton"), False)(result)


def layer_count(*counts: int) -> str:
    return f"{'/'.join(map(str, counts))} layer{'s' * (counts != (1,))}"


def model_table(result: dict) -> list[str]:
    """The main job's rows."""
    return rows_table(
        (
            Field("step ms", "step_ms"),
            Field("vs Inductor", "speedup_vs_inductor", ".2f", "x"),
            Field("GPU ms", "gpu_ms"),
            Field("peak GiB", "peak_gib", ".2f"),
            Field("saved GiB", "saved_gib", ".2f"),
            Field("compile s", "compile_s", ".1f"),
            Field("out SNR dB", "out_snr_db", ".1f", none="exact"),
            Field("dx SNR dB", "dx_snr_db", ".1f", none="exact"),
            Field("loss SNR dB", "loss_snr_db", ".1f", none="exact"),
            Field("logits SNR dB", "logits_snr_db", ".1f", none="exact"),
            Field("worst grad SNR dB", "worst_grad_snr_db", ".1f", none="exact"),
        )
    )({**result, "rows": [row for row in result["rows"] if _in_readme(row["column"])]})


def model_about(result: dict) -> str:
    """What a run of transformers' models measured ('' for the hand-written decoder)."""
    configuration = result["configuration"]
    if not configuration.get("hf"):
        return ""
    models = configuration["models"].values()
    layers = sorted({model["layers"] for model in models})
    train = configuration["mode"] == "train"
    classes = ", ".join(model["class"] for model in models)
    return (
        f"{classes}, {layer_count(*layers)}, {'training' if train else 'prefill'}"
        f"{' under bf16 autocast, fp32 parameters' * bool(configuration.get('autocast'))}, "
        f"{configuration['batch']} x {configuration['seq']}{_over_inputs(configuration.get('snr_inputs', 1))}."
    )


def _over_inputs(inputs: int) -> str:
    return f", SNR over {inputs} inputs" if inputs > 1 else ""


BENCHMARKS = (
    Benchmark(
        "model",
        "Main job, a Llama-style decoder",
        "run_model.py",
        "model",
        model_table,
        "GPU ms: kernels only; compile: cold; SNR against Inductor; peak GiB: a step's; saved GiB: what its forward "
        "keeps for the backward beyond the parameters. transformers' models run with "
        "their LM head, and in training their loss; each row is against the Inductor of its own run. A peer's memory "
        "is against ours of its precision (torchao's recipe; bf16 for Liger).",
        goals_lines,
        model_about,
    ),
    Benchmark(
        "rmsnorm", "RMSNorm", "bench_rmsnorm.py", "rmsnorm", pivot(("shape", "mode"), "backend", _compiled, True)
    ),
    Benchmark("glu", "SwiGLU", "bench_glu.py", "glu", pivot(("shape", "mode"), "backend", _compiled, True)),
    Benchmark(
        "fp8",
        "FP8 linear",
        "bench_fp8.py",
        "fp8",
        pivot(
            ("shape",),
            "backend",
            _backend_in("inductor", "primus_turbo fp8 tensorwise", "primus_turbo fp8 rowwise"),
            False,
        ),
    ),
    Benchmark(
        "fp8_quant",
        "FP8 quantization",
        "bench_fp8_quant.py",
        "fp8_quant",
        _fp8_quant_table,
        "The Triton kernels against the reference quantization compiled by Inductor; an MoE model's operands (`--moe`)"
        " by shape, each kernel's GPU time and its bandwidth as a percentage of a copy's.",
    ),
    Benchmark(
        "grouped_mm",
        "MoE expert GEMMs",
        "bench_grouped_mm.py",
        "grouped_mm",
        pivot(
            ("shape", "column"),
            "mode",
            _runs_by_default,
            False,
            baseline="",
            ratio_key="speedup_vs_torch_grouped_mm",
        ),
        "Ratios to bf16 `torch._grouped_mm` of the same shape and mode; what `auto` runs, in bf16 and the FP8 recipes "
        "it picks from for experts (the rest: the JSON).",
    ),
    Benchmark(
        "floor",
        "The floor of the FP8 MoE step",
        "floor.py",
        "moe",
        rows_table(
            (
                Field("vs Inductor", "measured", ".3f", "x"),
                Field("quant ms", "quantization_ms", ".2f"),
                Field("at copy", "quantization_at_copy_ms", ".2f"),
                Field("GEMMs ms", "expert_gemms_ms", ".2f"),
                Field("at best", "expert_gemms_at_best_ms", ".2f"),
                Field("quant at copy", "quantization_at_copy", ".3f", "x"),
                Field("+ GEMMs at best", "and_gemms_at_best", ".3f", "x"),
                Field("target", "target", ".2f", "x"),
            )
        ),
        "The step's kernels by kind, from the model run's kernel table: the FP8 quantization's time and at a copy's "
        "bandwidth, the expert GEMMs' and at the grouped benchmark's best; the ratio the step would reach with the "
        "quantization at copy speed, then with the GEMMs at their best too.",
    ),
    Benchmark(
        "convergence",
        "Training convergence",
        "convergence.py",
        "convergence",
        rows_table(
            (
                Field("first loss", "first_loss", ".4f"),
                Field("last loss", "last_loss", ".4f"),
                Field("max deviation from Inductor", "max_deviation_vs_inductor", ".2%"),
            )
        ),
        "A tiny decoder trained with AdamW on a fixed regression task; the largest relative deviation over all steps.",
    ),
    Benchmark(
        "gemm_allreduce",
        "GEMM + all-reduce",
        "bench_gemm_allreduce.py",
        "gemm_ar",
        pivot(
            ("shape", "mode"),
            "backend",
            _backend_in("mm then all-reduce", "inductor", "primus_turbo", "primus_turbo impl=push"),
            False,
        ),
        "M x N x K per rank. fwd: one call after a barrier; fwd back-to-back: per call of calls issued back to back.",
    ),
    Benchmark(
        "fsdp2",
        "FSDP2",
        "bench_fsdp2.py",
        "fsdp2",
        rows_table(
            (
                Field("step ms", "step_ms"),
                Field("vs Inductor", "speedup_vs_inductor", ".2f", "x"),
                Field("peak GiB", "peak_gib", ".2f"),
                Field("out SNR dB", "out_snr_db", ".1f", none="exact"),
                Field("worst grad SNR dB", "worst_grad_snr_db", ".1f", none="exact"),
            )
        ),
        "FP8 training, each layer compiled, then sharded; step time and peak memory per rank; SNR against Inductor.",
    ),
)
