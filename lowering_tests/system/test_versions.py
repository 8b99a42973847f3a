"""What the tests run on: requirements.txt pins every package they import, and the versions a bug report
(``python -m turbo_inductor.info``) names."""

import ast
import importlib.metadata
import pathlib
import sys

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from turbo_inductor import info
from turbo_inductor.testing import hide_package

REPO = pathlib.Path(__file__).resolve().parents[2]
# Where the tests' imports are: the tests, the test helpers in the package, and the benchmarks the tests run.
IMPORTING = [REPO / "lowering_tests", REPO / "turbo_inductor" / "testing", REPO / "benchmarks"]


def pins() -> dict[str, Requirement]:
    lines = (line.split("#")[0].strip() for line in (REPO / "requirements.txt").read_text().splitlines())
    return {canonicalize_name(r.name): r for r in map(Requirement, filter(None, lines))}


def imported_modules() -> set[str]:
    """The top-level modules the tests import, ``pytest.importorskip`` included."""
    modules = set()
    for folder in IMPORTING:
        for path in folder.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    modules.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules.add(node.module.split(".")[0])
                elif (
                    isinstance(node, ast.Call)
                    and getattr(node.func, "attr", None) == "importorskip"
                    and isinstance(node.args[0], ast.Constant)
                ):
                    modules.add(node.args[0].value.split(".")[0])
    return modules


def test_requirements_pin_every_package_the_tests_import_exactly():
    """A new release reaches CI only through requirements.txt: each distribution the tests import is pinned with
    ==, and so is every other line."""
    pinned = pins()
    assert all(len(r.specifier) == 1 and next(iter(r.specifier)).operator == "==" for r in pinned.values()), [
        str(r) for r in pinned.values() if [s.operator for s in r.specifier] != ["=="]
    ]
    # our modules: the package, the harness, the tests (the fuzzer's package among them) and the root's (conftest)
    ours = {"turbo_inductor", "benchmarks", "lowering_tests", *(path.stem for path in REPO.glob("*.py"))}
    distributions = importlib.metadata.packages_distributions()
    third_party = imported_modules() - ours - set(sys.stdlib_module_names) - {"__future__"}
    unknown = sorted(module for module in third_party if module not in distributions)
    assert not unknown, f"imported, but from no installed distribution: {unknown}"
    needed = {canonicalize_name(d) for module in third_party for d in distributions[module]}
    assert needed >= {"torch", "triton", "pytest", "transformers", "torchao", "liger-kernel", "matplotlib"}
    assert not needed - set(pinned), f"imported by the tests, not pinned: {sorted(needed - set(pinned))}"


def test_info_names_the_versions_of_torch_triton_transformers_and_torchao(monkeypatch):
    facts = info.report()
    assert facts["transformers"] == importlib.metadata.version("transformers")
    assert facts["torchao"] == importlib.metadata.version("torchao")
    first_line = info.format_report(facts).splitlines()[0]
    assert f"torch {facts['torch']}, triton {facts['triton']}, transformers {facts['transformers']}, " in first_line
    assert f", torchao {facts['torchao']}, " in first_line
    hide_package(monkeypatch, "torchao")
    assert info.report()["torchao"] == "not installed"
