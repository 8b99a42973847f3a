"""Every public op on bad input, called eagerly and inside a compiled function: an error that names the op and the
problem, or a defined result (an empty input gives an empty result and gradients; NaN stays in its own row). And
every wrapper in turbo_inductor.ops takes its op's arguments in the schema's order, so that a positional call means
what it means to the op."""

import inspect

import pytest
import torch

import turbo_inductor
from turbo_inductor.ops.library import OpInputError

ops = turbo_inductor.ops


def randn(*shape):
    return torch.randn(*shape)


def halves(x):
    """Two groups' end rows over x's rows: grouped_mm's offs."""
    rows = x.shape[0]
    return torch.tensor([rows // 2, rows], dtype=torch.int32, device=x.device)


def two_choices(weights):
    """moe_permute's positions for k = 2 choices per token: token t's rows t and T + t (its own row first)."""
    tokens = torch.arange(weights.shape[0], device=weights.device)
    return torch.stack([tokens, tokens + weights.shape[0]], dim=1)


# op name in messages: (call, good inputs by row count, bad inputs, the problem the message names)
CASES = {
    "rmsnorm": (
        lambda x, w: ops.rmsnorm(x, w),
        lambda rows: [randn(rows, 16), randn(16)],
        [randn(4, 16), randn(8)],
        "weight has shape",
    ),
    "rmsnorm_residual": (
        lambda x, r, w: ops.rmsnorm_residual(x, r, w)[0],
        lambda rows: [randn(rows, 16), randn(rows, 16), randn(16)],
        [randn(4, 16), randn(4, 8), randn(16)],
        "residual",
    ),
    "glu": (
        lambda g, u: ops.swiglu(g, u),
        lambda rows: [randn(rows, 16), randn(rows, 16)],
        [randn(4, 16), randn(4, 8)],
        "must match gate",
    ),
    "glu_fused": (lambda x: ops.glu_fused(x), lambda rows: [randn(rows, 32)], [randn(4, 15)], "must be even"),
    "fp8_linear": (
        lambda x, w: ops.fp8_linear(x, w, None, "rowwise", impl="reference"),
        lambda rows: [randn(rows, 32), randn(16, 32)],
        [randn(4, 32), randn(16, 48)],
        "weight must be",
    ),
    "rmsnorm_fp8": (
        lambda x, r, w: ops.rmsnorm_fp8(x, r, w, impl="reference")[0],
        lambda rows: [randn(rows, 32), randn(rows, 32), randn(32)],
        [randn(4, 32), randn(4, 16), randn(32)],
        "residual",
    ),
    "glu_fp8": (
        lambda g, u: ops.glu_fp8(g, u, impl="reference")[0],
        lambda rows: [randn(rows, 32), randn(rows, 32)],
        [randn(4, 32), randn(4, 16)],
        "must match gate",
    ),
    "grouped_mm": (
        lambda x, w: ops.grouped_mm(x, w, halves(x), impl="reference"),
        lambda rows: [randn(rows, 16), randn(2, 16, 8)],
        [randn(4, 16), randn(2, 12, 8)],
        "must share K",
    ),
    "fp8_grouped_mm": (
        lambda x, w: ops.fp8_grouped_mm(x, w, halves(x), impl="reference"),
        lambda rows: [randn(rows, 32), randn(2, 32, 16)],
        [randn(4, 32), randn(2, 32, 20)],
        "multiples of",
    ),
    "rotary": (
        lambda x, c, s: ops.rotary(x, c, s),
        lambda rows: [randn(rows, 4, 6, 8), randn(1, 1, 6, 8), randn(1, 1, 6, 8)],
        [randn(4, 4, 6, 8), randn(1, 1, 6, 8), randn(1, 1, 5, 8)],
        "must be one 4-D shape",
    ),
    "moe_combine": (
        lambda y, w: ops.moe_combine(y, w, two_choices(w), impl="reference"),
        lambda rows: [randn(2 * rows, 16), randn(rows, 2)],
        [randn(8, 16), randn(3, 2)],
        "must be 2-D with",
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_is_named_eagerly(name):
    call, _, bad, problem = CASES[name]
    with pytest.raises(OpInputError, match=rf"turbo_inductor\.{name}: .*{problem}"):
        call(*bad)


@pytest.mark.parametrize("backend", ["inductor", "primus_turbo"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_fails_the_compile_with_the_op_named(name, backend):
    """The fake implementation checks too: the error comes at compile time, before any kernel runs."""
    call, _, bad, problem = CASES[name]
    with pytest.raises(Exception, match=rf"turbo_inductor\.{name}: .*{problem}"):
        torch.compile(call, backend=backend)(*bad)


@pytest.mark.parametrize("name", sorted(n for n in CASES if len(CASES[n][1](1)) > 1))  # ops of several tensors
def test_tensors_on_different_devices_are_named(name):
    call, good, _, _ = CASES[name]
    inputs = good(4)
    inputs[-1] = inputs[-1].to("meta")
    with pytest.raises(OpInputError, match=rf"turbo_inductor\.{name}: .*(different devices|must match|meta)"):
        call(*inputs)


@pytest.mark.parametrize("name", sorted(CASES))
def test_empty_input_gives_empty_results_and_gradients(name):
    call, good, _, _ = CASES[name]
    inputs = [t.requires_grad_() for t in good(0)]
    out = call(*inputs)
    assert out.shape[0] == 0
    grads = torch.autograd.grad(out.sum(), inputs, allow_unused=True)
    for t, g in zip(inputs, grads):
        assert g is None or (g.shape == t.shape and not g.isnan().any())


@pytest.mark.parametrize("name", sorted(CASES))
def test_nan_stays_in_its_row(name):
    call, good, _, _ = CASES[name]
    inputs = good(4)
    inputs[0][1, 3] = float("nan")
    out = call(*inputs)
    assert out[1].isnan().any(), "NaN propagates"
    assert torch.isfinite(out[[0, 2, 3]]).all(), "and stays in its row"


# Wrappers of an op of their name; geglu, which calls glu, has none.
WRAPPERS = sorted(
    name
    for name, function in vars(ops).items()
    if inspect.isfunction(function)
    and function.__module__ == ops.__name__
    and not name.startswith("_")
    and hasattr(torch.ops.turbo_inductor, name)
)
# A wrapper's parameter that takes more than its schema argument: a ProcessGroup as well as its name.
SCHEMA_NAME = {"group": "group_name"}


@pytest.mark.parametrize("name", WRAPPERS)
def test_wrapper_takes_its_schema_order(name):
    """Positionally the schema's first arguments, then keyword-only ones in its order. The wrapper may leave out the
    rest: it fixes them (rotary's transposed) or takes them by name (``**arguments``)."""
    parameters = [p for p in inspect.signature(getattr(ops, name)).parameters.values() if p.kind != p.VAR_KEYWORD]
    names = [SCHEMA_NAME.get(p.name, p.name) for p in parameters]
    schema = [argument.name for argument in getattr(torch.ops.turbo_inductor, name).default._schema.arguments]
    positional = [n for n, p in zip(names, parameters) if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert positional == schema[: len(positional)]
    assert names == [argument for argument in schema if argument in names]
