"""The documentation stays true to the code: generated tables are current, lines are short, snippets run.
``UPDATE_DOCS=1 pytest lowering_tests/test_docs.py`` rewrites the generated tables."""

import os
import pathlib
import re

import pytest

from benchmarks import report
from turbo_inductor.options import option_table
from turbo_inductor.passes import PASSES, phase_table

ROOT = pathlib.Path(__file__).resolve().parent.parent


def generated(path: str, name: str, body: str) -> None:
    """The text between ``<!-- generated: name -->`` and ``<!-- end: name -->`` in ``path`` is ``body``."""
    file = ROOT / path
    text = file.read_text()
    pattern = re.compile(rf"(<!-- generated: {name} -->\n)(.*?)(<!-- end: {name} -->)", re.S)
    match = pattern.search(text)
    assert match, f"{path} has no generated {name!r} section"
    if os.environ.get("UPDATE_DOCS"):
        file.write_text(text[: match.start(2)] + body + "\n" + text[match.end(2) :])
        return
    assert match.group(2) == body + "\n", f"{path}: the {name} is stale; run UPDATE_DOCS=1 pytest {__file__}"


def test_the_phase_table_is_generated_from_the_pass_declarations():
    generated("docs/architecture.md", "phase table", phase_table(PASSES))


def test_the_options_are_documented_once_from_the_code():
    generated("README.md", "options", option_table(PASSES))


def test_the_performance_table_is_generated_from_the_benchmark_results():
    generated("README.md", "performance", report.summary(report.load()))


@pytest.mark.parametrize(
    "path",
    [
        "README.md",
        "docs/architecture.md",
        "docs/fp8.md",
        "docs/passes.md",
        "docs/tensor-parallel.md",
        "benchmarks/README.md",
    ],
)
def test_lines_are_at_most_120_characters(path):
    long = [i + 1 for i, line in enumerate((ROOT / path).read_text().splitlines()) if len(line) > 120]
    assert not long, f"{path}: lines {long} are over 120 characters"


def test_the_architecture_fits_two_pages():
    assert len((ROOT / "docs/architecture.md").read_text().splitlines()) <= 130
