"""The committed runs the READMEs are made of: loaded from ``benchmarks/results/``, which of them each table shows
(each model's newest run; transformers' models measured alike in one table), and how a run is named (its command,
date, machine and versions; a run edited by hand marked)."""

from __future__ import annotations

import json
import pathlib
import textwrap

from benchmarks import goals, record

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
MAX_WIDTH = 120
# Marks a run whose JSON was edited or typed by hand (its "hand_edited" says what): no run wrote it as it stands.
HAND_MARK = "†"


def load(folder: pathlib.Path = RESULTS) -> dict[str, dict]:
    """Every ``*.json`` in ``folder`` by file name (none where the folder is missing)."""
    return {path.name: json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))}


def run_goals(result: dict) -> list[dict]:
    """A run of the main job that recorded goals (a GPU run's) held to ``goals.py``'s goals as they stand now, per
    model it measured: those it recorded may be older ones."""
    if result["benchmark"] != "model" or "goals" not in result:
        return []
    by_model: dict[str, list[dict]] = {}
    for row in result["rows"]:
        by_model.setdefault(row["model"], []).append(row)
    configuration = result["configuration"]
    return [{"model": m, **goal} for m, rows in by_model.items() for goal in goals.evaluate(rows, configuration, m)]


def wrap(text: str) -> list[str]:
    return textwrap.wrap(text, MAX_WIDTH, break_long_words=False, break_on_hyphens=False)


def machine_of(environment: dict) -> str:
    """The machine, torch and Triton a run had."""
    versions = (f"{name} {environment[name]}" for name in ("torch", "triton") if environment.get(name))
    return ", ".join([environment["machine"], *versions])


def environment_line(file: str, environment: dict, shared: str, edited: bool = False) -> str:
    """A run's command with the variables it started with (which names its file; the file where no command was
    recorded) and date, its machine where the runs differ in theirs (``shared``: the one all had), and the versions
    of transformers and the peers where the run recorded them. The command without ``--out DIR``; ``edited``: marked
    as a run edited by hand."""
    machine = "" if machine_of(environment) == shared else f"{machine_of(environment)}, "
    for package in record.PACKAGES:
        if environment.get(package):
            machine += f"{package} {environment[package]}, "
    if environment.get("native kernels") is False and "TURBO_INDUCTOR_NATIVE" in environment.get("variables", {}):
        machine += "native kernels not built, "
    words = environment.get("command", [])
    command = [w for i, w in enumerate(words) if w != "--out" and (i == 0 or words[i - 1] != "--out")]
    command = [f"{k}={v}" for k, v in environment.get("variables", {}).items()] + command
    mark = HAND_MARK if edited else ""
    return f"`{' '.join(command) if command else file}`{mark}: {machine}{environment['date'][:10]}."


def run_names(results: dict[str, dict], files: list[str], shared: str) -> str:
    """The runs of ``files``, each as ``environment_line`` names it."""
    return " ".join(environment_line(f, results[f]["environment"], shared, "hand_edited" in results[f]) for f in files)


def hand_edited_notes(results: dict[str, dict], files: list[str], folder: str = "") -> list[str]:
    """A blank line, then a footnote per run of ``files`` edited by hand: its file (in ``folder``) and what was
    edited; nothing where none was."""
    lines = []
    for file in files:
        if results[file].get("hand_edited"):
            lines += wrap(f"{HAND_MARK} `{folder}{file}` edited by hand: {results[file]['hand_edited']}.")
    return [""] * bool(lines) + lines


def runs_of(result: dict) -> list[tuple]:
    """What a run measured, to tell which run is the newest of each: (model, transformers' or not, mode, under
    autocast or not)."""
    configuration = result.get("configuration", {})
    kind = (bool(configuration.get("hf")), configuration.get("mode"), bool(configuration.get("autocast")))
    return [(model, *kind) for model in configuration.get("models", {})]


def newest_runs(results: dict[str, dict], files: list[str]) -> dict[tuple, str]:
    """For each model, kind and mode that ``files`` measured: the file of its newest run."""
    newest: dict[tuple, str] = {}
    for file in files:
        for key in runs_of(results[file]):
            if key not in newest or results[file]["environment"]["date"] > results[newest[key]]["environment"]["date"]:
                newest[key] = file
    return newest


def shows(newest: dict[tuple, str], runs: list[tuple], file: str, model: str | None) -> bool:
    """Whether ``file``'s table shows ``model``: its newest run (any row where the run names no models)."""
    return not runs or model is None or newest.get((model, *runs[0][1:]), file) == file


def together(results: dict[str, dict], files: list[str]) -> list[list[str]]:
    """The runs shown in one table: transformers' models measured alike (mode, batch, sequence, SNR inputs, autocast,
    layers), each against the Inductor of its own run; every other run alone."""
    groups: dict = {}
    for file in files:
        configuration = results[file].get("configuration", {})
        key = file
        if configuration.get("hf"):
            layers = tuple(sorted({model.get("layers") for model in configuration["models"].values()}))
            key = tuple(configuration.get(k) for k in ("mode", "batch", "seq", "snr_inputs", "autocast")) + layers
        groups.setdefault(key, []).append(file)
    return list(groups.values())


def shown_result(results: dict[str, dict], group: list[str], newest: dict[tuple, str]) -> dict:
    """One result of ``group``'s runs: the rows and goals of each model's newest run, the models they measured."""
    rows, shown_goals, models = [], [], {}
    for file in group:
        result, runs = results[file], runs_of(results[file])
        rows += [row for row in result["rows"] if shows(newest, runs, file, row.get("model"))]
        shown_goals += [g for g in run_goals(result) if shows(newest, runs, file, g["model"])]
        models.update(result.get("configuration", {}).get("models", {}))
    first = results[group[0]]
    shown_models = {row.get("model") for row in rows}
    configuration = {**first.get("configuration", {})}
    if "models" in configuration:
        configuration["models"] = {name: m for name, m in models.items() if name in shown_models}
    return {**first, "rows": rows, "goals": shown_goals, "configuration": configuration}
