"""Every goal a GPU run of the main job (``run_model.py``) is held to, in one table. ``run_model`` prints and records
them; the report (``report.py``) holds each run's rows to them as they stand now. Speedups and peak memory are
against Inductor in bf16, measured in the same run on one H200; the figures are the project's targets there."""

from __future__ import annotations

import dataclasses
import math
import statistics

# Every column our backend compiles, its cold compile over the same model's under Inductor.
COMPILE = 1.25
# Every primus_turbo column's peak memory in a step over Inductor's, at most; each FP8 recipe's also at most torchao's.
MEMORY = 1.02


@dataclasses.dataclass(frozen=True)
class Targets:
    """What a GPU run's columns aim at: speedups over Inductor bf16 (``fp8``: per recipe) and the cold compile time
    of every primus_turbo column over Inductor's. ``bf16_memory``: bf16 at no more peak memory than Inductor.
    ``fp8_over_bf16``: no FP8 column slower than bf16."""

    bf16: float
    fp8: dict[str, float]
    compile: float = COMPILE
    bf16_memory: bool = False
    fp8_over_bf16: bool = False


# The hand-written Llama-3-8B layer (--config llama3-8b, and the other Llama-style configs): batch 2 x 4096.
LAYER = Targets(1.05, {"tensorwise": 1.50, "rowwise": 1.47, "blockwise": 1.35}, bf16_memory=True)
# MoE layers of transformers' Mixtral and Qwen3-MoE classes (--config), experts through grouped_mm.
MOE = {
    "mixtral-8x7b": Targets(1.12, {"tensorwise": 1.30, "rowwise": 1.30}, fp8_over_bf16=True),
    "qwen3-30b-a3b": Targets(1.18, {"tensorwise": 1.25, "rowwise": 1.25}, fp8_over_bf16=True),
}
# The experts' FP8 grouped GEMM with its quantization, fwd+bwd, over bf16 torch._grouped_mm at Mixtral's shapes
# (bench_grouped_mm).
GROUPED_FP8 = 1.40
# transformers' models (--hf), 2 layers at published sizes with the LM head and loss, batch 2 x 2048, training.
# Mistral-7B has Llama-3-8B's layer, Qwen3-8B the same with q and k normalized per head.
HF_TRAIN = {
    "llama3-8b": Targets(1.10, {"tensorwise": 1.55, "rowwise": 1.52}),
    "mistral-7b": Targets(1.10, {"tensorwise": 1.55, "rowwise": 1.52}),
    "qwen3-8b": Targets(1.10, {"tensorwise": 1.55, "rowwise": 1.52}),
    "qwen2.5-7b": Targets(1.10, {"tensorwise": 1.55, "rowwise": 1.52}),
    "gemma-7b": Targets(1.10, {"tensorwise": 1.52, "rowwise": 1.50}),
    "phi3-mini": Targets(1.17, {"tensorwise": 1.58, "rowwise": 1.52}),
    # the MoE targets: the whole model, its experts' FP8 as "auto" chooses
    **MOE,
}
# Under autocast (fp32 parameters, --autocast) the ratios are to be within this fraction of pure bf16's: the
# training targets less it.
AUTOCAST_WITHIN = 0.03
# Their prefill (--mode inference); FP8 tensorwise also at least torchao tensorwise's speedup plus the margin.
HF_PREFILL = Targets(1.05, {"rowwise": 1.45})
PREFILL_TORCHAO_MARGIN = 0.15
# In training the bf16 loss within this of Inductor's, relative; each FP8 recipe's worst gradient SNR no worse than
# torchao's in the same recipe.
HF_LOSS_TOLERANCE = 1e-3


def targets(configuration: dict, model: str) -> Targets:
    """The targets of ``model`` in a run of ``configuration`` (the run's JSON's)."""
    if not configuration.get("hf"):
        return MOE.get(model, LAYER)
    if configuration.get("mode") == "inference":
        return HF_PREFILL
    train = HF_TRAIN[model]
    if not configuration.get("autocast"):
        return train
    keep = 1 - AUTOCAST_WITHIN
    fp8 = {recipe: round(target * keep, 2) for recipe, target in train.fp8.items()}
    return dataclasses.replace(train, bf16=round(train.bf16 * keep, 2), fp8=fp8)


def evaluate(table: list[dict], configuration: dict, model: str) -> list[dict]:
    """``model``'s rows of a GPU run against its goals, for the columns present. Serial compiles
    (``--compile-kernels``) are no cold compile: no compile-time goal then."""
    compile_goal = not configuration.get("compile_kernels")
    lines = speed(table, targets(configuration, model), compile_goal) + memory(table)
    return lines + transformers_goals(table) if configuration.get("hf") else lines


def speed(table: list[dict], targets: Targets = LAYER, compile_goal: bool = True) -> list[dict]:
    """A GPU run's values against ``targets``, for the columns present (``compile_goal``: the compile time's too); a
    speedup goal carries its ``target_speedup`` (the chart draws it)."""
    rows = {row["column"]: row for row in table if "error" not in row}
    inductor, report = rows["inductor"], []
    bf16 = rows.get("primus_turbo")
    if bf16 is not None:
        faster = bf16["speedup_vs_inductor"] >= targets.bf16
        if targets.bf16_memory:
            goal = f"primus_turbo bf16 >= {targets.bf16:.2f}x Inductor at no more peak memory"
            measured = (
                f"{bf16['speedup_vs_inductor']:.3f}x, {bf16['peak_gib']:.2f} GiB vs {inductor['peak_gib']:.2f} GiB"
            )
            met = faster and bf16["peak_gib"] <= inductor["peak_gib"]
        else:
            goal = f"primus_turbo bf16 >= {targets.bf16:.2f}x Inductor"
            measured, met = f"{bf16['speedup_vs_inductor']:.3f}x", faster
        report.append({"goal": goal, "measured": measured, "met": met, "target_speedup": targets.bf16})
    for recipe, target in targets.fp8.items():
        if (fp8 := rows.get(f"primus_turbo fp8 {recipe}")) is not None:
            report.append(
                {
                    "goal": f"primus_turbo fp8 {recipe} >= {target:.2f}x Inductor",
                    "measured": f"{fp8['speedup_vs_inductor']:.3f}x",
                    "met": fp8["speedup_vs_inductor"] >= target,
                    "target_speedup": target,
                }
            )
            if targets.fp8_over_bf16 and bf16 is not None:
                report.append(
                    {
                        "goal": f"primus_turbo fp8 {recipe} >= bf16",
                        "measured": f"{fp8['speedup_vs_inductor']:.3f}x vs {bf16['speedup_vs_inductor']:.3f}x",
                        "met": fp8["speedup_vs_inductor"] >= bf16["speedup_vs_inductor"],
                    }
                )
    compiled = {name: rows[base] for name in rows if (base := under_inductor(name)) in rows}
    if compiled and compile_goal:
        slowest = max(compiled, key=lambda name: rows[name]["compile_s"] / compiled[name]["compile_s"])
        ours, theirs = rows[slowest], compiled[slowest]
        report.append(
            {
                "goal": f"compile time <= {targets.compile:.2f}x Inductor's",
                "measured": f"{ours['compile_s'] / theirs['compile_s']:.2f}x at most "
                f"({slowest.removeprefix('primus_turbo ')}: {ours['compile_s']:.1f} s vs {theirs['compile_s']:.1f} s)",
                "met": ours["compile_s"] / theirs["compile_s"] <= targets.compile,
            }
        )
    return report


def under_inductor(column: str) -> str | None:
    """For a column our backend compiles, the column of the same model under Inductor: ours against ``inductor``, a
    peer's model against the peer's own column (Liger's kernels are slow to compile under either); else None."""
    if column.startswith("primus_turbo"):
        return "inductor"
    peer = column.removesuffix(" on primus_turbo")
    return peer if peer != column else None


def memory(table: list[dict]) -> list[dict]:
    """A GPU run's peak memory against its goals, for the columns present: every primus_turbo column's within MEMORY
    of Inductor's, and each FP8 recipe's at most torchao's; each goal measured at the column furthest from it."""
    rows = {row["column"]: row["peak_gib"] for row in table if row.get("peak_gib") is not None}
    ours = [name for name in rows if name.startswith("primus_turbo")]
    report = []
    if "inductor" in rows and ours:
        worst = max(ours, key=rows.get)
        ratio = rows[worst] / rows["inductor"]
        report.append(
            {
                "goal": f"primus_turbo peak memory <= {MEMORY:.2f}x Inductor's",
                "measured": f"{ratio:.3f}x at most ({_ours(worst)})",
                "met": ratio <= MEMORY,
            }
        )
    pairs = [(peer, ours_beside(peer)) for peer in rows if peer.startswith("torchao") and ours_beside(peer) in ours]
    if pairs:
        peer, column = max(pairs, key=lambda pair: rows[pair[1]] - rows[pair[0]])
        report.append(
            {
                "goal": "primus_turbo fp8 peak memory <= torchao's",
                "measured": f"{rows[column] - rows[peer]:+.2f} GiB at most ({_ours(column).removeprefix('fp8 ')})",
                "met": rows[column] <= rows[peer],
            }
        )
    return report


def ours_beside(peer: str) -> str | None:
    """Our column of a peer column's precision: torchao's FP8 recipe's, bf16 for Liger's; None for a column that is no
    peer's, or a peer's model compiled by our backend."""
    if peer == "liger":
        return "primus_turbo"
    recipe = peer.removeprefix("torchao fp8 ")
    return None if recipe == peer or " " in recipe else f"primus_turbo fp8 {recipe}"


def lighter_peers(table: list[dict]) -> list[str]:
    """Each peer column that peaked below ours of its precision (``ours_beside``), and by how much (GiB, and the
    fraction of ours)."""
    rows = {row["column"]: row["peak_gib"] for row in table if row.get("peak_gib") is not None}
    lines = []
    for peer, peak in rows.items():
        column = ours_beside(peer)
        if column in rows and peak < rows[column]:
            less = rows[column] - peak
            lines.append(f"{peer} by {less:.2f} GiB ({less / rows[column]:.1%})")
    return lines


def loss_difference(loss_snr_db: float) -> float:
    """|loss - Inductor's| / |Inductor's|, from the loss's SNR against Inductor's (one value: the SNR is that ratio)."""
    return 10 ** (-loss_snr_db / 20)


def peers_off_inductor(table: list[dict]) -> list[str]:
    """Each bf16 peer column (Liger's, under Inductor or our backend) whose training loss is further than
    HF_LOSS_TOLERANCE from Inductor's, relative: a peer's wrong result is shown beside its speed, not hidden."""
    lines = []
    for row in table:
        peer = row["column"].removesuffix(" on primus_turbo")
        if ours_beside(peer) == "primus_turbo" and row.get("loss_snr_db") is not None:
            difference = loss_difference(row["loss_snr_db"])
            if difference > HF_LOSS_TOLERANCE:
                lines.append(f"{row['column']} {difference:.1e} ({row['loss_snr_db']:.1f} dB)")
    return lines


def _ours(column: str) -> str:
    """A primus_turbo column by its own options: "bf16", "fp8 rowwise", ..."""
    return column.removeprefix("primus_turbo").strip() or "bf16"


def transformers_goals(table: list[dict]) -> list[dict]:
    """A transformers model's goals beyond its targets' speedups, for the columns present: in training, the bf16 loss
    within HF_LOSS_TOLERANCE of Inductor's and each FP8 recipe's worst gradient SNR no worse than torchao's; in
    inference, FP8 tensorwise ahead of torchao's by PREFILL_TORCHAO_MARGIN."""
    rows = {row["column"]: row for row in table if "error" not in row}
    report = []
    if (bf16 := rows.get("primus_turbo", {})).get("loss_snr_db") is not None:
        difference = loss_difference(bf16["loss_snr_db"])
        report.append(
            {
                "goal": f"primus_turbo bf16 loss within {HF_LOSS_TOLERANCE:.0e} of Inductor's, relative",
                "measured": f"{difference:.1e}",
                "met": difference <= HF_LOSS_TOLERANCE,
            }
        )
    for column, theirs in rows.items():
        recipe = column.removeprefix("torchao fp8 ")
        ours = rows.get(f"primus_turbo fp8 {recipe}")
        if recipe == column or ours is None:
            continue
        if "worst_grad_snr_db" in ours:
            # Equal arithmetic gives SNRs a few hundredths of a dB apart from input to input: within the standard
            # error of the two means the SNRs tie, and a tie is no worse.
            margin = math.hypot(standard_error(ours), standard_error(theirs))
            report.append(
                {
                    "goal": f"primus_turbo fp8 {recipe} worst gradient SNR >= torchao's",
                    "measured": f"{ours['worst_grad_snr_db']:.2f} dB vs {theirs['worst_grad_snr_db']:.2f} dB"
                    + (f" (standard error {margin:.2f} dB)" if margin else ""),
                    "met": ours["worst_grad_snr_db"] >= theirs["worst_grad_snr_db"] - margin,
                }
            )
        elif recipe == "tensorwise":
            report.append(
                {
                    "goal": f"primus_turbo fp8 tensorwise >= torchao's + {PREFILL_TORCHAO_MARGIN:.2f}x",
                    "measured": f"{ours['speedup_vs_inductor']:.3f}x vs {theirs['speedup_vs_inductor']:.3f}x",
                    "met": ours["speedup_vs_inductor"] >= theirs["speedup_vs_inductor"] + PREFILL_TORCHAO_MARGIN,
                }
            )
    return report


def standard_error(row: dict) -> float:
    """The standard error of a column's worst gradient SNR, from its spread over the inputs (0 for one input)."""
    per_input = row.get("worst_grad_snr_db_per_input") or []
    return statistics.stdev(per_input) / math.sqrt(len(per_input)) if len(per_input) > 1 else 0.0
