"""The FP8 cost table of a GPU model (``turbo_inductor/costs/<gpu>.json``) from benchmark runs on it: what the
``fp8`` option's ``"auto"`` reads to put a GEMM in FP8 only where it was measured to win (``turbo_inductor.costs``).

``python -m benchmarks.cost_table RESULT.json [...] [--out turbo_inductor/costs]``
Takes ``bench_grouped_mm`` runs (fwd+bwd rows: ``grouped_mm impl=auto`` is high precision, ``grouped_mm impl=NAME`` high
precision by implementation NAME (auto included), ``fp8 RECIPE auto`` each recipe) and ``bench_fp8`` runs (its training
step by size: ``inductor`` is high precision), their GPU time; an implementation whose host waits on the GPU, its
wall time where its host cannot keep up. A shape measured again replaces its row; every row names the run it came from.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re

from benchmarks.bench_grouped_mm import SHAPE
from turbo_inductor.costs import DEFAULTS, GROUPED_MM, HERE, HIGH_PRECISION, LINEAR, implementation_key
from turbo_inductor.kernels import registry
from turbo_inductor.ops.grouped_mm import GroupedMMNode

GROUPED_KERNELS = GroupedMMNode.kernels  # forward and dgrad, wgrad: an implementation name runs both

# FP8 must be this much faster than high precision to be taken: the spread of repeated GPU timings of one step.
MARGIN = 0.02
# Wall over GPU time past which a host that waits on the GPU is what a step waits for. One GEMM per group ran
# 1.03-1.10x at Mixtral's 8 experts, host time the model did not show, and 3.4-7.4x at Qwen3-MoE's 128 (H100).
HOST_BOUND = 1.5
_LINEAR = re.compile(r"linear (\d+)x(\d+)->(\d+)")
_FP8_COLUMN = re.compile(r"(?:fp8|primus_turbo fp8) (\w+)(?: auto)?$")
_IMPL_COLUMN = re.compile(r"grouped_mm impl=(\w+)$")


def slug_of(machine: str) -> str:
    """``nvidia-h200`` for a run's machine "1x NVIDIA H200"."""
    return re.sub(r"[^a-z0-9]+", "-", re.sub(r"^\d+x ", "", machine).lower()).strip("-")


def gpu(row: dict) -> float:
    """A row's GPU time, or its wall time where the run recorded none."""
    return row.get("gpu_ms", row["ms"])


def host_bound_ms(row: dict) -> float:
    """The cost of an implementation whose host waits on the GPU (it reads offs): its GPU time while its host keeps
    up, else its wall time, where its wall time is over HOST_BOUND times its GPU time."""
    gpu_ms = gpu(row)
    return row["ms"] if row["ms"] > HOST_BOUND * gpu_ms else gpu_ms


def entries(result: dict, source: str) -> dict[str, list[dict]]:
    """The cost rows of one benchmark run, by kind of GEMM."""
    found: dict[tuple, dict] = {}
    for row in result["rows"]:
        if row.get("mode") != "fwd+bwd":
            continue
        column = row.get("column", row.get("backend", ""))
        alternative = None
        if result["benchmark"] == "grouped_mm" and (match := SHAPE.search(row["shape"])):
            rows, k, groups, _, n = map(int, match.groups())
            key = (GROUPED_MM, groups, rows, k, n)
            high = column == "grouped_mm impl=auto"
            if m := _IMPL_COLUMN.match(column):
                name, alternative = m.group(1), implementation_key(m.group(1))
        elif result["benchmark"] == "fp8" and (match := _LINEAR.search(row["shape"])):
            rows, k, n = map(int, match.groups())
            key = (LINEAR, 1, rows, k, n)
            high = column == "inductor"
        else:
            continue
        entry = found.setdefault(key, {"groups": key[1], "rows": rows, "k": k, "n": n, "ms": {}, "source": source})
        if alternative is not None:
            # GPU time, as in a compiled graph, where the host's launches run ahead (an eager call's host time is
            # not theirs there); an implementation that reads offs on the host, see host_bound_ms.
            waits = not all(registry.declares(kernel, name, registry.LAUNCHES_AHEAD) for kernel in GROUPED_KERNELS)
            entry["ms"][alternative] = round(host_bound_ms(row) if waits else gpu(row), 4)
            if not high:
                continue
        recipe = HIGH_PRECISION if high else (m.group(1) if (m := _FP8_COLUMN.match(column)) else None)
        if recipe is None:
            continue
        # GPU time where the run recorded it: in a model the host's launches overlap other kernels, while a lone
        # small GEMM's wall time is mostly launches (FP8 8192x2048->2048 at 0.37x Inductor on an H100).
        entry["ms"][recipe] = round(gpu(row), 4)
    table: dict[str, list[dict]] = {GROUPED_MM: [], LINEAR: []}
    for (kind, *_), entry in found.items():
        if HIGH_PRECISION in entry["ms"] and len(entry["ms"]) > 1:
            table[kind].append(entry)
    return table


def merge(old: dict | None, new: dict[str, list[dict]], environment: dict) -> dict:
    """``old``'s rows, those of shapes measured again replaced by ``new``'s."""
    table = {"device": environment["machine"], "margin": MARGIN, "defaults": DEFAULTS}
    for kind in (GROUPED_MM, LINEAR):
        fresh = {(e["groups"], e["rows"], e["k"], e["n"]): e for e in new[kind]}
        kept = [e for e in (old or {}).get(kind, []) if (e["groups"], e["rows"], e["k"], e["n"]) not in fresh]
        table[kind] = sorted(kept + list(fresh.values()), key=lambda e: (e["groups"], e["k"], e["n"], e["rows"]))
    return table


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("``python")[0])
    parser.add_argument("results", nargs="+", help="bench_grouped_mm / bench_fp8 JSON files of one GPU model")
    parser.add_argument("--out", default=str(HERE), help="folder of the tables (default: the package's)")
    args = parser.parse_args(argv)
    tables: dict[str, dict] = {}
    for name in args.results:
        result = json.loads(pathlib.Path(name).read_text())
        slug = slug_of(result["environment"]["machine"])
        path = pathlib.Path(args.out) / f"{slug}.json"
        old = tables.get(slug) or (json.loads(path.read_text()) if path.exists() else None)
        # The run's file under benchmarks/results (where runs of other GPUs lie in a folder of their own).
        path = pathlib.Path(name).resolve()
        results = pathlib.Path(__file__).resolve().parent / "results"
        shown = path.relative_to(results) if path.is_relative_to(results) else path.name
        source = f"{shown} ({result['environment'].get('date', '?')[:10]}, torch "
        source += f"{result['environment'].get('torch', '?')})"
        tables[slug] = merge(old, entries(result, source), result["environment"])
    for slug, table in tables.items():
        path = pathlib.Path(args.out) / f"{slug}.json"
        path.write_text(json.dumps(table, indent=1) + "\n")
        print(f"{path}: {len(table[GROUPED_MM])} grouped GEMM shapes, {len(table[LINEAR])} linear shapes")


if __name__ == "__main__":
    main()
