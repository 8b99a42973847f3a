"""Run one model under backend="inductor" and backend="primus_turbo" on the same inputs; compare everything."""

from __future__ import annotations

import collections
import copy

import torch
from torch._inductor.compile_fx import _recursive_pre_grad_passes
from torch.utils._python_dispatch import TorchDispatchMode

import turbo_inductor
from turbo_inductor.kernels.reference.fp8_quant import FP8_DTYPES
from turbo_inductor.options import Options
from turbo_inductor.passes import PASSES, PassManager
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.tolerance import TOLERANCE


def _tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    if hasattr(out, "to_tuple"):  # Hugging Face ModelOutput
        return _tensors(out.to_tuple())
    return []


def run(model, inputs, backend, train=True, options=None, dynamic=None, cotangent_dtype=None):
    """Outputs and gradients (inputs first, then parameters) of ``model`` compiled with ``backend``. The output
    cotangents are fixed random values, rounded to ``cotangent_dtype`` first when given (a float64 run then sees
    the values a low-precision run does)."""
    torch._dynamo.reset()
    model = copy.deepcopy(model)
    inputs = [t.detach().clone().requires_grad_(train and t.is_floating_point()) for t in inputs]
    compiled = torch.compile(model, backend=backend, options=options, dynamic=dynamic)
    with torch.set_grad_enabled(train):
        outs = _tensors(compiled(*inputs))
    grads = []
    if train:
        gen = torch.Generator().manual_seed(1)
        cotangents = [
            torch.randn(o.shape, generator=gen).to(cotangent_dtype or o.dtype).to(o.device, o.dtype) for o in outs
        ]
        torch.autograd.backward(outs, cotangents)
        grads = [t.grad for t in inputs if t.requires_grad] + [p.grad for p in model.parameters()]
    return [o.detach() for o in outs], grads


def assert_matches_inductor(
    model, inputs, train=True, options=None, dynamic=None, precision=None, static_inductor=False
):
    """Compile with both backends; assert equal outputs and gradients; return primus_turbo's rewrite counts.

    ``precision``: the dtype whose gate applies, when results carry less precision than their dtype says.
    ``static_inductor``: Inductor compiles without ``dynamic``, the same math (a graph other tests compile too)."""
    expected = run(model, inputs, "inductor", train, dynamic=None if static_inductor else dynamic)
    turbo_inductor.reset_records()
    turbo_inductor.reset_kernel_calls()
    actual = run(model, inputs, "primus_turbo", train, options=options, dynamic=dynamic)
    for kind, got, want in (("output", actual[0], expected[0]), ("gradient", actual[1], expected[1])):
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            if w is None:
                assert g is None, f"{kind} {i}: inductor has none"
                continue
            # two low-precision results, each within the gate of the truth, are within twice the gate of each other
            dtype = precision or w.dtype
            tol = TOLERANCE[dtype] * (2 if dtype in (torch.bfloat16, torch.float16) else 1)
            # gradients of weights are sums over rows: compare at the scale of the tensor
            atol = tol * max(1.0, w.abs().max().item()) if kind == "gradient" else tol
            torch.testing.assert_close(
                g.double(), w.double(), rtol=tol, atol=atol, equal_nan=True, msg=lambda m: f"{kind} {i}: {m}"
            )
    return collections.Counter(turbo_inductor.rewrite_counts())


def rewrites_without_compiling(model, inputs, train=True, options=None, dynamic=None) -> dict[str, int]:
    """The rewrite counts of our passes, run strict (a pass that raises fails) in the pre-grad slot where the
    backend runs them, on each graph Dynamo captures (with ``dynamic`` as torch.compile takes it); nothing is
    compiled. The records are kept."""
    graphs = []

    def capture(gm, example_inputs):
        graphs.append((gm, example_inputs))
        return gm.forward

    torch._dynamo.reset()
    turbo_inductor.reset_records()
    inputs = [t.detach().clone().requires_grad_(train and t.is_floating_point()) for t in inputs]
    with torch.set_grad_enabled(train):
        torch.compile(model, backend=capture, dynamic=dynamic)(*inputs)
    parsed = Options.parse({"strict": True, **(options or {})}, PASSES)
    for gm, example_inputs in graphs:
        with torch._inductor.config.patch(pre_grad_custom_pass=PassManager(PASSES, parsed)):
            _recursive_pre_grad_passes(gm, example_inputs)
    assert graphs and len(turbo_inductor.compile_records()) == len(graphs), "the passes ran on every graph"
    return turbo_inductor.rewrite_counts()


def masked_attentions(model, inputs, train=True) -> int:
    """SDPA calls whose mask the graphs Dynamo captures of ``model(*inputs)`` compute themselves. For a causal mask
    these are the causal_mask pass's sites: transformers builds it in the graph under some versions of itself and of
    torch (5.17; 5.25 on torch < 2.14) and leaves it to SDPA's ``is_causal`` under others. Nothing is compiled."""
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    inputs = [t.detach().clone().requires_grad_(train and t.is_floating_point()) for t in inputs]
    with torch.set_grad_enabled(train):
        torch.compile(model, backend=capture)(*inputs)
    torch._dynamo.reset()
    sdpa = torch.nn.functional.scaled_dot_product_attention
    calls = (n for gm in graphs for n in gm.graph.nodes if n.op == "call_function" and n.target is sdpa)
    masks = (n.kwargs.get("attn_mask", n.args[3] if len(n.args) > 3 else None) for n in calls)
    return sum(isinstance(mask, torch.fx.Node) and mask.op != "placeholder" for mask in masks)


def rewritten(model, inputs, options=None):
    """(outputs of Dynamo's one graph of ``model`` run eagerly after our passes, strict; its compile record), in
    inference: a rewrite's wiring checked without Inductor, where its op's numerics are checked compiled."""

    def backend(gm, example_inputs):
        PassManager(PASSES, Options.parse({"strict": True, **(options or {})}, PASSES))(gm.graph)
        gm.recompile()
        return gm.forward

    torch._dynamo.reset()
    turbo_inductor.reset_records()
    with torch.no_grad():
        out = torch.compile(model, backend=backend, fullgraph=True)(*inputs)
    return out, turbo_inductor.compile_records()[-1]


def assert_left_alone(model, inputs, train=True, options=None) -> None:
    """Nothing to fuse: no rewrite, and each graph keeps the ops it had, so Inductor compiles what it compiles
    without us (nothing is compiled here)."""
    counts = rewrites_without_compiling(model, inputs, train, options)
    assert not any(counts.values()), counts
    for record in turbo_inductor.compile_records():
        assert record.ops_before == record.ops_after, "nothing to fuse: the graph reaches Inductor unchanged"


def assert_as_accurate_as_inductor(model, inputs, train=True, options=None):
    """For low precision, where two roundings of a long chain (several norms in a row) can drift apart by more
    than twice the gate while both are fine: primus_turbo's outputs and gradients must be no farther from the
    float64 truth (the model run eagerly in float64) than Inductor's, give or take the dtype's gate at the scale of
    the tensor. Returns primus_turbo's rewrite counts."""
    truth = run(
        copy.deepcopy(model).double(), [t.double() for t in inputs], "eager", train, cotangent_dtype=inputs[0].dtype
    )
    expected = run(model, inputs, "inductor", train)
    turbo_inductor.reset_records()
    actual = run(model, inputs, "primus_turbo", train, options=options)
    for kind, index in (("output", 0), ("gradient", 1)):
        assert len(actual[index]) == len(expected[index]) == len(truth[index]), f"{kind}s: as many as Inductor's"
        for i, (got, want, true) in enumerate(zip(actual[index], expected[index], truth[index])):
            if true is None:
                continue
            gate = TOLERANCE[want.dtype] * max(1.0, true.abs().max().item())
            ours, theirs = ((t.double() - true).abs().max().item() for t in (got, want))
            assert ours <= theirs + gate, f"{kind} {i}: {ours} from float64, inductor {theirs} (gate {gate})"
    return collections.Counter(turbo_inductor.rewrite_counts())


def default_counts(**nonzero: int) -> dict[str, int]:
    """The rewrite counts a compile with the default options reports (every pass that is on by default, in the
    order they run): 0, but for ``nonzero``'s."""
    names = [p.name for p in PASSES if p.enabled(p.parse_option(p.default))]
    assert set(nonzero) <= set(names), set(nonzero) - set(names)
    return {name: nonzero.get(name, 0) for name in names}


def declines(caplog, *passes: str) -> list[str]:
    """The lines ``passes.manager.declined`` logged for ``passes`` ("<pass> left <node> alone: <reason>"), in order:
    one per site a pass left alone."""
    lines = (record.getMessage().removeprefix("primus_turbo: ") for record in caplog.records)
    return [line for line in lines if line.split(" ", 1)[0] in passes and " alone: " in line]


def ops_after(op_name: str) -> int:
    return sum(r.ops_after[op_name] for r in turbo_inductor.compile_records())


def ops_before(op_name: str) -> int:
    return sum(r.ops_before[op_name] for r in turbo_inductor.compile_records())


def kernel_calls(kernel: str) -> int:
    return sum(n for (k, _impl), n in turbo_inductor.kernel_calls().items() if k == kernel)


def assert_ran(kernel: str, times: int) -> None:
    """``kernel`` ran ``times`` times since the last reset. On GPU a compiled graph traces our ops into itself
    (ops/library.py), and kernels are counted while compiling (an op once or twice), not per run: there only
    whether it ran is checked (system/test_gpu.py checks the compiled code)."""
    calls = kernel_calls(kernel)
    if DEVICE == "cpu":
        assert calls == times, f"{kernel} ran {calls} times, expected {times}"
    else:
        assert (calls > 0) == (times > 0), f"{kernel} ran {calls} times, expected {times}"


def frozen_and_not(model, x, recipe):
    """{freezing: (output, fp8_quantize calls of a second call, rewrite counts)} of ``model`` compiled for
    inference with ``options={"fp8": recipe}``, with and without Inductor's freezing (a global config: Dynamo
    reads it)."""
    results = {}
    for freezing in (False, True):
        torch._dynamo.reset()
        turbo_inductor.reset_records()
        compiled = torch.compile(model, backend="primus_turbo", options={"fp8": recipe})
        with torch.no_grad(), torch._inductor.config.patch(freezing=freezing):
            compiled(x)
            turbo_inductor.reset_kernel_calls()
            out = compiled(x)
        results[freezing] = out, kernel_calls("fp8_quantize"), turbo_inductor.rewrite_counts()
    return results


class _OpsRun(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        self.ops.append((func.overloadpacket.__name__, any(t.dtype in FP8_DTYPES for t in tensors)))
        return out


FILLS = ("zeros", "zeros_like", "new_zeros", "full", "full_like", "fill_", "zero_")


def ops_and_fp8_fills(fn) -> tuple[set[str], list[str]]:
    """(the ops ``fn()`` runs, those of them that fill an FP8 tensor): what eager autograd hands a backward for
    outputs that take no gradient, unless told not to materialize them."""
    with _OpsRun() as run:
        fn()
    return {name for name, _ in run.ops}, [name for name, fp8 in run.ops if fp8 and name in FILLS]
