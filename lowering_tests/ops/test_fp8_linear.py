"""FP8 linear: the op against fp32 math at the SNR gates, opcheck, its bad input, a weight quantized ahead of
time, and W^T quantized again in the backward."""

import pytest
import torch
import torch.nn.functional as F

import turbo_inductor
from turbo_inductor.ops.fp8 import quantize_weight
from turbo_inductor.ops.library import OpInputError
from turbo_inductor.recipes import RECIPES
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.compare import ops_and_fp8_fills
from turbo_inductor.testing.tolerance import snr_db

GRADIENT_GATE = {"e4m3": 25.0, "e5m2": 20.0}  # the FP8 gates (docs/fp8.md): SNR in dB by gradient format
# Triton's CPU interpreter rounds ~2% of fp8 stores wrongly: the SNR gates are checked with the reference kernels
# on CPU and with the default (fastest) ones on the GPU.
EXACT_IMPL = "auto" if DEVICE == "cuda" else "reference"


def make(*shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, device=DEVICE) * scale).to(dtype).requires_grad_()


@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize(
    "dtype, weight_dtype",
    [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32)],
    ids=["fp32", "bf16", "bf16 x, fp32 W"],  # the last: fp32 parameters under autocast
)
def test_op_meets_the_snr_gates_forward_and_backward(recipe, dtype, weight_dtype):
    x, w, b = make(3, 48, 256, dtype=dtype), make(128, 256, dtype=weight_dtype, scale=0.05), make(128, dtype=dtype)
    y = turbo_inductor.ops.fp8_linear(x, w, b, recipe, impl=EXACT_IMPL)
    dy = torch.randn_like(y)
    y.backward(dy)
    x32, w32, b32 = (t.detach().float().requires_grad_() for t in (x, w, b))
    ref = F.linear(x32, w32, b32)
    ref.backward(dy.float())
    gate = GRADIENT_GATE[RECIPES[recipe].gradient_format]
    assert y.dtype == dtype and y.shape == (3, 48, 128) and w.grad.dtype == weight_dtype
    assert snr_db(y, ref) >= 25
    assert snr_db(x.grad, x32.grad) >= gate
    assert snr_db(w.grad, w32.grad) >= (40 if RECIPES[recipe].high_precision_wgrad else gate)
    torch.testing.assert_close(b.grad.float(), b32.grad, rtol=2e-2, atol=2e-2 * b32.grad.abs().max().item())


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_opcheck(recipe):
    x, w, b = make(2, 16, 64), make(32, 64), make(32)
    # opcheck's schema test compares tensors before/after, and its AOT test sums every output, with ops that have
    # no fp8 kernel on CPU: where an op takes (returns) fp8 tensors, skip only that test (those tests). The public
    # op, over fp8_linear_fwd, gets every test, AOT autograd included.
    torch.library.opcheck(torch.ops.turbo_inductor.fp8_linear, (x, w, b, recipe, "reference"))
    no_schema = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    fwd = torch.ops.turbo_inductor.fp8_linear_fwd
    torch.library.opcheck(fwd, (x, w, b, recipe, "reference"), test_utils=no_schema[:2])
    # x^T and W^T come quantized from the forward; x itself only for a high-precision wgrad
    saved = fwd(x.detach(), w.detach(), b.detach(), recipe, "reference")[1:]
    x_saved = x.detach() if RECIPES[recipe].high_precision_wgrad else None
    torch.library.opcheck(
        torch.ops.turbo_inductor.fp8_linear_bwd,
        (torch.randn(2, 16, 32, device=DEVICE), x_saved, w.detach(), *saved, recipe, "reference"),
        test_utils=no_schema,
    )
    # where W^T was saved the backward needs no W (a concatenated W is then not held): the same results without it
    dy = torch.randn(2, 16, 32, device=DEVICE)
    bwd = torch.ops.turbo_inductor.fp8_linear_bwd
    given = bwd(dy, x_saved, w.detach(), *saved, recipe, "reference")
    for got, want in zip(bwd(dy, x_saved, None, *saved, recipe, "reference"), given, strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)
    torch.library.opcheck(bwd, (dy, x_saved, None, *saved, recipe, "reference"), test_utils=no_schema)
    # a weight that wants no gradient: no x^T saved, an empty dweight
    torch.library.opcheck(fwd, (x, w.detach(), b, recipe, "reference", None, None, False), test_utils=no_schema[:2])
    saved = fwd(x.detach(), w.detach(), b.detach(), recipe, "reference", None, None, False)[1:]
    assert saved[0].dim() == 1
    dx, dweight = torch.ops.turbo_inductor.fp8_linear_bwd(
        torch.randn(2, 16, 32, device=DEVICE), None, w.detach(), *saved, recipe, "reference"
    )
    assert dx.shape == x.shape and dweight.shape == (0,)
    torch.library.opcheck(
        torch.ops.turbo_inductor.fp8_linear_bwd,
        (torch.randn(2, 16, 32, device=DEVICE), None, w.detach(), *saved, recipe, "reference"),
        test_utils=no_schema,
    )
    # no W^T saved (save_weight_t False): the backward quantizes it from W
    torch.library.opcheck(fwd, (x, w, b, recipe, "reference", None, None, True, False), test_utils=no_schema[:2])
    saved = fwd(x.detach(), w.detach(), b.detach(), recipe, "reference", None, None, True, False)[1:]
    assert saved[2].dim() == 1
    with pytest.raises(OpInputError, match="weight may be None only where the forward saved W"):
        torch.ops.turbo_inductor.fp8_linear_bwd(dy, x_saved, None, *saved, recipe, "reference")
    torch.library.opcheck(
        torch.ops.turbo_inductor.fp8_linear_bwd,
        (torch.randn(2, 16, 32, device=DEVICE), x_saved, w.detach(), *saved, recipe, "reference"),
        test_utils=no_schema,
    )
    torch.library.opcheck(torch.ops.turbo_inductor.fp8_linear, (x, w, b, recipe, "reference", None, None, False))
    # an fp32 W beside a bf16 x (autocast): dW in fp32, also where the backward is given W's dtype alone
    x16, b16 = (t.detach().bfloat16().requires_grad_() for t in (x, b))
    torch.library.opcheck(torch.ops.turbo_inductor.fp8_linear, (x16, w, b16, recipe, "reference"))
    saved = fwd(x16.detach(), w.detach(), b16.detach(), recipe, "reference")[1:]
    x16_saved = x16.detach() if RECIPES[recipe].high_precision_wgrad else None
    dy16 = dy.bfloat16()
    bwd_fp32 = (dy16, x16_saved, None, *saved, recipe, "reference", torch.float32)
    assert bwd(*bwd_fp32)[1].dtype == torch.float32
    torch.library.opcheck(bwd, bwd_fp32, test_utils=no_schema)
    with pytest.raises(OpInputError, match=r"W's dtype must be dy's \(torch.bfloat16\) or float32"):
        bwd(*bwd_fp32[:-1], torch.float16)
    q = torch.ops.turbo_inductor.fp8_quantize(x.detach()[0], torch.float8_e4m3fn, 1, 64, False, False, "reference")
    torch.library.opcheck(
        torch.ops.turbo_inductor.fp8_quantize, (x.detach()[0], torch.float8_e4m3fn, 1, 64, True, False, "reference")
    )
    torch.library.opcheck(
        torch.ops.turbo_inductor.fp8_gemm, (q[0], q[1], q[0], q[1], torch.float32, "reference"), test_utils=no_schema
    )


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: turbo_inductor.ops.fp8_linear(make(4, 64), make(32, 64), None, "fp4"), "recipe must be one of"),
        (lambda: turbo_inductor.ops.fp8_linear(make(4, 64), make(30, 64)), "multiples of 16"),
        (lambda: turbo_inductor.ops.fp8_linear(make(4, 64), make(32, 48)), "K = x.shape"),
        (lambda: turbo_inductor.ops.fp8_linear(make(4, 64), make(32, 64), make(31)), "bias must be"),
        (
            lambda: turbo_inductor.ops.fp8_linear(make(4, 64, dtype=torch.bfloat16), make(32, 64, dtype=torch.half)),
            r"weight must be \[N, K\] in torch.bfloat16",
        ),
    ],
)
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_quantized_weight_gives_the_same_forward():
    x, w, b = make(4, 64, dtype=torch.bfloat16), make(32, 64, dtype=torch.bfloat16), make(32, dtype=torch.bfloat16)
    inference = torch.ops.turbo_inductor.fp8_linear_inference
    for recipe in sorted(RECIPES):
        w_q, w_scale = quantize_weight(w.detach(), recipe, EXACT_IMPL)
        torch.testing.assert_close(
            inference(x, None, b, recipe, EXACT_IMPL, None, None, w_q, w_scale),
            inference(x, w, b, recipe, EXACT_IMPL),
            rtol=0,
            atol=0,
        )
    # fp8 inputs: the schema test compares them, which fp8 tensors cannot on CPU (as test_opcheck)
    w_q, w_scale = quantize_weight(w.detach(), "rowwise", "reference")
    torch.library.opcheck(
        inference,
        (x, None, b, "rowwise", "reference", None, None, w_q, w_scale),
        test_utils=("test_autograd_registration", "test_faketensor"),
    )


def _quantized_weight(recipe="rowwise", shape=(32, 64)):
    return quantize_weight(torch.randn(*shape, device=DEVICE), recipe, "reference")


@pytest.mark.parametrize(
    "args, message",
    [
        (lambda: (make(32, 64), *_quantized_weight()), "one of them, got both"),
        (lambda: (None, None, None), "one of them, got neither"),
        (lambda: (None, _quantized_weight()[0], None), "w_q and w_scale must be given together"),
        (lambda: (None, _quantized_weight()[0].float(), _quantized_weight()[1]), "w_q must be"),
        (lambda: (None, *_quantized_weight(shape=(32, 48))), "w_q must be"),
        (lambda: (None, *_quantized_weight("blockwise")), "w_scale must be the rowwise scales of w"),
        (lambda: (None, *_quantized_weight(shape=(24, 64))), "multiples of 16"),
    ],
)
def test_bad_quantized_weight_is_named(args, message):
    weight, w_q, w_scale = args()
    with pytest.raises(ValueError, match=message):
        torch.ops.turbo_inductor.fp8_linear_inference(
            make(4, 64), weight, None, "rowwise", "reference", None, None, w_q, w_scale
        )


@pytest.mark.parametrize("impl", [EXACT_IMPL] + (["triton"] if DEVICE == "cpu" else []))
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_weight_t_not_saved_is_quantized_again_in_backward(recipe, impl):
    """``save_weight_t=False``: the forward returns no W^T for the backward, which quantizes it from W itself, to
    the same gradients bit for bit. Where W^T's scales are W's transposed (whole-tensor or square blocks), the forward
    returns those scales, the saved W^T's own, and the backward casts W^T by them."""
    x, w, b = make(3, 16, 64), make(32, 64, scale=0.1), make(32)
    scales_kept = RECIPES[recipe].weight_scales_transpose
    results, w_t_scales = {}, {}
    for save in (True, False):
        for t in (x, w, b):
            t.grad = None
        saved = torch.ops.turbo_inductor.fp8_linear_fwd(x, w, b, recipe, impl, None, None, True, save)[1:]
        assert (saved[2].dim(), saved[3].dim()) == ((2, 2) if save else (1, 2 if scales_kept else 1))
        w_t_scales[save] = saved[3]
        y = turbo_inductor.ops.fp8_linear(x, w, b, recipe, impl=impl, save_weight_t=save)
        y.backward(torch.linspace(-1, 1, y.numel(), device=DEVICE).view(y.shape))
        results[save] = y.detach(), x.grad, w.grad, b.grad
    for got, want in zip(results[False], results[True]):
        assert torch.equal(got, want)
    if not scales_kept:
        return
    assert torch.equal(w_t_scales[False], w_t_scales[True])
    assert w_t_scales[False].stride() == w_t_scales[True].stride()
    # The backward casts by the saved scales, not by W's own maxima: other scales give another dx.
    dy, w0, saved = torch.randn(3, 16, 32, device=DEVICE), w.detach(), [t.detach() for t in saved]
    dx = torch.ops.turbo_inductor.fp8_linear_bwd(dy, None, w0, *saved, recipe, impl)[0]
    # Scales 3x W^T's (a power of two would only shift exponents, exactly).
    dx_other = torch.ops.turbo_inductor.fp8_linear_bwd(dy, None, w0, *saved[:3], saved[3] * 3, recipe, impl)[0]
    assert not torch.equal(dx, dx_other)
    with pytest.raises(OpInputError, match=r"w_t_scale must be W\^T's scales"):
        torch.ops.turbo_inductor.fp8_linear_bwd(dy, None, w0, *saved[:3], saved[3].new_ones(2, 2), recipe, impl)


def test_the_eager_backward_gets_no_zero_filled_gradient_of_the_saved_fp8_operands():
    """x^T and W^T in FP8 are outputs of the forward op that take no gradient: eager autograd would hand the backward
    a zero-filled tensor of each (W^T: as large as W), unless told not to."""
    x, w = make(3, 16, 64), make(32, 64, scale=0.1)
    y = turbo_inductor.ops.fp8_linear(x, w, None, "tensorwise", impl=EXACT_IMPL)
    ran, fills = ops_and_fp8_fills(lambda: y.backward(torch.randn_like(y)))
    assert "fp8_linear_bwd" in ran and fills == []
