"""torch's analysis of what a traced Triton launch writes, answered once per distinct launch
(``kernels/triton/access_analysis.py``). The analysis is torch's own, made for sm_90 without a GPU."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from turbo_inductor.kernels.triton import access_analysis

triton = pytest.importorskip("triton")
tl = triton.language
triton_kernel_wrap = pytest.importorskip("torch._higher_order_ops.triton_kernel_wrap")
ANALYSIS = access_analysis.analysis_name()
if ANALYSIS is None:
    pytest.skip("this torch names no analysis of Triton launches", allow_module_level=True)


def _scale(x_ptr, y_ptr, n, factor, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * factor, mask=mask)


def _written(answer) -> list[str]:
    writes = answer if isinstance(answer, list) else [dep.name for dep in answer.read_writes.writes]
    return sorted(writes)


def each_distinct_launch_analyzed_once() -> None:
    """A launch differing only in sizes (symbolic or not, as torch hands them) or a float's value is answered from
    memory, where Triton specializes the sizes alike (the int's type, whether it is 1, whether 16 divides it) and
    torch makes constants of constexprs only; where torch makes every scalar a constant, only a launch with the same
    values is. A dtype or a constexpr makes another launch; a real tensor is analyzed every time (Triton specializes
    on its alignment). Each answer equals torch's own, and is a copy: Inductor keeps what it gets.
    Triton's compiler aims at sm_90, as on the GPU machine, and the kernel is jitted for real: in a process that
    never ran the interpreter, which patches ``triton.language`` as it runs."""
    from triton.runtime.driver import driver

    from turbo_inductor.testing.hopper import _OfflineDriver

    driver.set_active(_OfflineDriver())
    kernel, torchs = triton.runtime.jit.JITFunction(_scale), getattr(triton_kernel_wrap, ANALYSIS)
    made, generate = [], triton_kernel_wrap.generate_ttir
    triton_kernel_wrap.generate_ttir = lambda *args: made.append(args[0]) or generate(*args)
    analyze = access_analysis.remembered(torchs)
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        n, m = mode.shape_env.create_unbacked_symint(), mode.shape_env.create_unbacked_symint()
        bf16, fp32 = torch.empty(64, dtype=torch.bfloat16), torch.empty(64, dtype=torch.float32)
        other_size = torch.empty(96, dtype=torch.bfloat16)
    first = {"x_ptr": bf16, "y_ptr": bf16, "n": n, "factor": 2.0, "BLOCK": 64}
    # (launch, analyzed where keyed by specialization, analyzed where keyed by value)
    launches = [
        (first, True, True),
        ({**first, "x_ptr": other_size, "y_ptr": other_size, "n": m}, False, False),  # other sizes: the same TTIR
        ({**first, "n": 4097}, False, True),  # as torch hands a symbolic size: 2, an i32 that 16 does not divide
        ({**first, "n": 4096}, True, True),
        ({**first, "n": 14336}, False, True),
        ({**first, "n": 1}, True, True),
        ({**first, "n": 2**31}, True, True),
        ({**first, "x_ptr": fp32}, True, True),
        ({**first, "factor": 3.0}, False, True),
        ({**first, "BLOCK": 128}, True, True),
        ({**first, "BLOCK": 128}, False, False),
    ]
    by_value = access_analysis.scalars_are_constants()
    expected = [by_value_analyzed if by_value else analyzed for _, analyzed, by_value_analyzed in launches]
    before = access_analysis.counts()
    ttir_by_key = {}
    for (kwargs, *_), analyzed in zip(launches, expected):
        made.clear()
        answer = analyze(kernel, kwargs, {})
        assert len(made) == analyzed, kwargs
        # The key is exact: launches answered alike are one TTIR.
        ttir = str(generate(kernel, kwargs, {})[0])
        assert ttir_by_key.setdefault(access_analysis._launch_key(kernel, kwargs, {}), ttir) == ttir, kwargs
        assert _written(answer) == _written(torchs(kernel, kwargs, {})) == ["y_ptr"], kwargs
        answer.clear() if isinstance(answer, list) else answer.read_writes.writes.clear()
    after = access_analysis.counts()
    counted = (after["analyzed"] - before["analyzed"], after["answered"] - before["answered"])
    assert counted == (sum(expected), len(expected) - sum(expected))
    real = {**first, "x_ptr": torch.randn(64), "y_ptr": torch.randn(64), "n": 64}
    for _ in range(2):
        made.clear()
        assert _written(analyze(kernel, real, {})) == ["y_ptr"] and len(made) == 1
    triton_kernel_wrap.generate_ttir = generate


def test_each_distinct_launch_is_analyzed_once_and_answers_as_torch_does():
    """:func:`each_distinct_launch_analyzed_once`, in a process without ``TRITON_INTERPRET``: keyed as this torch
    makes the TTIR, then by value (exact under every torch)."""
    if importlib.util.find_spec("triton.backends.nvidia") is None:
        pytest.skip("this Triton has no NVIDIA backend to compile for sm_90")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = pathlib.Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", __name__], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]


def test_launches_with_tensor_descriptors_are_analyzed_every_time_and_install_wraps_once(monkeypatch):
    """TMA descriptor metadata changes the TTIR's arguments: never answered from memory. install() puts the memory in
    front of torch's analysis under its own name, once, however often a launch is traced."""
    calls = []

    def torchs(kernel, kwargs, tma_descriptor_metadata):
        calls.append(kernel)
        return ["y_ptr"]

    monkeypatch.setattr(triton_kernel_wrap, ANALYSIS, torchs)
    access_analysis.install()
    access_analysis.install()
    analyze = getattr(triton_kernel_wrap, ANALYSIS)
    assert analyze is not torchs and analyze.__wrapped__ is torchs
    kernel, kwargs = object(), {"x_ptr": None, "BLOCK": 64}
    for _ in range(2):
        assert analyze(kernel, kwargs, {"x_ptr": ("stable", ([64, 64],))}) == ["y_ptr"]
    assert analyze(kernel, kwargs, {}) == analyze(kernel, kwargs, {}) == ["y_ptr"]
    assert calls == [kernel] * 3


class _Kernel:
    """Stands for a jitted kernel: the declaration is an attribute of it."""

    arg_names = ["x_ptr", "y_ptr", "z_ptr", "n", "HAS_Z"]
    fn = _scale


def test_a_kernels_declaration_answers_for_it_where_torch_wants_the_written_names():
    """torch 2.11's analysis answers with the written tensors' names: a kernel declaring its writes is answered from
    the declaration (its conditional names as its constexprs say), with no TTIR. Newer torch's analysis wants more, a
    launch with a TMA descriptor passes them apart, and a kernel declaring nothing is analyzed: those go to torch."""
    calls = []

    def torchs(kernel, kwargs, tma_descriptor_metadata):
        calls.append(kernel)
        return ["y_ptr"]

    declaring = access_analysis.writes("y_ptr", z_ptr=lambda a: a["HAS_Z"])(_Kernel())
    t = torch.empty(4)
    launch = {"x_ptr": t, "y_ptr": t, "z_ptr": t, "n": 4, "HAS_Z": False}
    analyze = access_analysis.remembered(torchs, take_declared=True)
    before = access_analysis.counts()["declared"]
    assert analyze(declaring, launch, {}) == ["y_ptr"]
    assert analyze(declaring, {**launch, "HAS_Z": True}, {}) == ["y_ptr", "z_ptr"]
    assert analyze(declaring, {**launch, "HAS_Z": True, "z_ptr": None}, {}) == ["y_ptr"]  # a pointer not passed
    assert calls == [] and access_analysis.counts()["declared"] == before + 3
    undeclared = _Kernel()
    analyze(declaring, launch, {"y_ptr": ("stable", ([64],))})
    analyze(undeclared, launch, {})
    access_analysis.remembered(torchs)(declaring, launch, {})
    analyze(declaring, {k: v for k, v in launch.items() if k != "HAS_Z"}, {})  # a predicate without its constexpr
    assert calls == [declaring, undeclared, declaring, declaring]
    with pytest.raises(TypeError, match=r"_scale has no arguments \['w_ptr'\] to declare written"):
        access_analysis.writes("y_ptr", w_ptr=lambda a: True)(_Kernel())


def test_install_answers_from_declarations_where_torch_wants_the_written_names(monkeypatch):
    """Under torch 2.11's analysis (``identify_mutated_tensors``, emulated here on any torch), our kernels' launches
    are answered from their declarations, with no TTIR; a kernel declaring nothing still goes to torch."""
    calls = []

    def torchs(kernel, kwargs, tma_descriptor_metadata):
        calls.append(kernel)
        return ["y_ptr"]

    monkeypatch.delattr(triton_kernel_wrap, "identify_accessed_tensors", raising=False)
    monkeypatch.setattr(triton_kernel_wrap, "identify_mutated_tensors", torchs, raising=False)
    access_analysis.install()
    analyze = triton_kernel_wrap.identify_mutated_tensors
    from turbo_inductor.kernels.triton.rotary import _rotary_kernel

    t = torch.empty(4)
    assert analyze(_rotary_kernel, {"X": t, "OUT": t, "HALF": 64}, {}) == ["OUT"] and calls == []
    assert analyze(triton.runtime.jit.JITFunction(_scale), {"x_ptr": t, "y_ptr": t, "n": 4, "factor": 2.0}, {})
    assert len(calls) == 1


if __name__ == "__main__":
    each_distinct_launch_analyzed_once()
    access_analysis.scalars_are_constants = lambda: True
    each_distinct_launch_analyzed_once()
