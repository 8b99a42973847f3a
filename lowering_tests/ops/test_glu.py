"""The GLU ops (SwiGLU, GeGLU, the MoE probs form) through torch.ops / the Python API."""

import pytest
import torch
import torch.nn.functional as F

import turbo_inductor
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.tolerance import assert_close

IMPLS = ["triton", "reference"]
ACTS = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}


def make(*shape, dtype=torch.float32, requires_grad=False):
    return torch.randn(*shape, dtype=dtype, device=DEVICE).requires_grad_(requires_grad)


@pytest.mark.parametrize("impl", IMPLS)
def test_opcheck(impl):
    ops = torch.ops.turbo_inductor
    g, u, x = make(3, 5, 33, requires_grad=True), make(3, 5, 33, requires_grad=True), make(3, 5, 66, requires_grad=True)
    probs = torch.rand(3, 5, device=DEVICE, requires_grad=True)
    mask = torch.rand(3, 5, device=DEVICE) > 0.3
    for act in ACTS:
        torch.library.opcheck(ops.glu, (g, u, None, None, act, impl))
        torch.library.opcheck(ops.glu_fused, (x, None, None, act, impl))
    torch.library.opcheck(ops.glu, (g, u, probs, mask, "silu", impl))
    torch.library.opcheck(ops.glu_fused, (x, probs, mask, "gelu", impl))
    torch.library.opcheck(ops.swiglu, (g, u, impl))
    dout = make(3, 5, 33)
    torch.library.opcheck(ops.glu_bwd, (dout, g.detach(), u.detach(), probs.detach(), mask, "silu", impl))
    torch.library.opcheck(ops.glu_fused_bwd, (dout, x.detach(), None, None, "gelu_tanh", impl))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("width", [1, 127, 4097])
def test_separate_and_fused_forms_against_float64(impl, act, dtype, width):
    x = make(2, 3, 2 * width, dtype=dtype, requires_grad=True)
    g, u = (t.detach().clone().requires_grad_() for t in x.chunk(2, -1))
    separate = torch.ops.turbo_inductor.glu(g, u, None, None, act, impl)
    fused = turbo_inductor.ops.glu_fused(x, activation=act, impl=impl)
    dout = torch.randn_like(separate)
    separate.backward(dout)
    fused.backward(dout)
    x64 = x.detach().double().requires_grad_()
    g64, u64 = x64.chunk(2, -1)
    expected = ACTS[act](g64) * u64
    expected.backward(dout.double())
    assert separate.dtype == fused.dtype == dtype and fused.shape == (2, 3, width)
    for got in (separate, fused):
        assert_close(got, expected, dtype)
    assert_close(torch.cat([g.grad, u.grad], -1), x64.grad, dtype)
    assert_close(x.grad, x64.grad, dtype)


@pytest.mark.parametrize("impl", IMPLS)
def test_moe_probs_and_mask(impl):
    tokens, width = 9, 40
    x = make(tokens, 2 * width, dtype=torch.bfloat16, requires_grad=True)
    probs = torch.rand(tokens, device=DEVICE, requires_grad=True)
    mask = torch.tensor([True, False, True, True, False, True, False, True, True], device=DEVICE)
    out = turbo_inductor.ops.glu_fused(x, probs, mask, "silu", impl=impl)
    dout = torch.randn_like(out)
    out.backward(dout)
    x64, p64 = x.detach().double().requires_grad_(), probs.detach().double().requires_grad_()
    g64, u64 = x64.chunk(2, -1)
    expected = F.silu(g64) * u64 * p64[:, None] * mask[:, None]
    expected.backward(dout.double())
    dropped = ~mask
    assert torch.equal(out[dropped], torch.zeros_like(out[dropped])), "masked rows are exact zeros"
    assert torch.equal(x.grad[dropped], torch.zeros_like(x.grad[dropped]))
    assert torch.equal(probs.grad[dropped], torch.zeros_like(probs.grad[dropped]))
    assert_close(out, expected, torch.bfloat16)
    assert_close(x.grad, x64.grad, torch.bfloat16)
    torch.testing.assert_close(probs.grad.double(), p64.grad, rtol=1e-2, atol=1e-2 * p64.grad.abs().max().item())


@pytest.mark.parametrize("impl", IMPLS)
def test_swiglu_name_and_geglu_api(impl):
    g, u = make(4, 16), make(4, 16)
    torch.testing.assert_close(torch.ops.turbo_inductor.swiglu(g, u, impl), F.silu(g) * u, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(
        turbo_inductor.ops.geglu(g, u, "tanh", impl=impl), F.gelu(g, approximate="tanh") * u, rtol=1e-4, atol=1e-4
    )


def test_empty_and_non_contiguous():
    g = make(0, 8, requires_grad=True)
    out = turbo_inductor.ops.swiglu(g, make(0, 8))
    assert out.shape == (0, 8)
    base = make(16, 6)
    g, u = base.t()[:, :8], base.t()[:, 8:]  # [6, 8] views with column stride 6
    torch.testing.assert_close(turbo_inductor.ops.swiglu(g, u), F.silu(g) * u, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: turbo_inductor.ops.swiglu(make(2, 8), make(2, 9)), r"up \(\[2, 9\], torch.float32\) must match gate"),
        (lambda: turbo_inductor.ops.swiglu(make(2, 8).double(), make(2, 8).double()), "gate has dtype torch.float64"),
        (lambda: turbo_inductor.ops.glu_fused(make(2, 7)), "it must be even"),
        (lambda: turbo_inductor.ops.glu_fused(make(2, 8), activation="relu"), "activation must be one of"),
        (
            lambda: turbo_inductor.ops.glu_fused(make(2, 8), torch.rand(3, device=DEVICE)),
            "probs must be float32",
        ),
        (
            lambda: turbo_inductor.ops.glu_fused(make(2, 8), None, torch.ones(2, dtype=torch.bool, device=DEVICE)),
            "mask needs probs",
        ),
        (lambda: turbo_inductor.ops.geglu(make(2, 8), make(2, 8), "fast"), "approximate must be"),
    ],
)
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()
