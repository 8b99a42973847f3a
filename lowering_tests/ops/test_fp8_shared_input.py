"""The fp8_shared_input op: x and x^T quantized once for the FP8 linears reading x (opcheck), the linear reading the
x^T handed to it, and bad input."""

import re

import pytest
import torch

import turbo_inductor
from turbo_inductor.ops.library import OpInputError
from turbo_inductor.testing import DEVICE


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "blockwise"])
def test_opcheck(recipe):
    x = torch.randn(4, 8, 256, device=DEVICE, requires_grad=True)
    weights = [torch.randn(n, 256, device=DEVICE, requires_grad=True) for n in (128, 64)]
    # fp8 outputs: opcheck's schema test compares outputs and its AOT test sums them, which fp8 tensors cannot on
    # CPU (as ops/test_fp8_linear.py's opcheck); the fake and the autograd registration are checked
    fp8_out = ("test_autograd_registration", "test_faketensor")
    for transposed in (True, False):
        torch.library.opcheck(
            torch.ops.turbo_inductor.fp8_shared_input_quantize.default,
            (x, recipe, "reference", transposed),
            test_utils=fp8_out,
        )
    q, scale, q_t, scale_t = turbo_inductor.ops.fp8_shared_input(x, weights, recipe, impl="reference")
    assert q_t.shape == (256, 32)
    args = (x, weights[0], None, recipe, "reference", q, scale, True, True, q_t, scale_t)
    torch.library.opcheck(torch.ops.turbo_inductor.fp8_linear_fwd.default, args, test_utils=fp8_out)
    with torch.no_grad():
        assert turbo_inductor.ops.fp8_shared_input(x, weights, recipe, impl="reference")[2].numel() == 0


def test_the_linear_reads_the_handed_transpose():
    """The wgrad reads the x^T handed to the linear, not one of its own: a different x^T gives a different dW."""
    x = torch.randn(64, 128, device=DEVICE, requires_grad=True)
    w = torch.randn(32, 128, device=DEVICE, requires_grad=True)
    q, scale, q_t, scale_t = turbo_inductor.ops.fp8_shared_input(x, [w], "tensorwise", impl="reference")
    linear = turbo_inductor.ops.fp8_linear
    own = torch.autograd.grad(linear(x, w, None, "tensorwise", impl="reference").sum(), w)[0]
    handed = linear(x, w, None, "tensorwise", impl="reference", x_q=q, x_scale=scale, x_t=q_t, x_t_scale=scale_t)
    assert torch.equal(torch.autograd.grad(handed.sum(), w)[0], own)
    doubled = linear(x, w, None, "tensorwise", impl="reference", x_q=q, x_scale=scale, x_t=q_t, x_t_scale=2 * scale_t)
    torch.testing.assert_close(torch.autograd.grad(doubled.sum(), w)[0], 2 * own)


@pytest.mark.parametrize(
    "call, said",
    [
        (lambda x, w, q, s, qt, st: dict(x_t=qt, x_t_scale=st), "x_t is x^T quantized beside x_q: give x_q too"),
        (lambda x, w, q, s, qt, st: dict(x_q=q, x_scale=s, x_t=qt), "x_t and x_t_scale must be given together"),
        (lambda x, w, q, s, qt, st: dict(x_q=q, x_scale=s, x_t=q, x_t_scale=st), "x_t_q must be x_t quantized as"),
        (lambda x, w, q, s, qt, st: dict(x_q=q, x_scale=s, x_t=qt, x_t_scale=s.t()), "x_t_scale must be the"),
    ],
    ids=["x_t alone", "x_t without scale", "x_t not transposed", "x_t's scale of x"],
)
def test_bad_input_names_the_problem(call, said):
    x = torch.randn(64, 128, device=DEVICE, requires_grad=True)
    w = torch.randn(32, 128, device=DEVICE, requires_grad=True)
    q, s, qt, st = turbo_inductor.ops.fp8_shared_input(x, [w], "rowwise", impl="reference")
    with pytest.raises(OpInputError, match=re.escape(f"turbo_inductor.fp8_linear: {said}")):
        turbo_inductor.ops.fp8_linear(x, w, None, "rowwise", impl="reference", **call(x, w, q, s, qt, st))


def test_bad_weights_name_the_problem():
    x = torch.randn(64, 128, device=DEVICE)
    with pytest.raises(OpInputError, match=r"fp8_shared_input: weights must be the readers' \[N, K\] with K = "):
        turbo_inductor.ops.fp8_shared_input(x, [torch.randn(32, 64, device=DEVICE)], "tensorwise")
    with pytest.raises(OpInputError, match="fp8_shared_input: recipe must be one of"):
        turbo_inductor.ops.fp8_shared_input(x, [], "rowwise2")
