"""One JSON file per benchmark run, named by benchmark and configuration: its configuration, rows and environment.
It lands in ``--out``, else ``$OUT``, else ``benchmarks/out/`` (ignored by git); NaN and infinities are written as
null."""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
import pathlib
import platform
import re
import sys

from benchmarks import STARTED_WITH

DEFAULT_OUT = pathlib.Path(__file__).resolve().parent / "out"
MAX_NAME = 120  # characters of a file name before its tail is replaced by a hash
# The distributions whose versions a run records beside torch's and Triton's: transformers, and the main job's peers.
PACKAGES = ("transformers", "torchao", "liger-kernel")


def output_dir(out: str | None = None) -> pathlib.Path:
    """``out`` if given, else ``$OUT``, else ``benchmarks/out/``; created if missing."""
    path = pathlib.Path(out or os.environ.get("OUT") or DEFAULT_OUT)
    path.mkdir(parents=True, exist_ok=True)
    return path


def environment() -> dict:
    """Where and how this run was made: GPUs (or "cpu"), versions (of transformers and the peers torchao and
    Liger-Kernel: null where not installed), the UTC date, the process's command line and the turbo_inductor and
    Inductor variables it started with."""
    import torch
    import triton

    from turbo_inductor.environment import installed_version
    from turbo_inductor.kernels import native

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {
        "machine": f"{gpus}x {torch.cuda.get_device_name()}" if gpus else "cpu",
        "torch": torch.__version__,
        "triton": triton.__version__,
        # transformers' version sets the graphs its models give (the causal-mask rewrite, and so the speed, depends
        # on it), a peer's its columns' kernels; null where not installed
        **{name: installed_version(name) for name in PACKAGES},
        # TURBO_INDUCTOR_NATIVE=1 asks for the native kernels' build, which can fail: whether they ran
        "native kernels": native.load_error() is None,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": list(sys.orig_argv),
        "variables": dict(STARTED_WITH),
    }


def json_safe(value):
    """``value`` with NaN and infinities as None, tuples as lists, and anything else JSON lacks as its str()."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)


def slug(value) -> str:
    """``value`` as a file-name part: lists joined by "-", every other run of odd characters as one "-" (the file
    names travel through tools that take letters, digits, ".", "_" and "-" only)."""
    if isinstance(value, (list, tuple)):
        return "-".join(slug(item) for item in value)
    return re.sub(r"[^A-Za-z0-9.]+", "-", str(value)).strip("-")


def changed_options(parser, args, ignore=()) -> list[str]:
    """``name-value`` (``name`` for a flag) per option whose value differs from the parser's default."""
    defaults = vars(parser.parse_args([]))
    return [
        slug(name) if value is True else f"{slug(name)}-{slug(value) or 'none'}"
        for name, value in vars(args).items()
        if name not in ignore and value != defaults[name]
    ]


def file_name(benchmark: str, parts) -> str:
    """``<benchmark>_<part>_..._<part>.json`` (empty parts left out); a hash stands in for the tail of a long one."""
    stem = "_".join([benchmark, *(part for part in map(slug, parts) if part)])
    if len(stem) > MAX_NAME:
        stem = f"{stem[: MAX_NAME - 9]}-{hashlib.sha1(stem.encode()).hexdigest()[:8]}"
    return stem + ".json"


def write(
    benchmark: str, parts, configuration: dict, rows: list[dict], out: str | None = None, quiet: bool = False, **extra
) -> str:
    """Writes ``{benchmark, configuration, rows, **extra, environment}`` as JSON and returns its path (printed unless
    ``quiet``). A file of the same name from another configuration is an error, never overwritten."""
    path = output_dir(out) / file_name(benchmark, parts)
    result = json_safe(
        {"benchmark": benchmark, "configuration": configuration, "rows": rows, **extra, "environment": environment()}
    )
    if path.exists():
        earlier = json.loads(path.read_text()).get("configuration")
        if earlier != result["configuration"]:
            raise FileExistsError(
                f"{path} holds another configuration of {benchmark} ({earlier}): move it away or name this run apart"
            )
    path.write_text(json.dumps(result, indent=1, allow_nan=False) + "\n")
    if not quiet:
        print(f"wrote {path}")
    return str(path)
