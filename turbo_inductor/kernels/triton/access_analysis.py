"""torch's analysis of what a traced Triton launch writes, answered once per distinct launch.

torch makes each traced launch's TTIR to find the tensors it writes: as AOTAutograd functionalizes the graph, and again
as Inductor lowers it. Making the TTIR costs about 20 ms a launch on a host CPU (``python -m
turbo_inductor.testing.hopper``), and a training graph repeats each launch in every layer and in forward and backward.
The answer depends only on what torch hands Triton to make the TTIR (``generate_ttir``): the kernel, its tensors'
dtypes, its constexprs' values, and of its other scalars only what Triton specializes on: an int's type (i32 or
wider), whether it is 1 (made a constant) and whether 16 divides it; a float's type. A symbolic size is handed as 2.
:func:`install` keys the answers by exactly that, so the launches of one kernel at every layer's sizes share one
analysis. Where torch makes every scalar a constant of the TTIR (torch 2.11; newer torch only constexprs), a scalar
counts by its value. A launch with a real tensor or a TMA descriptor is analyzed every time.

Keyed by value, every layer's sizes make another TTIR there, so our kernels say what they write (:func:`writes`) and
torch 2.11 takes that answer, making no TTIR. Newer torch wants more than the written tensors (what each launch reads,
whether an epilogue can fuse): it still analyzes, once per specialization. ``testing/hopper.py`` checks each
declaration against torch's analysis at every launch it compiles.
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch

# The analysis by its name in torch: identify_mutated_tensors, renamed identify_accessed_tensors in newer torch.
_NAMES = ("identify_accessed_tensors", "identify_mutated_tensors")
# torch 2.11's analysis, which answers with the names of the tensors a launch writes.
_ANSWERING_WITH_NAMES = "identify_mutated_tensors"
_COUNTS = {"answered": 0, "analyzed": 0, "declared": 0}
_DECLARED = "declared_writes"


def writes(*names: str, **conditional: Callable[[dict], bool]) -> Callable:
    """Decorator of a ``@triton.jit`` kernel: the tensor arguments its launches write. ``names`` always; each keyword
    where its predicate holds of the launch's arguments by name (``Q=lambda a: a["QUANT_BLOCK"] > 0``), as the
    kernel's own branches on constexprs decide."""

    def declare(kernel):
        unknown = sorted((set(names) | set(conditional)) - set(kernel.arg_names))
        if unknown:  # a misspelt name would silently drop a write
            raise TypeError(f"turbo_inductor: {kernel.fn.__name__} has no arguments {unknown} to declare written")
        setattr(kernel, _DECLARED, (names, conditional))
        return kernel

    return declare


def declared(kernel: Any, arguments: dict[str, Any]) -> list[str] | None:
    """The tensor arguments of this launch that ``kernel`` declares it writes, in the launch's order; None where it
    declares nothing."""
    while not hasattr(kernel, _DECLARED) and hasattr(kernel, "fn"):
        kernel = kernel.fn
    if not hasattr(kernel, _DECLARED):
        return None
    names, conditional = getattr(kernel, _DECLARED)
    try:
        return [
            name
            for name, value in arguments.items()
            if (isinstance(value, torch.Tensor) or _is_inductor_tensor(value))
            and (name in names or (name in conditional and conditional[name](arguments)))
        ]
    except KeyError:  # a constexpr the predicate reads was not handed over (a default): torch's analysis answers
        return None


def _int_key(value: int) -> tuple:
    """What Triton's specialization (``native_specialize_impl``) sees of a non-constexpr int."""
    if value == 1:
        return ("int", 1)
    width = "i32" if -(2**31) <= value < 2**31 else "i64" if -(2**63) <= value < 2**63 else "u64"
    return ("int", width, value % 16 == 0)


# torch hands Triton a symbolic size as this int (generate_ttir).
SYMBOLIC_SIZE = 2


@functools.cache
def scalars_are_constants() -> bool:
    """Whether this torch's ``generate_ttir`` makes every non-tensor argument a constant of the TTIR, its value then
    part of the launch (torch 2.11). Newer torch makes constants of constexprs only (its ``_is_constexpr_or_none``).
    Where the source cannot be read, by value: never a wrong answer, only fewer shared ones."""
    from torch._higher_order_ops import triton_kernel_wrap

    try:
        source = inspect.getsource(triton_kernel_wrap.generate_ttir)
    except (OSError, TypeError):
        return True
    return "_is_constexpr_or_none" not in source


def _scalar_key(value: int | float) -> tuple:
    """What the TTIR sees of a non-constexpr int or float."""
    if scalars_are_constants():
        return (type(value).__name__, value)
    return _int_key(value) if type(value) is int else ("float",)


def _argument_key(value: Any, constexpr: bool) -> tuple | None:
    """What the TTIR sees of one argument (``constexpr``: one of the kernel's constexprs), or None where that is not
    known without analyzing it."""
    import sympy
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool, sympy.Expr)):
        return _scalar_key(SYMBOLIC_SIZE)
    if isinstance(value, FakeTensor) or _is_inductor_tensor(value):
        return ("tensor", value.dtype)
    if not constexpr and type(value) in (int, float):
        return _scalar_key(value)
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype)):
        return (type(value).__name__, value)
    return None  # a real tensor (its alignment is specialized on), a descriptor, a tuple


def _is_inductor_tensor(value: Any) -> bool:
    from torch._inductor.ir import TensorBox

    return isinstance(value, TensorBox)


def _constexpr_names(kernel: Any) -> frozenset[str] | None:
    """The kernel's constexpr parameters (an autotuner's or heuristics' wrapped JITFunction's); None where unknown:
    then every argument counts by its value."""
    while not hasattr(kernel, "params") and hasattr(kernel, "fn"):
        kernel = kernel.fn
    params = getattr(kernel, "params", None)
    if params is None:
        return None
    return frozenset(p.name for p in params if p.is_constexpr)


def _launch_key(kernel: Any, kwargs: dict[str, Any], tma_descriptor_metadata: dict) -> tuple | None:
    if tma_descriptor_metadata:
        return None
    constexprs = _constexpr_names(kernel)
    parts = []
    for name in sorted(kwargs):
        part = _argument_key(kwargs[name], constexprs is None or name in constexprs)
        if part is None:
            return None
        parts.append((name, *part))
    return tuple(parts)


def remembered(analysis: Callable, take_declared: bool = False) -> Callable:
    """``analysis(kernel, kwargs, tma_descriptor_metadata)``, each distinct launch analyzed once; a copy of the
    answer each time, since Inductor keeps what it gets. ``take_declared``: the analysis answers with the written
    tensors' names (torch 2.11), and a kernel's declaration (:func:`writes`) answers for it."""
    answers: dict[int, tuple[Any, dict[tuple, Any]]] = {}  # id(kernel) -> (kernel, kept alive; answers by launch)

    @functools.wraps(analysis)
    def analyze(kernel, kwargs, tma_descriptor_metadata, *args, **rest):
        if take_declared and not (tma_descriptor_metadata or args or rest):
            names = declared(kernel, kwargs)
            if names is not None:
                _COUNTS["declared"] += 1
                return names
        key = None if args or rest else _launch_key(kernel, kwargs, tma_descriptor_metadata)
        if key is None:
            return analysis(kernel, kwargs, tma_descriptor_metadata, *args, **rest)
        by_launch = answers.setdefault(id(kernel), (kernel, {}))[1]
        if key in by_launch:
            _COUNTS["answered"] += 1
        else:
            _COUNTS["analyzed"] += 1
            by_launch[key] = analysis(kernel, kwargs, tma_descriptor_metadata)
        return copy.deepcopy(by_launch[key])

    analyze.remembers = True
    return analyze


def install() -> None:
    """Puts :func:`remembered` in front of torch's analysis, once per process. Every caller looks it up by name in
    torch's module at call time, so each traced launch of any kernel goes through it."""
    from torch._higher_order_ops import triton_kernel_wrap

    name = analysis_name()
    if name is not None and not getattr(getattr(triton_kernel_wrap, name), "remembers", False):
        setattr(triton_kernel_wrap, name, remembered(getattr(triton_kernel_wrap, name), name == _ANSWERING_WITH_NAMES))


def analysis_name() -> str | None:
    """The name of torch's analysis in ``torch._higher_order_ops.triton_kernel_wrap``; None in a torch without
    either (then nothing is remembered)."""
    from torch._higher_order_ops import triton_kernel_wrap

    return next((name for name in _NAMES if hasattr(triton_kernel_wrap, name)), None)


def counts() -> dict[str, int]:
    """Launches answered from memory, analyzed, and answered by their kernel's declaration, in this process."""
    return dict(_COUNTS)
