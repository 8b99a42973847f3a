"""The documentation stays true to the code: generated tables are current, lines are short, snippets run.
``UPDATE_DOCS=1 pytest lowering_tests/system/test_docs.py`` rewrites the generated tables (the performance tables:
benchmarks/tests/test_benchmark_report.py)."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from turbo_inductor.options import option_table
from turbo_inductor.passes import PASSES, phase_table
from turbo_inductor.testing.docs import generated

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_phase_table_is_generated_from_the_pass_declarations():
    generated("docs/architecture.md", "phase table", phase_table(PASSES))


def test_the_options_are_documented_once_from_the_code():
    generated("README.md", "options", option_table(PASSES))


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


def test_ci_runs_the_readmes_lint_and_tests():
    """.ci/run (CI, on a fresh clone) runs the Quick start's lint and test commands exactly as the README gives them."""
    section = (ROOT / "README.md").read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    indented = ("    ruff ", "    python -m pytest ")
    commands = [line.strip() for line in section.splitlines() if line.startswith(indented)]
    assert len(commands) == 2, commands
    ci = (ROOT / ".ci/run").read_text().splitlines()
    assert [line for line in ci if line.startswith(("ruff ", "python -m pytest "))] == commands


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
    from lowering_tests.worked_example import blocks

    assert [path for path, _ in blocks()] == [
        "turbo_inductor/kernels/reference/squared_relu.py",
        "turbo_inductor/kernels/triton/squared_relu.py",
        "turbo_inductor/ops/squared_relu.py",
        "turbo_inductor/passes/squared_relu.py",
        "lowering_tests/ops/test_squared_relu.py",
        "lowering_tests/passes/test_squared_relu.py",
    ]
    run = subprocess.run(
        [sys.executable, str(ROOT / "lowering_tests/worked_example.py")], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("passed test_") == 3, run.stdout
