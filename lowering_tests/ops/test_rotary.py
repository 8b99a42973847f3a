"""Rotary embedding: the op against float64 (both layouts, a table that wants a gradient), and its bad input."""

import pytest
import torch

import turbo_inductor
from turbo_inductor.ops.library import OpInputError
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.rotary import rotate_half, tables
from turbo_inductor.testing.tolerance import assert_close

IMPLS = ["triton", "reference"]


def heads_first(batch=2, heads=3, positions=5, dim=12, dtype=torch.float32):
    """x [B, H, S, D] as attention takes it: a projection's [B, S, H, D] transposed (strided)."""
    return torch.randn(batch, positions, heads, dim, device=DEVICE, dtype=dtype).transpose(1, 2)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("transposed", [False, True])
def test_opcheck(impl, transposed):
    x = heads_first().requires_grad_()
    cos, sin = (t.unsqueeze(1).requires_grad_() for t in tables(2, 5, 12, torch.float32))
    torch.library.opcheck(torch.ops.turbo_inductor.rotary, (x, cos, sin, transposed, impl))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dim", [12, 96, 128])  # a half that is no power of two (Phi-3's 96), Llama's 128
def test_against_float64(impl, dtype, dim):
    x = heads_first(dim=dim, dtype=dtype).requires_grad_()
    cos, sin = tables(2, 5, dim, dtype)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    out = turbo_inductor.ops.rotary(x, cos, sin, impl=impl)
    assert out.stride() == x.stride(), "x's layout"
    dout = torch.randn_like(out)
    out.backward(dout)
    x64 = x.detach().double().requires_grad_()
    expected = x64 * cos.double() + rotate_half(x64) * sin.double()
    expected.backward(dout.double())
    assert_close(out, expected, dtype)
    assert_close(x.grad, x64.grad, dtype)


@pytest.mark.parametrize("impl", IMPLS)
def test_positions_before_heads(impl):
    """transformers' ``unsqueeze_dim=2``: x [B, S, H, D], the table [B, S, 1, D]."""
    x = torch.randn(2, 5, 3, 12, device=DEVICE)
    cos, sin = (t.unsqueeze(2) for t in tables(2, 5, 12, torch.float32))
    out = turbo_inductor.ops.rotary(x, cos, sin, impl=impl)
    assert_close(out, x.double() * cos.double() + rotate_half(x.double()) * sin.double(), torch.float32)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_table_that_wants_a_gradient_gets_it(impl):
    x = heads_first().requires_grad_()
    cos, sin = (torch.randn(1, 1, 5, 12, device=DEVICE, requires_grad=True) for _ in range(2))
    out = turbo_inductor.ops.rotary(x, cos, sin, impl=impl)
    dout = torch.randn_like(out)
    out.backward(dout)
    leaves = [t.detach().double().requires_grad_() for t in (x, cos, sin)]
    (leaves[0] * leaves[1] + rotate_half(leaves[0]) * leaves[2]).backward(dout.double())
    for got, want in zip((x.grad, cos.grad, sin.grad), (leaf.grad for leaf in leaves)):
        assert_close(got, want, torch.float32)


def test_bad_input_names_the_problem():
    x = heads_first()
    cos, sin = (t.unsqueeze(1) for t in tables(2, 5, 12, torch.float32))
    cases = [
        ((x[0], cos, sin), "x must be 4-D"),
        ((x[..., :11], cos[..., :11], sin[..., :11]), "last dimension must be even"),
        ((x, cos[:, :, :4], sin[:, :, :4]), r"cos \[2, 1, 4, 12\] and sin \[2, 1, 4, 12\] must be one 4-D shape"),
        ((x, cos, sin[:1]), "must be one 4-D shape"),
        ((x, cos.long(), sin), "cos has dtype torch.int64"),
    ]
    for args, message in cases:
        with pytest.raises(OpInputError, match=message):
            torch.ops.turbo_inductor.rotary(*args)
