"""The README's performance tables: each model's training step against Inductor bf16 per column, and each column's
peak memory, from the main job's newest runs: README.md's generated ``performance`` section, the H200's tables then
the H100's."""

from __future__ import annotations

import pathlib

from benchmarks.runs import HAND_MARK, RESULTS, hand_edited_notes, load, newest_runs, runs_of, shows, wrap
from benchmarks.sections import layer_count
from benchmarks.tables import formatted, markdown_table

SUMMARY_COLUMNS = {
    "bf16": "primus_turbo",
    "fp8 tensorwise": "primus_turbo fp8 tensorwise",
    "fp8 rowwise": "primus_turbo fp8 rowwise",
    "torchao tensorwise": "torchao fp8 tensorwise",
    "torchao rowwise": "torchao fp8 rowwise",
    "liger": "liger",
}
NOT_RUN = "Not run on a GPU yet."


def section(folder: pathlib.Path = RESULTS) -> str:
    """README.md's performance section: the tables of the H200's runs in ``folder``, then those of the H100's runs in
    its ``h100`` folder under a line naming it (none where it holds no training run of the main job). Each GPU's
    tables from its own runs only: the same model's figures differ by GPU."""
    h200 = summary(load(folder))
    h100 = summary(load(folder / "h100"), "benchmarks/results/h100/")
    if h100 == NOT_RUN:
        return h200
    return "\n\n".join([h200, "One H100's runs, from `benchmarks/results/h100/`:", h100])


def summary(results: dict[str, dict], folder: str = "benchmarks/results/") -> str:
    """The README's tables: each model's training step against Inductor bf16, then each column's peak memory, from the
    main job's newest run of it. A column that run did not measure comes from the newest run of the model that did
    (each ratio is of its run); a dash where none did. A model whose figures come from a run edited by hand is
    marked, and a footnote names its file (in ``folder``) and says what was edited."""
    files = [
        file
        for file, result in sorted(results.items())
        if result["benchmark"] == "model"
        and result["configuration"]["mode"] == "train"
        and not result["configuration"]["autocast"]
    ]
    if not files:
        return NOT_RUN
    newest = newest_runs(results, files)
    speed = markdown_table(["model, training", "Inductor ms", *SUMMARY_COLUMNS], [])
    memory = markdown_table(["peak GiB", "Inductor", *SUMMARY_COLUMNS], [])
    machines, edited = set(), []
    for file in files:
        run, runs = results[file], runs_of(results[file])
        environment = run["environment"]
        versions = [f"{name} {environment[name]}" for name in ("torch", "transformers") if environment.get(name)]
        machines.add(", ".join([environment["machine"], *versions]))
        for model in dict.fromkeys(row["model"] for row in run["rows"]):
            if not shows(newest, runs, file, model):
                continue
            rows = {row["column"]: row for row in run["rows"] if row["model"] == model}
            found = [_newest_row(results, files, runs[0][1:], model, column) for column in SUMMARY_COLUMNS.values()]
            sources = {file, *(source for _, source in found if source)}
            by_hand = sorted(source for source in sources if results[source].get("hand_edited"))
            edited += [source for source in by_hand if source not in edited]
            name = model
            if run["configuration"].get("hf"):  # transformers' model: its layers, the LM head and loss
                layers = run["configuration"]["models"][model]["layers"]
                name = f"{model} (transformers, {layer_count(layers)}, LM head)"
            name += HAND_MARK * bool(by_hand)
            inductor = rows.get("inductor", {})
            speed.append(_line(name, formatted(inductor.get("step_ms"), ".2f"), found, "speedup_vs_inductor", "x"))
            memory.append(_line(name, formatted(inductor.get("peak_gib"), ".2f"), found, "peak_gib"))
    size = {(results[f]["configuration"]["batch"], results[f]["configuration"]["seq"]) for f in files}
    note = (
        f"Batch x seq {', '.join(f'{b} x {q}' for b, q in sorted(size))}; {'; '.join(sorted(machines))}. Each model's "
        "newest run; a column it did not measure, from the newest run that did; a dash: no run measured it."
    )
    notes = hand_edited_notes(results, edited, folder)
    return "\n".join([*speed, "", *memory, "", *wrap(note), *notes])


def _line(name: str, inductor: str, found: list[tuple], key: str, suffix: str = "") -> str:
    """A summary table's line: the model, Inductor's figure, and each column's ``key`` from its row in ``found``
    ("failed" where it failed, a dash where no run measured it)."""
    cells = ["failed" if row and "error" in row else formatted((row or {}).get(key), ".2f", suffix) for row, _ in found]
    return f"| {name} | {inductor} | " + " | ".join(cells) + " |"


def _newest_row(
    results: dict[str, dict], files: list[str], kind: tuple, model: str, column: str
) -> tuple[dict | None, str | None]:
    """``column``'s row for ``model`` in the newest of ``files`` of that kind (transformers' or not, mode) with it,
    and that file ((None, None) where none has it)."""
    found = [
        (results[file]["environment"]["date"], row, file)
        for file in files
        if (model, *kind) in runs_of(results[file])
        for row in results[file]["rows"]
        if row.get("model") == model and row["column"] == column
    ]
    return max(found, key=lambda dated: dated[0])[1:] if found else (None, None)
