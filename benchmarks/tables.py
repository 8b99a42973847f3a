"""The Markdown tables of the benchmark READMEs: a line per row of a run (``rows_table``), or a run's rows pivoted
into a grid of times and ratios (``pivot``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable


def formatted(value, spec: str, suffix: str = "", none: str = "-") -> str:
    return none if value is None else f"{value:{spec}}{suffix}"


def markdown_table(header: list[str], lines: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(cells) + " |" for cells in lines),
    ]


@dataclasses.dataclass(frozen=True)
class Field:
    """A column of a per-row table: its header, the row's key, and how the value (and null) is written."""

    header: str
    key: str
    spec: str = ".3f"
    suffix: str = ""
    none: str = "-"


def rows_table(fields: tuple[Field, ...]) -> Callable[[dict], list[str]]:
    """A table of one line per row of the result: its column (and model, where rows differ in it), then the fields
    that some row has."""

    def render(result: dict) -> list[str]:
        rows = result["rows"]
        names = (["model"] if len({row.get("model") for row in rows}) > 1 else []) + ["column"]
        shown = [field for field in fields if any(row.get(field.key) is not None for row in rows)]
        lines = []
        for row in rows:
            line = [str(row[name]) for name in names]
            if "error" in row:
                error = row["error"].splitlines()[0][:40]
                lines.append(line + [f"failed: {error}"] + [""] * (len(shown) - 1))
            else:
                lines.append(line + [formatted(row.get(f.key), f.spec, f.suffix, f.none) for f in shown])
        return markdown_table(names + [field.header for field in shown], lines)

    return render


def pivot(
    down: tuple[str, ...],
    across: str,
    keep: Callable[[dict], bool],
    gpu_time: bool,
    baseline: str = "inductor",
    ratio_key: str | None = None,
    ratio_format: tuple[str, str] = (".2f", "x"),
) -> Callable:
    """A table of the rows ``keep`` selects: the values of ``down`` down the side, of ``across`` along the top, and in
    each cell the time (GPU time alone with ``gpu_time``) and its ratio to the ``baseline`` column's (or the row's
    ``ratio_key``, as ``ratio_format``'s spec and suffix)."""

    def render(result: dict) -> list[str]:
        rows = [row for row in result["rows"] if keep(row)]
        side = list(dict.fromkeys(tuple(row[key] for key in down) for row in rows))
        top = list(dict.fromkeys(row[across] for row in rows))
        cells = {(tuple(row[key] for key in down), row[across]): row for row in rows}
        time, ratio = ("gpu_ms", "gpu_speedup_vs_inductor") if gpu_time else ("ms", "speedup_vs_inductor")
        ratio = ratio_key or ratio
        lines = []
        for key in side:
            line = [str(value).replace(", ", ",") for value in key]  # [16384,4096]: narrower rows
            for column in top:
                row = cells.get((key, column))
                if row is None:
                    line.append("")
                elif row[across] == baseline:
                    line.append(formatted(row[time], ".4f"))
                else:
                    line.append(f"{formatted(row[time], '.4f')} ({formatted(row.get(ratio), *ratio_format)})")
            lines.append(line)
        header = [*down[:-1], f"{down[-1]} ({'GPU ms' if gpu_time else 'ms'})"]
        return markdown_table(header + [str(column).removeprefix("primus_turbo ") for column in top], lines)

    return render
