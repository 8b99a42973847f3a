"""One Dynamo graph, without compiling: captured from a model, rewritten by every pass in strict mode, and run
eagerly forward and backward (the rewrite fuzzer's steps, which tests of single passes take too)."""

from __future__ import annotations

import collections

import torch
import torch.nn as nn

import turbo_inductor
from turbo_inductor.options import Options
from turbo_inductor.passes import PASSES, PassManager


def capture(model: nn.Module, x: torch.Tensor, train: bool, dynamic: bool) -> tuple[torch.fx.GraphModule, list]:
    """The one graph Dynamo captures of ``model(x)`` and its inputs (sizes, x, parameters); nothing is compiled.
    ``dynamic``: x's first size symbolic (where it is not 1)."""
    graphs = []

    def backend(gm, example_inputs):
        # a symbolic size's example is a SymInt: its value runs the graph
        graphs.append((gm, [int(v.node.hint) if isinstance(v, torch.SymInt) else v for v in example_inputs]))
        return gm.forward

    torch._dynamo.reset()
    # x requires grad in training: Dynamo inlines an autograd.Function none of whose inputs do.
    x = x.detach().requires_grad_(train)
    if dynamic and x.shape[0] > 1:
        torch._dynamo.mark_dynamic(x, 0)
    with torch.set_grad_enabled(train):
        torch.compile(model, backend=backend, fullgraph=True)(x)
    assert len(graphs) == 1
    return graphs[0]


def evaluate(
    gm: torch.fx.GraphModule, inputs: list, train: bool, cotangent_dtype: torch.dtype | None = None
) -> tuple[list, list, collections.Counter]:
    """(outputs, gradients of every input, kernels run by the backward) of ``gm`` run eagerly. The output
    cotangents are fixed random values, rounded to ``cotangent_dtype`` first when given (a float64 run then sees
    the values a low-precision run does)."""
    inputs = [
        t.detach().clone().requires_grad_(train and t.is_floating_point()) if isinstance(t, torch.Tensor) else t
        for t in inputs
    ]
    with torch.set_grad_enabled(train):
        outs = list(gm(*inputs))
    if not train:
        return [o.detach() for o in outs], [], collections.Counter()
    generator = torch.Generator().manual_seed(1)
    cotangents = [
        torch.randn(o.shape, generator=generator).to(cotangent_dtype or o.dtype).to(o.device, o.dtype) for o in outs
    ]
    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    before = collections.Counter(turbo_inductor.kernel_calls())
    grads = torch.autograd.grad(outs, leaves, cotangents, allow_unused=True)
    backward = collections.Counter(turbo_inductor.kernel_calls())
    backward.subtract(before)
    return [o.detach() for o in outs], list(grads), +backward


def rewrite(gm: torch.fx.GraphModule, options: dict):
    """Runs every pass on ``gm`` in strict mode (a failing pass raises); returns the compile record."""
    manager = PassManager(PASSES, Options.parse({**options, "strict": True}, PASSES))
    manager(gm.graph)
    gm.recompile()
    return manager.record
