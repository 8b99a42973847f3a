"""Kernel-level ops in a compiled graph: traced into it where their implementation allows (so Inductor launches the
kernels itself), one opaque call where it does not (the Triton interpreter on CPU). See ops/library.py.

On CPU the reference implementation stands in for the GPU's Triton one: traced here as there (it is traced on GPUs
only, to spare the CPU tests Inductor's C++ compiles), the graphs and results show that the op's body (not a call
back into the op) is what runs."""

import dataclasses

import pytest
import torch
import torch.nn as nn
from functorch.compile import aot_function, make_boxed_func
from torch._inductor.utils import run_and_get_code

import turbo_inductor
from turbo_inductor.kernels import registry
from turbo_inductor.kernels.reference import traced_off_cpu
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.compare import assert_matches_inductor, default_counts

pytestmark = pytest.mark.skipif(DEVICE != "cpu", reason="the GPU traces its Triton kernels: system/test_gpu.py")

REFERENCE = "reference"


@pytest.fixture(autouse=True)
def traced_reference(monkeypatch):
    """The reference implementations traced on GPUs traced on CPU too."""
    for kernel in registry.kernels():
        impls = registry._IMPLS[kernel]
        if REFERENCE in impls and impls[REFERENCE].traceable is traced_off_cpu:
            monkeypatch.setitem(impls, REFERENCE, dataclasses.replace(impls[REFERENCE], traceable=registry.always))
    registry._candidates.cache_clear()
    yield
    registry._candidates.cache_clear()


def _inputs(*shapes):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=gen).requires_grad_() for s in shapes]


# name -> (call taking impl, input shapes, the kernel-level ops it uses in forward and backward)
CASES = {
    "rmsnorm": (
        lambda impl: lambda x, w: turbo_inductor.ops.rmsnorm(x, w, eps=1e-6, impl=impl),
        [(6, 40), (40,)],
        {"rmsnorm_fwd", "rmsnorm_bwd"},
    ),
    "rmsnorm_residual": (
        lambda impl: lambda x, r, w: turbo_inductor.ops.rmsnorm_residual(x, r, w, 1e-6, impl=impl),
        [(6, 40), (6, 40), (40,)],
        {"rmsnorm_residual_fwd", "rmsnorm_bwd"},
    ),
    "swiglu": (
        lambda impl: lambda g, u: turbo_inductor.ops.swiglu(g, u, impl=impl),
        [(6, 40), (6, 40)],
        {"glu", "glu_bwd"},
    ),
    "glu_fused": (
        lambda impl: lambda x: turbo_inductor.ops.glu_fused(x, impl=impl),
        [(6, 80)],
        {"glu_fused", "glu_fused_bwd"},
    ),
}
FP8_LINEAR = (lambda x, w: turbo_inductor.ops.fp8_linear(x, w, None, "rowwise", impl=REFERENCE), [(6, 32), (16, 32)])


def _aot_graph_ops(fn, inputs):
    """Run fn forward and backward through AOTAutograd; the ops of its forward and backward graphs, and the
    results."""
    graphs = []

    def keep(gm, _):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    out = _as_tuple(aot_function(fn, fw_compiler=keep, bw_compiler=keep)(*inputs))
    torch.autograd.backward(out, [torch.ones_like(o) for o in out])
    ops = [{str(n.target) for n in g.graph.nodes if n.op == "call_function"} for g in graphs]
    return ops, [o.detach() for o in out], [t.grad for t in inputs]


def _as_tuple(out):
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _ours(ops):
    return {op.split(".")[1] for op in ops if op.startswith("turbo_inductor.")}


@pytest.mark.parametrize("case", sorted(CASES))
def test_traceable_implementation_is_traced_into_forward_and_backward(case):
    call, shapes, _ = CASES[case]
    ops, out, grads = _aot_graph_ops(call(REFERENCE), _inputs(*shapes))
    assert len(ops) == 2
    assert _ours(ops[0]) == set() and _ours(ops[1]) == set(), ops
    assert any(op.startswith("aten.") for op in ops[0]) and any(op.startswith("aten.") for op in ops[1])
    # the traced body computes what an eager call of the op computes
    inputs = _inputs(*shapes)
    eager = _as_tuple(call(REFERENCE)(*inputs))
    torch.autograd.backward(eager, [torch.ones_like(o) for o in eager])
    for got, want in zip(out + grads, [e.detach() for e in eager] + [t.grad for t in inputs]):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("case", sorted(CASES))
def test_interpreted_triton_stays_one_call_forward_and_backward(case):
    call, shapes, expected = CASES[case]
    ops, _, _ = _aot_graph_ops(call("triton"), _inputs(*shapes))
    assert _ours(ops[0]) | _ours(ops[1]) == expected
    assert [len(_ours(g)) for g in ops] == [1, 1]


def test_op_with_an_untraceable_kernel_stays_one_call():
    """The emulated FP8 GEMM (reference) does not trace: fp8_linear, which uses it, stays one call, though its
    quantization (reference) could."""
    fn, shapes = FP8_LINEAR
    ops, _, _ = _aot_graph_ops(fn, _inputs(*shapes))
    assert [_ours(g) for g in ops] == [{"fp8_linear_fwd"}, {"fp8_linear_bwd"}]


def test_fp8_linear_without_gradients_runs_the_forward_alone():
    """Where no gradient is wanted, fp8_linear decomposes to fp8_linear_inference, which writes no transposed
    operands for a backward; with gradients, to fp8_linear_fwd (which does, for tensorwise) and fp8_linear_bwd."""

    def linear(x, w):
        return turbo_inductor.ops.fp8_linear(x, w, None, "tensorwise", impl=REFERENCE)

    graphs = []

    def keep(gm, _):
        graphs.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return make_boxed_func(gm.forward)

    x, w = _inputs((6, 32), (16, 32))
    aot_function(linear, fw_compiler=keep)(x.detach(), w.detach())
    assert [_ours(g) for g in graphs] == [{"fp8_linear_inference"}]
    ops, _, _ = _aot_graph_ops(linear, [x, w])
    assert [_ours(g) for g in ops] == [{"fp8_linear_fwd"}, {"fp8_linear_bwd"}]


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.RMSNorm(32, eps=1e-6)
        self.gate, self.up = nn.Linear(32, 48, bias=False), nn.Linear(32, 48, bias=False)

    def forward(self, x):
        h = self.norm(x)
        return nn.functional.silu(self.gate(h)) * self.up(h)


@pytest.mark.parametrize("impl, calls_back", [(REFERENCE, False), ("triton", True)])
def test_compiled_code_calls_back_into_ops_only_where_they_cannot_be_traced(impl, calls_back):
    model = _Block()
    x = torch.randn(4, 8, 32, requires_grad=True)
    compiled = torch.compile(model, backend="primus_turbo", options={"impl": impl})
    _, codes = run_and_get_code(lambda: compiled(x).square().sum().backward())
    code = "\n".join(codes)
    assert turbo_inductor.rewrite_counts() == default_counts(rmsnorm=1, glu=1)
    assert ("turbo_inductor.rmsnorm_fwd" in code) == calls_back
    assert ("turbo_inductor.rmsnorm_bwd" in code) == calls_back
    assert ("turbo_inductor.glu_bwd" in code) == calls_back
    assert_matches_inductor(model, [x], options={"impl": impl})
