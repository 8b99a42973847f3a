"""The installed aiter's source, read without importing it (its import fails without ROCm): where it lies, and the
functions ``aiter.<name>`` names, as ``ast`` definitions."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import pathlib

import pytest

from turbo_inductor.kernels import aiter as adapters


def aiter_root() -> pathlib.Path:
    """The folder holding the installed ``aiter`` package (its metadata's files: no import)."""
    try:
        distribution = importlib.metadata.distribution(adapters.PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        message = f"{adapters.PACKAGE} is not installed: pip install -r requirements.txt"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return pathlib.Path(distribution.locate_file("aiter")).parent


def _bound_names(statement: ast.stmt) -> list[str]:
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [statement.name]
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        return [(alias.asname or alias.name).split(".")[0] for alias in statement.names if alias.name != "*"]
    if isinstance(statement, (ast.Assign, ast.AnnAssign)):
        targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
        return [t.id for t in targets if isinstance(t, ast.Name)]
    return []


def aiter_functions(root: pathlib.Path) -> dict[str, ast.FunctionDef]:
    """The functions ``aiter.<name>`` names: what aiter/__init__.py star-imports from its own modules (at any depth:
    later releases import inside a ``try``), in order; a later module's name wins, and a name a module binds to
    something else than a function is dropped."""
    functions: dict[str, ast.FunctionDef] = {}
    star_imports = [
        node
        for node in ast.walk(ast.parse((root / "aiter" / "__init__.py").read_text()))
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.names[0].name == "*"
    ]  # relative only: the prebuilt ``aiter_`` (compiled) is not source to read
    for statement in sorted(star_imports, key=lambda node: node.lineno):
        path = root / "aiter" / statement.module.replace(".", "/")
        path = path.with_suffix(".py") if path.with_suffix(".py").exists() else path / "__init__.py"
        for node in ast.parse(path.read_text()).body:
            for name in _bound_names(node):
                if name.startswith("_"):
                    continue
                if isinstance(node, ast.FunctionDef):
                    functions[name] = node
                else:
                    functions.pop(name, None)
    return functions
