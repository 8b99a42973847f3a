"""The documentation stays true to the code: generated tables are current, lines are short, snippets run.
``UPDATE_DOCS=1 pytest lowering_tests/test_docs.py`` rewrites the generated tables."""

import os
import pathlib
import re
import subprocess
import sys

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
        "docs/adding-an-op.md",
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


def test_the_usage_snippet_runs_on_the_quick_start_machine():
    """The README's "Using it" code, as a user runs it: a CPU machine without TRITON_INTERPRET."""
    import subprocess
    import sys

    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Using it", 1)[1].split("\n## ", 1)[0]
    assert "runs on the Quick-start CPU machine" in section
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "'fp8': 2" in result.stdout


def test_the_worked_example_of_adding_an_op_runs():
    """docs/adding-an-op.md's blocks, as the modules they name, and its tests: in a process of their own."""
    from worked_example import blocks

    assert [path for path, _ in blocks()] == [
        "turbo_inductor/kernels/reference/squared_relu.py",
        "turbo_inductor/kernels/triton/squared_relu.py",
        "turbo_inductor/ops/squared_relu.py",
        "turbo_inductor/passes/squared_relu.py",
        "lowering_tests/test_squared_relu.py",
    ]
    run = subprocess.run(
        [sys.executable, str(ROOT / "lowering_tests/worked_example.py")], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("passed test_") == 3, run.stdout
