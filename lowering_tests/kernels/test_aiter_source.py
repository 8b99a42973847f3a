"""The aiter adapters (turbo_inductor/kernels/aiter/) against the installed amd-aiter without importing it (its
import fails without ROCm): every call the adapters make into aiter against aiter's source, read with ``ast``; the
installed aiter is the pinned one; and nothing imports aiter until the registry asks for it on a ROCm GPU."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import pathlib
import re
import subprocess
import sys

from turbo_inductor.kernels import aiter as adapters
from turbo_inductor.testing.aiter import aiter_functions, aiter_root

REPO = pathlib.Path(__file__).resolve().parents[2]
ADAPTERS = REPO / "turbo_inductor" / "kernels" / "aiter"
# What the adapters call, by family module: the test fails if a call disappears unnoticed as well.
CALLED = {
    "rmsnorm": {"rmsnorm2d_fwd", "rmsnorm2d_fwd_with_add"},
    "fp8_quant": {"per_tensor_quant_hip", "per_token_quant_hip", "per_group_quant_hip"},
    "fp8_gemm": {"gemm_a8w8", "gemm_a8w8_blockscale"},
}


def adapter_calls(path: pathlib.Path) -> list[tuple[int, str, int, list[str]]]:
    """(line, function, positional arguments, keywords) of each ``aiter.<function>(...)`` call in an adapter."""
    calls = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "aiter"
        ):
            assert not any(isinstance(a, ast.Starred) for a in node.args), f"{path.name}:{node.lineno}: *args"
            assert all(k.arg for k in node.keywords), f"{path.name}:{node.lineno}: **kwargs"
            calls.append((node.lineno, node.func.attr, len(node.args), [k.arg for k in node.keywords]))
    return calls


def call_problems(definition: ast.FunctionDef, positional: int, keywords: list[str]) -> list[str]:
    """Why a call with ``positional`` arguments and ``keywords`` does not fit ``definition``'s parameters."""
    args = definition.args
    names = [a.arg for a in args.posonlyargs + args.args]
    required = names[: len(names) - len(args.defaults)]
    keyword_only = {a.arg: default for a, default in zip(args.kwonlyargs, args.kw_defaults)}
    problems = []
    if positional > len(names) and args.vararg is None:
        problems.append(f"{positional} positional arguments, it takes {len(names)}")
    given = set(names[:positional])
    for keyword in keywords:
        if keyword in given:
            problems.append(f"{keyword} given twice")
        elif keyword not in names and keyword not in keyword_only and args.kwarg is None:
            problems.append(f"no parameter {keyword!r} (it has {names + list(keyword_only)})")
        given.add(keyword)
    missing = [n for n in required if n not in given]
    missing += [n for n, default in keyword_only.items() if default is None and n not in given]
    if missing:
        problems.append(f"missing {missing}")
    return problems


def binding_problems(root: pathlib.Path, definition: ast.FunctionDef, keywords: list[str]) -> list[str]:
    """For aiter's stubs of compiled functions (``@compile_ops``): keywords the C++ binding (its pybind ``py::arg``
    names in csrc/include/rocm_ops.hpp) would not take, where arguments reach it as the call passed them."""
    decorators = [
        d for d in definition.decorator_list if isinstance(d, ast.Call) and ast.unparse(d.func) == "compile_ops"
    ]
    if not decorators or not keywords:
        return []
    name = next((ast.literal_eval(k.value) for k in decorators[0].keywords if k.arg == "fc_name"), definition.name)
    bindings = (root / "aiter_meta" / "csrc" / "include" / "rocm_ops.hpp").read_text()
    match = re.search(rf'm\.def\(\s*"{name}"\s*,(.*?)\);', bindings, re.DOTALL)
    if match is None:
        return [f"no binding {name!r} in rocm_ops.hpp"]
    names = re.findall(r'py::arg\("(\w+)"\)', match.group(1))
    return [f"binding {name} has no argument {k!r} ({names})" for k in keywords if k not in names]


def test_every_adapter_call_fits_the_installed_aiter():
    root = aiter_root()
    functions = aiter_functions(root)
    assert {"rmsnorm2d_fwd", "gemm_a8w8", "per_token_quant_hip"} <= set(functions)  # the reader finds aiter's API
    seen: dict[str, set[str]] = {}
    problems = []
    for path in sorted(ADAPTERS.glob("*.py")):
        for line, name, positional, keywords in adapter_calls(path):
            seen.setdefault(path.stem, set()).add(name)
            where = f"{path.name}:{line} aiter.{name}"
            if name not in functions:
                problems.append(f"{where}: aiter {importlib.metadata.version(adapters.PACKAGE)} has no such function")
                continue
            found = call_problems(functions[name], positional, keywords) + binding_problems(
                root, functions[name], keywords
            )
            problems += [f"{where}: {p}" for p in found]
    assert problems == []
    assert seen == CALLED


def test_the_signature_check_catches_a_renamed_or_inserted_parameter():
    renamed = ast.parse("def gemm_a8w8(XQ, WQ, x_scale, weight_scale, bias=None, dtype=None): ...").body[0]
    assert call_problems(renamed, 0, ["XQ", "WQ", "x_scale", "w_scale", "dtype"]) == [
        "no parameter 'w_scale' (it has ['XQ', 'WQ', 'x_scale', 'weight_scale', 'bias', 'dtype'])",
        "missing ['weight_scale']",
    ]
    required_added = ast.parse("def per_token_quant_hip(x, group, scale=None, quant_dtype=None): ...").body[0]
    assert call_problems(required_added, 1, ["quant_dtype"]) == ["missing ['group']"]
    assert call_problems(required_added, 5, []) == ["5 positional arguments, it takes 4"]


def test_the_installed_aiter_is_the_pinned_one_and_the_extra_admits_it():
    import runpy

    from packaging.requirements import Requirement

    aiter_root()
    lines = (line.split("#")[0].strip() for line in (REPO / "requirements.txt").read_text().splitlines())
    pins = [Requirement(line) for line in lines if line]
    (pinned,) = [r for r in pins if r.name == adapters.PACKAGE]
    installed = importlib.metadata.version(adapters.PACKAGE)
    assert pinned.specifier.contains(installed, prereleases=True), (installed, str(pinned))
    extras = runpy.run_path(str(REPO / "setup.py"), run_name="turbo_inductor_setup")["EXTRAS"]
    (extra,) = [Requirement(r) for r in extras["rocm"]]
    assert extra.name == adapters.PACKAGE and extra.specifier.contains(installed, prereleases=True)


def test_nothing_in_the_package_imports_aiter_by_name():
    for path in (REPO / "turbo_inductor").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                assert all(a.name.split(".")[0] != "aiter" for a in node.names), path
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                assert (node.module or "").split(".")[0] != "aiter", path


def test_import_compile_and_select_leave_aiter_unimported_and_its_import_fails_without_rocm():
    """In a fresh process with aiter installed: importing turbo_inductor, compiling a model, selecting kernels
    and the info report import no aiter; then aiter's own import, tried as on ROCm, fails with its real error."""
    aiter_root()
    code = (
        "import importlib.util, sys, torch, turbo_inductor\n"
        "from turbo_inductor.kernels import registry, aiter as adapters\n"
        "assert importlib.util.find_spec('aiter') is not None\n"
        "model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.RMSNorm(8))\n"
        "torch.compile(model, backend='primus_turbo')(torch.randn(2, 8))\n"
        "registry.select('fp8_gemm', torch.device('cpu'))\n"
        "registry.select('rmsnorm_fwd', torch.device('cpu'), 'autotune')\n"
        "from turbo_inductor import info\n"
        "info.main()\n"
        "assert 'aiter' not in sys.modules, 'aiter was imported'\n"
        "print('load_error:', adapters.load_error())\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "aiter: aiter runs on AMD GPUs (ROCm), not on cpu" in done.stdout
    assert re.search(r"load_error: import aiter failed: \w+: .+", done.stdout), done.stdout[-2000:]
