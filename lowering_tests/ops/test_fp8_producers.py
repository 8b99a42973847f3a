"""The producer ops rmsnorm_fp8 and glu_fp8: gradients equal to the plain norm's and GLU's, an FP8 linear or
grouped GEMM taking their FP8 output, opcheck, bad input, and ``out_dtype``."""

import pytest
import torch

import turbo_inductor
from turbo_inductor.kernels.triton import interpreting
from turbo_inductor.recipes import ROW_RECIPES
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.fp8 import E4M3, assert_bitwise_equal, quantize_rows

IMPLS = ["reference", "triton"]


@pytest.mark.parametrize("recipe", ROW_RECIPES)
@pytest.mark.parametrize("residual", [True, False])
def test_op_gradients_are_rmsnorms_and_the_linear_takes_its_fp8_output(recipe, residual):
    """rmsnorm_fp8's y, sum and gradients equal rmsnorm's / rmsnorm_residual's; an fp8_linear given its q and scale
    computes exactly what it computes from y alone, forward and backward, in training and in inference."""
    x = torch.randn(2, 24, 128, device=DEVICE, requires_grad=True)
    r = torch.randn_like(x, requires_grad=True) if residual else None
    w = torch.randn(128, device=DEVICE, requires_grad=True)
    lin = (torch.randn(64, 128, device=DEVICE) * 0.1).requires_grad_()
    ops = turbo_inductor.ops

    def fused():
        y, total, q, scale = ops.rmsnorm_fp8(x, r, w, 1e-6, recipe, impl="reference")
        out = ops.fp8_linear(y, lin, None, recipe, impl="reference", x_q=q, x_scale=scale)
        return out, (total if residual else None)

    def unfused():
        if residual:
            y, total = ops.rmsnorm_residual(x, r, w, 1e-6, impl="reference")
        else:
            y, total = ops.rmsnorm(x, w, 1e-6, impl="reference"), None
        return ops.fp8_linear(y, lin, None, recipe, impl="reference"), total

    results = []
    for forward in (fused, unfused):
        out, total = forward()
        cotangents = [torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(DEVICE)]
        outputs = [out] + ([total] if residual else [])
        cotangents += (
            [torch.randn(total.shape, generator=torch.Generator().manual_seed(4)).to(DEVICE)] if residual else []
        )
        leaves = [t for t in (x, r, w, lin) if t is not None]
        grads = torch.autograd.grad(outputs, leaves, cotangents)
        with torch.no_grad():
            inference = forward()[0]
        results.append([t.detach() for t in outputs] + list(grads) + [inference])
    for got, want in zip(*results):
        assert torch.equal(got, want)


@pytest.mark.parametrize("recipe", ["rowwise", "blockwise"])
@pytest.mark.parametrize("form", ["halves", "separate", "moe"])
def test_glu_op_gradients_are_the_glus_and_the_linear_takes_its_fp8_output(recipe, form):
    """glu_fp8's output and gradients equal glu's / glu_fused's, and the down projection given its q and scale
    computes what it computes from the output alone, forward and backward."""
    x = torch.randn(2, 24, 2 * 128, device=DEVICE, requires_grad=True)
    up = torch.randn(2, 24, 128, device=DEVICE, requires_grad=True) if form != "halves" else None
    gate = x[..., :128] if form != "halves" else x
    probs = torch.rand(2, 24, device=DEVICE, requires_grad=True) if form == "moe" else None
    mask = (torch.rand(2, 24, device=DEVICE) > 0.3) if form == "moe" else None
    lin = (torch.randn(64, 128, device=DEVICE) * 0.1).requires_grad_()
    ops = turbo_inductor.ops

    def fused():
        out, q, scale = ops.glu_fp8(gate, up, probs, mask, "silu", recipe, impl="reference")
        return ops.fp8_linear(out, lin, None, recipe, impl="reference", x_q=q, x_scale=scale)

    def unfused():
        if up is None:
            out = ops.glu_fused(gate, probs, mask, "silu", impl="reference")
        else:
            out = torch.ops.turbo_inductor.glu(gate, up, probs, mask, "silu", "reference")
        return ops.fp8_linear(out, lin, None, recipe, impl="reference")

    results = []
    for forward in (fused, unfused):
        y = forward()
        leaves = [t for t in (x, up, probs, lin) if t is not None]
        dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(3)).to(DEVICE)
        grads = torch.autograd.grad(y, leaves, dy)
        results.append([y.detach(), *grads])
    for got, want in zip(*results):
        assert torch.equal(got, want)


def test_opcheck():
    x, r = torch.randn(2, 8, 64, device=DEVICE), torch.randn(2, 8, 64, device=DEVICE)
    w = torch.randn(64, device=DEVICE)
    # fp8 outputs: opcheck's schema test compares outputs and its AOT test sums them, which fp8 tensors cannot on
    # CPU (as ops/test_fp8_linear.py's opcheck); the fake and the autograd registration are checked
    fp8_out = ("test_autograd_registration", "test_faketensor")
    for residual in (r, None):
        for recipe in ("rowwise", "blockwise"):
            for out_dtype in (None, torch.bfloat16):
                torch.library.opcheck(
                    torch.ops.turbo_inductor.rmsnorm_fp8_fwd,
                    (x, residual, w, 1e-6, recipe, "reference", out_dtype),
                    test_utils=fp8_out,
                )
    q, scale = turbo_inductor.ops.rmsnorm_fp8(x, None, w, 1e-6, "rowwise", impl="reference")[2:]
    lin = torch.randn(32, 64, device=DEVICE)
    torch.library.opcheck(
        torch.ops.turbo_inductor.fp8_linear_fwd, (x, lin, None, "rowwise", "reference", q, scale), test_utils=fp8_out
    )
    torch.library.opcheck(
        torch.ops.turbo_inductor.fp8_linear_inference,
        (x, lin, None, "rowwise", "reference", q, scale),
        test_utils=fp8_out,
    )
    probs, mask = torch.rand(2, 8, device=DEVICE), torch.rand(2, 8, device=DEVICE) > 0.5
    for args in ((x, None, None, None), (x[..., :32], x[..., 32:], probs, mask)):
        for recipe in ("rowwise", "mxfp8"):
            torch.library.opcheck(
                torch.ops.turbo_inductor.glu_fp8, (*args, "silu", recipe, "reference"), test_utils=fp8_out
            )


def _bad(recipe="rowwise", q_shape=(16, 64), q_dtype=E4M3, scale_shape=(16, 1), scale_given=True):
    x, lin = torch.randn(2, 8, 64, device=DEVICE), torch.randn(32, 64, device=DEVICE)
    q = torch.zeros(q_shape, device=DEVICE).to(q_dtype)
    scale = torch.ones(scale_shape, device=DEVICE) if scale_given else None
    return lambda: turbo_inductor.ops.fp8_linear(x, lin, None, recipe, impl="reference", x_q=q, x_scale=scale)


@pytest.mark.parametrize(
    "call, message",
    [
        (_bad(q_shape=(8, 64)), "x_q must be x quantized as \\[16, 64\\]"),
        (_bad(q_dtype=torch.float8_e5m2), "x_q must be x quantized"),
        (_bad(scale_shape=(16, 2)), "x_scale must be the rowwise scales of x, float32 \\[16, 1\\]"),
        (_bad(recipe="mxfp8"), "x_scale must be the mxfp8 scales of x, float32 \\[16, 2\\]"),
        (_bad(scale_given=False), "x_q and x_scale must be given together"),
        (
            lambda: turbo_inductor.ops.rmsnorm_fp8(torch.randn(4, 64, device=DEVICE), None, None, 1e-6, "tensorwise"),
            "recipe must quantize x in blocks within a row",
        ),
        (
            lambda: turbo_inductor.ops.rmsnorm_fp8(
                torch.randn(4, 64, device=DEVICE), torch.randn(4, 32, device=DEVICE), None, 1e-6, "rowwise"
            ),
            "residual",
        ),
        (
            lambda: turbo_inductor.ops.rmsnorm_fp8(torch.randn(4, 64, device=DEVICE), out_dtype=torch.int32),
            "rmsnorm_fp8: out_dtype must be one of float32, bfloat16, float16 or None, got torch.int32",
        ),
        (
            lambda: turbo_inductor.ops.glu_fp8(torch.randn(4, 64, device=DEVICE), recipe="tensorwise"),
            "glu_fp8: recipe must quantize x in blocks within a row",
        ),
        (lambda: turbo_inductor.ops.glu_fp8(torch.randn(4, 63, device=DEVICE)), "it must be even"),
        (
            lambda: turbo_inductor.ops.glu_fp8(torch.randn(4, 64, device=DEVICE), torch.randn(4, 32, device=DEVICE)),
            "up .* must match gate",
        ),
    ],
)
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("residual", [True, False])
def test_out_dtype_writes_the_norms_output_cast_and_takes_its_gradient(impl, residual):
    """Under autocast an fp32 norm's output is cast to bf16 for its linears: with ``out_dtype`` the norm writes y as
    that cast (one rounding from fp32, as the cast's), q is y's quantization, and the gradients equal those of the
    norm then the cast (the norm's backward reads dy in bf16, as the cast's backward would have converted it)."""
    x = torch.randn(3, 8, 128, device=DEVICE, dtype=torch.bfloat16 if residual else torch.float32, requires_grad=True)
    r = torch.randn(3, 8, 128, device=DEVICE, requires_grad=True) if residual else None
    w = torch.randn(128, device=DEVICE, requires_grad=True)
    y, total, q, scale = turbo_inductor.ops.rmsnorm_fp8(x, r, w, 1e-6, "rowwise", impl=impl, out_dtype=torch.bfloat16)
    assert y.dtype == torch.bfloat16 and (total.dtype == torch.float32 if residual else total.numel() == 0)
    plain = (
        turbo_inductor.ops.rmsnorm_residual(x, r, w, 1e-6, impl=impl)[0]
        if residual
        else turbo_inductor.ops.rmsnorm(x, w, 1e-6, impl=impl)
    )
    want = plain.to(torch.bfloat16)
    if impl == "triton" and interpreting():
        # the interpreter truncates fp32 -> bf16 where the cast rounds: an ulp
        torch.testing.assert_close(y, want, rtol=2**-7, atol=0)
    else:
        assert torch.equal(y, want)
    assert_bitwise_equal((q, scale), quantize_rows(impl, y.reshape(-1, 128), 10**6, False))
    dy = torch.randn_like(y)
    got = torch.autograd.grad(y, [t for t in (x, r, w) if t is not None], dy)
    want_grads = torch.autograd.grad(want, [t for t in (x, r, w) if t is not None], dy)
    for g, w_ in zip(got, want_grads):
        assert g.dtype == w_.dtype
        torch.testing.assert_close(g, w_, rtol=1e-5, atol=1e-5)
