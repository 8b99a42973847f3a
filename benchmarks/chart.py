"""A run's chart beside its JSON: the main job's speedups (and peak memory, on a GPU) with its goals, the
convergence run's loss curves."""

from __future__ import annotations

import json
import pathlib


def write_chart(path: str) -> str | None:
    """Draws the chart of a run's JSON beside it (``.png``): speedups for the model benchmark, loss curves for
    convergence; returns its path, or None for benchmarks without a chart."""
    result = json.loads(pathlib.Path(path).read_text())
    draw = {"model": _speedup_chart, "convergence": _loss_chart}.get(result["benchmark"])
    if draw is None:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    png = str(pathlib.Path(path).with_suffix(".png"))
    fig = draw(plt, result)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    print(f"wrote {png}")
    return png


def _speedup_chart(plt, result: dict):
    """A bar per column and model (models in the legend): the speedups, with Inductor's 1.0 and a line per goal the
    run reports, and beside them each column's peak memory where the run measured it (a GPU run)."""
    models = list(dict.fromkeys(row["model"] for row in result["rows"]))
    columns = list(dict.fromkeys(row["column"] for row in result["rows"]))
    memory = any(row.get("peak_gib") is not None for row in result["rows"])
    fig, axes = plt.subplots(
        1,
        1 + memory,
        figsize=(8 + 4 * memory, 1.0 + 0.22 * len(columns) * max(1.5, len(models))),
        sharey=True,
        squeeze=False,
        width_ratios=[2, 1][: 1 + memory],
    )
    ax = axes[0][0]
    _bars(plt, ax, result["rows"], models, columns, "speedup_vs_inductor", "%.2fx")
    ax.set_yticks(range(len(columns)), columns, fontsize=8)
    ax.invert_yaxis()  # the table's order, top to bottom (the memory panel shares the axis)
    ax.axvline(1.0, color="black", linewidth=0.8)  # Inductor
    targets = {}  # each target speedup: the models whose goal it is (transformers' models each have their own)
    for goal in result.get("goals", []):
        if "target_speedup" in goal:
            targets.setdefault(goal["target_speedup"], {})[goal["model"]] = None
    for n, (target, owners) in enumerate(sorted(targets.items())):
        label = f"goal {target:.2f}x" + (f" ({', '.join(owners)})" if len(owners) < len(models) else "")
        ax.axvline(target, color="black", linestyle=(":", "--", "-.")[n % 3], linewidth=0.8, label=label)
    ax.set_xlabel("speedup over Inductor")
    if memory:
        _bars(plt, axes[0][1], result["rows"], models, columns, "peak_gib", "%.2f")
        axes[0][1].set_xlabel("peak GiB in a step")
    configuration = result["configuration"]
    layers = {model["layers"] for model in configuration["models"].values()}
    fig.suptitle(
        f"{', '.join(models)}{' (transformers)' * bool(configuration.get('hf'))}: "
        f"{'/'.join(map(str, sorted(layers)))} layer(s), batch {configuration['batch']} x seq "
        f"{configuration['seq']}, {configuration['mode']} ({result['environment']['machine']})",
        fontsize=9,
    )
    if len(models) > 1 or targets:
        ax.legend(fontsize=7, loc="best")
    return fig


def _bars(plt, ax, rows: list[dict], models: list[str], columns: list[str], key: str, label: str) -> None:
    """Horizontal bars of each row's ``key`` (labelled with ``label``), a group per column with a bar per model; a
    column without it (failed) at 0."""
    height = 0.8 / len(models)
    for m, model in enumerate(models):
        value = {row["column"]: row[key] for row in rows if row["model"] == model and row.get(key) is not None}
        offsets = [n + (m - (len(models) - 1) / 2) * height for n in range(len(columns))]
        values = [value.get(column, 0.0) for column in columns]
        bars = ax.barh(offsets, values, height, label=model, color=plt.cm.tab10(m % 10))
        ax.bar_label(bars, fmt=label, fontsize=7, padding=2)
    ax.margins(x=0.12)


def _loss_chart(plt, result: dict):
    """Each column's loss per step; Inductor's solid, the others dashed."""
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for row in result["rows"]:
        losses = row["losses"]
        style = "-" if row["column"] == "inductor" else "--"
        ax.plot(range(1, len(losses) + 1), losses, label=row["column"], linewidth=1.2, linestyle=style)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    dtype, machine = result["configuration"]["dtype"], result["environment"]["machine"]
    ax.set_title(f"tiny Llama-style decoder, AdamW, {dtype} ({machine})", fontsize=9)
    ax.legend(fontsize=8)
    return fig
