"""The RMSNorm ops through torch.ops / the Python API: opcheck, float64 reference, odd shapes, bad input."""

import pytest
import torch

import turbo_inductor
from turbo_inductor.kernels.triton import interpreting
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.tolerance import assert_close

IMPLS = ["triton", "reference"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def reference(x, weight, eps, residual=None):
    """The spec, in float64: (rmsnorm(x + residual) * weight, x + residual as torch adds in x's dtype)."""
    total = x if residual is None else x + residual
    t = total.double()
    y = t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps)
    return (y if weight is None else y * weight.double()), total


def make(shape, dtype, requires_grad=False):
    return torch.randn(shape, dtype=dtype, device=DEVICE).requires_grad_(requires_grad)


@pytest.mark.parametrize("impl", IMPLS)
def test_opcheck(impl):
    x = make((3, 5, 33), torch.float32, requires_grad=True)
    w = make((33,), torch.float32, requires_grad=True)
    r = make((3, 5, 33), torch.float32, requires_grad=True)
    ops = torch.ops.turbo_inductor
    torch.library.opcheck(ops.rmsnorm_fwd, (x, w, 1e-6, impl))
    torch.library.opcheck(ops.rmsnorm_fwd, (x, None, 1e-5, impl))
    torch.library.opcheck(ops.rmsnorm_residual_fwd, (x, r, w, 1e-6, impl))
    torch.library.opcheck(ops.rmsnorm, (x, w, 1e-6, impl))
    torch.library.opcheck(ops.rmsnorm_residual, (x, r, w, 1e-6, impl))
    y, rstd = ops.rmsnorm_fwd(x, w, 1e-6, impl)
    dy = torch.randn_like(y)
    rstd = rstd.detach()
    torch.library.opcheck(ops.rmsnorm_bwd, (dy, x.detach(), w.detach(), rstd, None, impl))
    torch.library.opcheck(ops.rmsnorm_bwd, (dy, x.detach(), None, rstd, torch.randn_like(dy), impl))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1, 127, 4097])
@pytest.mark.parametrize("with_weight", [True, False])
def test_forward_backward_against_float64(impl, dtype, hidden, with_weight):
    x = make((2, 3, hidden), dtype, requires_grad=True)
    w = make((hidden,), dtype, requires_grad=True) if with_weight else None
    y = turbo_inductor.ops.rmsnorm(x, w, eps=1e-5, impl=impl)
    assert y.dtype == dtype and y.shape == x.shape
    dy = torch.randn_like(y)
    y.backward(dy)
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_() if with_weight else None
    expected, _ = reference(x64, w64, 1e-5)
    expected.backward(dy.double())
    assert_close(y, expected, dtype)
    assert_close(x.grad, x64.grad, dtype)
    if with_weight:
        # dweight sums over rows: compare relative to its scale
        torch.testing.assert_close(
            w.grad.double(),
            w64.grad,
            rtol=2e-2 if dtype != torch.float32 else 1e-4,
            atol=(2e-2 if dtype != torch.float32 else 1e-4) * w64.grad.abs().max().item(),
        )


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "x_dtype, r_dtype",
    [(d, d) for d in DTYPES]
    + [(torch.bfloat16, torch.float32), (torch.float32, torch.float16), (torch.float16, torch.bfloat16)],
)
def test_residual_forward_backward_against_float64(impl, x_dtype, r_dtype):
    """Where x's and the residual's dtypes differ (under torch.autocast a bf16 branch output joins an fp32 residual
    stream), y and the sum come in the add's promoted dtype, the sum equal to the add's, and each addend's gradient
    in its own dtype."""
    x, r = make((4, 7, 96), x_dtype, requires_grad=True), make((4, 7, 96), r_dtype, requires_grad=True)
    promoted = torch.promote_types(x_dtype, r_dtype)
    w = make((96,), promoted, requires_grad=True)
    y, total = turbo_inductor.ops.rmsnorm_residual(x, r, w, eps=1e-6, impl=impl)
    assert y.dtype == total.dtype == promoted
    dy, dtotal = torch.randn_like(y), torch.randn_like(total)
    torch.autograd.backward([y, total], [dy, dtotal])
    x64, r64, w64 = (t.detach().double().requires_grad_() for t in (x, r, w))
    s64 = x64 + r64
    expected = s64 * torch.rsqrt(s64.pow(2).mean(-1, keepdim=True) + 1e-6) * w64
    torch.autograd.backward([expected, s64], [dy.double(), dtotal.double()])
    ref_y, ref_total = reference(x.detach(), w.detach(), 1e-6, residual=r.detach())
    if impl == "triton" and promoted == torch.bfloat16 and interpreting():
        # Triton's CPU interpreter truncates fp32 -> bf16 instead of rounding to nearest even: 1 ulp
        torch.testing.assert_close(total, ref_total, rtol=2**-7, atol=0)
    else:
        assert torch.equal(total, ref_total), "the sum is the add rounded to its dtype"
    assert_close(y, ref_y, promoted)
    assert (x.grad.dtype, r.grad.dtype) == (x_dtype, r_dtype)
    assert_close(x.grad, x64.grad, x_dtype)
    assert_close(r.grad, r64.grad, r_dtype)
    if x_dtype != r_dtype:
        torch.library.opcheck(torch.ops.turbo_inductor.rmsnorm_residual_fwd, (x, r, w, 1e-6, impl))


@pytest.mark.parametrize("impl", IMPLS)
def test_non_contiguous_inputs(impl):
    base = make((64, 6, 2), torch.float32)
    x = base.transpose(0, 2)[:, ::2]  # [2, 3, 64], strided
    w = make((128,), torch.float32)[::2]
    assert not x.is_contiguous() and not w.is_contiguous()
    y = turbo_inductor.ops.rmsnorm(x, w, eps=1e-6, impl=impl)
    assert_close(y, reference(x, w, 1e-6)[0], torch.float32)
    assert y.is_contiguous()


@pytest.mark.parametrize("impl", IMPLS)
def test_empty_input_gives_empty_result(impl):
    x = make((0, 16), torch.bfloat16, requires_grad=True)
    w = make((16,), torch.bfloat16, requires_grad=True)
    y = turbo_inductor.ops.rmsnorm(x, w, impl=impl)
    assert y.shape == (0, 16)
    y.sum().backward()
    assert x.grad.shape == (0, 16) and torch.equal(w.grad, torch.zeros_like(w))


@pytest.mark.parametrize("impl", IMPLS)
def test_nan_propagates_to_its_row_only(impl):
    x = make((4, 32), torch.float32)
    x[1, 3] = float("nan")
    y = turbo_inductor.ops.rmsnorm(x, make((32,), torch.float32), impl=impl)
    assert torch.isnan(y[1]).all() and not torch.isnan(y[[0, 2, 3]]).any()


@pytest.mark.parametrize(
    "args, message",
    [
        (lambda: (torch.randint(0, 5, (2, 8), device=DEVICE), None), "x has dtype torch.int64"),
        (
            lambda: (make((2, 8), torch.float32), make((7,), torch.float32)),
            "weight has shape [7] but x's last dimension is 8",
        ),
        (lambda: (make((2, 8), torch.float32), make((8,), torch.float64)), "weight has dtype torch.float64"),
        (lambda: (make((), torch.float32), None), "at least one dimension"),
        (lambda: (make((2, 8), torch.float32), torch.ones(8, device="meta")), "different devices"),
    ],
)
def test_bad_input_is_named(args, message):
    x, w = args()
    with pytest.raises(
        ValueError,
        match="turbo_inductor.rmsnorm: .*" + message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\."),
    ):
        turbo_inductor.ops.rmsnorm(x, w)


def test_bad_eps_and_residual_are_named():
    x = make((2, 8), torch.float32)
    with pytest.raises(ValueError, match="eps must be a finite number"):
        turbo_inductor.ops.rmsnorm(x, None, eps=float("nan"))
    with pytest.raises(ValueError, match=r"residual has shape \[2, 9\] but x has \[2, 8\]"):
        turbo_inductor.ops.rmsnorm_residual(x, make((2, 9), torch.float32))
    with pytest.raises(ValueError, match="residual has dtype torch.int64"):
        turbo_inductor.ops.rmsnorm_residual(x, torch.ones(2, 8, dtype=torch.int64, device=DEVICE))


def test_forcing_an_implementation_that_cannot_run_says_why(monkeypatch):
    x = make((2, 8), torch.float32)
    with pytest.raises(ValueError, match="has no implementation 'cutlass'"):
        turbo_inductor.ops.rmsnorm(x, None, impl="cutlass")
    monkeypatch.setenv("TURBO_INDUCTOR_IMPL", "rmsnorm_fwd=reference")
    turbo_inductor.ops.rmsnorm(x, None)
    assert turbo_inductor.kernel_calls() == {("rmsnorm_fwd", "reference"): 1}


def test_auto_prefers_triton_where_it_runs():
    turbo_inductor.ops.rmsnorm(make((2, 8), torch.float32), None)
    assert turbo_inductor.kernel_calls() == {("rmsnorm_fwd", "triton"): 1}


@pytest.mark.parametrize("impl", IMPLS)
def test_out_dtype_writes_the_output_cast_once(impl):
    """``out_dtype`` (autocast: an fp32 norm read by bf16 linears): y is the fp32 norm rounded once to bf16, bit for
    bit; the sum stays the add's dtype; dy comes in y's dtype, and the gradients are those of the cast's backward."""
    x, w = make((3, 5, 48), torch.float32, requires_grad=True), make((48,), torch.float32, requires_grad=True)
    r = make((3, 5, 48), torch.bfloat16, requires_grad=True)
    ops = turbo_inductor.ops
    y = ops.rmsnorm(x, w, impl=impl, out_dtype=torch.bfloat16)
    y_res, total = ops.rmsnorm_residual(x, r, w, impl=impl, out_dtype=torch.bfloat16)
    assert y.dtype == y_res.dtype == torch.bfloat16 and total.dtype == torch.float32
    for got, want in (
        (y, ops.rmsnorm(x, w, impl=impl).to(torch.bfloat16)),
        (y_res, ops.rmsnorm_residual(x, r, w, impl=impl)[0].to(torch.bfloat16)),
    ):
        if impl == "triton" and interpreting():  # the interpreter's bf16 stores round some values the other way
            torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=0)
        else:
            assert torch.equal(got, want)
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, w), dy)
    want = torch.autograd.grad(ops.rmsnorm(x, w, impl=impl).to(torch.bfloat16), (x, w), dy)
    for got, expected in zip(grads, want):
        assert got.dtype == expected.dtype == torch.float32
        if impl == "triton":  # a bf16 dy loads in another register layout: the row sums may add in another order
            torch.testing.assert_close(got, expected)
        else:
            assert torch.equal(got, expected)
    for op, args in (
        (torch.ops.turbo_inductor.rmsnorm_fwd, (x, w, 1e-6, impl, torch.bfloat16)),
        (torch.ops.turbo_inductor.rmsnorm_residual_fwd, (x, r, w, 1e-6, impl, torch.bfloat16)),
    ):
        torch.library.opcheck(op, args)
    with pytest.raises(ValueError, match="out_dtype must be one of float32, bfloat16, float16 or None, got torch.int8"):
        ops.rmsnorm(x, w, impl=impl, out_dtype=torch.int8)
