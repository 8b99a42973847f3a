"""Where FP8 wins: per device, the measured fwd+bwd times of GEMMs in high precision and in each FP8 recipe, and of
each implementation of the high-precision grouped GEMM (:func:`grouped_implementation`).

A table per GPU model lies beside this module (``nvidia-h200.json``), written by ``python -m benchmarks.cost_table``
from benchmark runs on that GPU; nothing in it is typed by hand. The ``fp8`` option's ``"auto"`` asks :func:`decide`
per GEMM. A shape the table measured takes FP8 where its recipe ran faster, by ``margin``, than high precision;
where the table also measured a substitute of the recipe (``Recipe.substitutes``: the same forward, a backward at
least as accurate), the fastest of them runs. An unmeasured shape takes the table's default for its kind of GEMM:
high precision for the grouped GEMMs of MoE experts (never slower; FP8 lost at some measured shapes), FP8 for the
linears of dense models (they won at every one). A GPU without a table takes those defaults too; the CPU (the
interpreter, the tests) takes FP8 as the option asks. Why: ``docs/fp8.md``, "Where FP8 pays".
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import pathlib
import re

import torch

from ..kernels.registry import AUTO
from ..recipes import RECIPES

HERE = pathlib.Path(__file__).resolve().parent
GROUPED_MM, LINEAR = "grouped_mm", "linear"
HIGH_PRECISION = "high precision"
# A measured row stands for shapes of the same experts, K and N whose rows are within this factor of its own.
ROWS_FACTOR = 2.0
# A shape no run measured, on any GPU: MoE experts' grouped GEMMs lost in FP8 at Qwen3-MoE's shapes and won by 2-14%
# at Mixtral's (H200, H100), so high precision is never slower; linears of dense models won in every run.
DEFAULTS = {GROUPED_MM: HIGH_PRECISION, LINEAR: "fp8"}


@dataclasses.dataclass(frozen=True)
class Decision:
    """Whether one GEMM runs in FP8, in which recipe, and why, in words for the log and the compile record."""

    fp8: bool
    reason: str
    recipe: str


def device_slug(device: torch.device) -> str:
    """The table's file name for ``device``: ``nvidia-h200`` for an "NVIDIA H200"; ``cpu`` for the CPU."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return device.type
    return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(device).lower()).strip("-")


@functools.cache
def table(slug: str) -> dict | None:
    """The cost table of the GPU model ``slug``, or None where none was measured."""
    path = HERE / f"{slug}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _rows(value) -> int | None:
    """A size as an int; a symbolic size's hint; None where it has none."""
    if isinstance(value, int):
        return value
    hint = getattr(getattr(value, "node", None), "hint", None)
    return int(hint) if hint is not None else None


def _default(defaults: dict, kind: str, recipe: str) -> tuple[bool, str]:
    """(whether ``defaults`` put a ``kind`` GEMM in FP8, that choice in words)."""
    fp8 = defaults[kind] == "fp8"
    return fp8, f"FP8 {recipe}" if fp8 else HIGH_PRECISION


def _nearest(costs: dict, kind: str, groups: int, rows: int | None, k: int, n: int, keys) -> dict | None:
    """The table's row of this ``kind`` and (groups, K, N) that measured one of ``keys``, with the rows nearest to
    ``rows`` within :data:`ROWS_FACTOR`; None where there is none."""
    nearest = None
    for entry in costs.get(kind, ()):
        measured = any(key in entry["ms"] for key in keys)
        if (entry["groups"], entry["k"], entry["n"]) != (groups, k, n) or not measured or rows is None:
            continue
        distance = abs(math.log(entry["rows"] / rows))
        if distance <= math.log(ROWS_FACTOR) and (nearest is None or distance < nearest[0]):
            nearest = distance, entry
    return None if nearest is None else nearest[1]


def decide(kind: str, recipe: str, device: torch.device, rows, k: int, n: int, groups: int = 1) -> Decision:
    """FP8 or high precision for a ``kind`` GEMM (:data:`GROUPED_MM`: ``groups`` experts' weights [K, N] over
    ``rows`` routed rows in all; :data:`LINEAR`: [rows, K] x [K, N]) in ``recipe``, on ``device``."""
    slug = device_slug(device)
    costs = table(slug)
    rows = _rows(rows)
    shape = f"[groups {groups}, rows {rows}, K {k}, N {n}]" if kind == GROUPED_MM else f"[{rows} x {k} -> {n}]"
    if costs is None and device.type != "cuda":
        return Decision(True, f"no cost table for {slug}: FP8 as the option asks", recipe)
    if costs is None:
        fp8, default = _default(DEFAULTS, kind, recipe)
        return Decision(fp8, f"{shape}: no cost table for {slug}: {default}, the default for a {kind}", recipe)
    candidates = (recipe, *RECIPES[recipe].substitutes)
    entry = _nearest(costs, kind, groups, rows, k, n, candidates)
    if entry is None:
        fp8, default = _default(costs["defaults"], kind, recipe)
        return Decision(fp8, f"{shape} not measured on {slug}: {default}, the table's default for a {kind}", recipe)
    times = {candidate: entry["ms"][candidate] for candidate in candidates if candidate in entry["ms"]}
    fastest = min(times, key=times.get)
    # Against the fastest high precision measured: what the bf16 backend runs, one GEMM per group where that won.
    prefix = implementation_key("")
    high_key = min((key for key in entry["ms"] if key == HIGH_PRECISION or key.startswith(prefix)), key=entry["ms"].get)
    high = entry["ms"][high_key]
    fp8 = times[fastest] < high * (1 - costs["margin"])
    verdict = f"FP8 {fastest}" if fp8 else HIGH_PRECISION
    by = f" by {high_key[len(prefix) :]}" if high_key.startswith(prefix) else ""
    fp8_times = ", ".join(f"{ms:.3f} ms in FP8 {candidate}" for candidate, ms in times.items())
    return Decision(
        fp8,
        f"{shape}: {verdict}, measured on {slug} at {entry['rows']} rows: {high:.3f} ms in high precision{by}, "
        f"{fp8_times} (fwd+bwd)",
        fastest if fp8 else recipe,
    )


def implementation_key(name: str) -> str:
    """The key of a row's ``ms`` for high precision run by the grouped GEMM implementation ``name``."""
    return f"{HIGH_PRECISION} impl={name}"


def grouped_implementation(device: torch.device, rows, k: int, n: int, groups: int) -> tuple[str | None, str]:
    """(the implementation a high-precision grouped GEMM runs, or None for the registry's own ranking, why; no
    reason where the device has no table).

    An implementation the table measured at this shape, forward and backward, faster by ``margin`` than the
    ranking's choice: one GEMM per expert won at Mixtral's few large experts and lost at Qwen3-MoE's many small
    ones (``docs/kernels.md``, "Grouped GEMM"), so the choice is per shape, from data."""
    slug = device_slug(device)
    costs = table(slug)
    if costs is None:
        return None, ""
    rows = _rows(rows)
    shape = f"[groups {groups}, rows {rows}, K {k}, N {n}]"
    entry = _nearest(costs, GROUPED_MM, groups, rows, k, n, (HIGH_PRECISION,))
    if entry is None:
        return None, f"{shape} not measured on {slug}: the ranking's implementation"
    prefix = implementation_key("")
    others = {key[len(prefix) :]: ms for key, ms in entry["ms"].items() if key.startswith(prefix)}
    ranked = others.pop(AUTO, None)  # timed as the others were, where the run timed it so
    ranked = entry["ms"][HIGH_PRECISION] if ranked is None else ranked
    fastest = min(others, key=others.get) if others else None
    times = ", ".join(f"{ms:.3f} ms by {name}" for name, ms in others.items())
    measured = f"measured on {slug} at {entry['rows']} rows: {ranked:.3f} ms by the ranking's choice"
    measured += f", {times} (fwd+bwd)" if times else ", no other implementation"
    if fastest is None or others[fastest] >= ranked * (1 - costs["margin"]):
        return None, f"{shape}: the ranking's implementation, {measured}"
    return fastest, f"{shape}: {fastest}, {measured}"
