"""Grouped GEMM ops (MoE experts), bf16/fp32 and FP8: forward and gradients against float64 for each implementation,
the FP8 recipes at their SNR gates, groups of every shape (empty, odd sizes, one expert taking every token, rows past
the last group), weights as transformers and torchtitan pass them, fakes, bad input, and the rewrite predicates."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import turbo_inductor
from turbo_inductor.kernels import registry
from turbo_inductor.ops.fp8_grouped_mm import can_rewrite_fp8, saves_x
from turbo_inductor.ops.fp8_operands import kernel_block, weight_operands
from turbo_inductor.ops.grouped_mm import GroupedMMNode, can_rewrite
from turbo_inductor.ops.library import OpInputError
from turbo_inductor.recipes import RECIPES
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.compare import ops_and_fp8_fills
from turbo_inductor.testing.grouped_mm import case
from turbo_inductor.testing.tolerance import TOLERANCE, snr_db

ops = turbo_inductor.ops
GRADIENT_GATE = {"e4m3": 25.0, "e5m2": 20.0}
# The interpreter's fp8 stores round wrongly near binade edges: SNR gates run on the reference quantization on CPU.
EXACT_IMPL = "auto" if DEVICE == "cuda" else "reference"
IMPLS = ["reference", "triton"] + (["auto"] if DEVICE == "cuda" else [])
TRITON_FP8 = (
    "fp8_quantize=reference,fp8_quantize_grouped=reference,fp8_quantize_grouped_rows=reference,"
    "fp8_grouped_gemm=triton,fp8_grouped_gemm_wgrad=triton,grouped_gemm_wgrad=triton"
)


def float64_reference(x, parameter, weight, offs, dy):
    """y, dx, d(parameter) in float64, by an explicit loop over the groups."""
    x64, p64 = (t.detach().double().requires_grad_() for t in (x, parameter))
    w64, ends = weight(p64), [0] + offs.tolist()
    y = torch.zeros(x.shape[0], w64.shape[2], dtype=torch.float64, device=x.device)
    for g in range(len(ends) - 1):
        y[ends[g] : ends[g + 1]] = x64[ends[g] : ends[g + 1]] @ w64[g]
    y.backward(dy.double())
    return y.detach(), x64.grad, p64.grad


def _close(got, want, dtype):
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * max(1.0, want.abs().max().item()))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "pattern, dtype, weight_layout",
    [
        ("odd sizes", torch.float32, "transposed"),
        ("one expert takes every token", torch.bfloat16, "contiguous"),
        ("empty first and last, rows past the last group", torch.bfloat16, "transposed"),
    ],
)
def test_forward_and_gradients_match_float64(impl, pattern, dtype, weight_layout):
    x, parameter, weight, offs = case(pattern, 32, 48, dtype, weight_layout)
    y = ops.grouped_mm(x, weight(parameter), offs, impl=impl)
    dy = torch.randn_like(y)
    y.backward(dy)
    want_y, want_dx, want_dp = float64_reference(x, parameter, weight, offs, dy)
    assert y.dtype == dtype and y.shape == want_y.shape and y.is_contiguous()
    _close(y, want_y, dtype)
    _close(x.grad, want_dx, dtype)
    _close(parameter.grad, want_dp, dtype)
    # the parameter's gradient in its own layout, with no copy; the rows past the last group: zero, zero gradient
    assert parameter.grad.is_contiguous()
    last = offs[-1].item()
    assert y[last:].count_nonzero() == 0 and x.grad[last:].count_nonzero() == 0


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_fp8_recipes_meet_the_snr_gates(recipe):
    """Out >= 25 dB, dx >= 25 dB (20 where the gradient is e5m2), dW >= 20 dB against float64; every group shape
    at once: empty first and last groups, odd sizes, rows past the last group. K 256: two 128-wide blocks."""
    sizes = [0, 5, 17, 1, 9, 0]
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(sum(sizes) + 3, 256, generator=gen).to(DEVICE, torch.bfloat16).requires_grad_()
    parameter = (torch.randn(len(sizes), 48, 256, generator=gen) / 16).to(DEVICE, torch.bfloat16).requires_grad_()
    offs = torch.tensor(sizes, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(DEVICE)
    weight = lambda p: p.transpose(-2, -1)  # noqa: E731
    y = ops.fp8_grouped_mm(x, weight(parameter), offs, recipe, impl=EXACT_IMPL)
    with torch.no_grad():  # the inference op: the same forward, no operands quantized for a backward
        assert torch.equal(ops.fp8_grouped_mm(x, weight(parameter), offs, recipe, impl=EXACT_IMPL), y)
    dy = torch.randn_like(y)
    y.backward(dy)
    want_y, want_dx, want_dp = float64_reference(x, parameter, weight, offs, dy)
    r = RECIPES[recipe]
    assert y.dtype == torch.bfloat16 and parameter.grad.is_contiguous()
    assert snr_db(y, want_y) >= 25
    assert snr_db(x.grad, want_dx) >= GRADIENT_GATE[r.gradient_format]
    assert snr_db(parameter.grad, want_dp) >= (40 if r.high_precision_wgrad else 20)
    assert y[-3:].count_nonzero() == 0 and x.grad[-3:].count_nonzero() == 0
    assert parameter.grad[0].count_nonzero() == 0 and parameter.grad[-1].count_nonzero() == 0  # empty groups


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "blockwise", "mxfp8"])
def test_fp8_triton_kernels_match_the_reference(recipe):
    """The Triton FP8 grouped GEMMs (epilogue scales, per-chunk scales, e5m2 gradients) on the same quantized operands
    as the reference: the same exact products summed in another order. The weight contiguous [E, K, N]: the other
    flattening of W and the dW layout of a contiguous weight."""
    x, parameter, weight, offs = case(
        "empty first and last, rows past the last group", 128, 32, weight_layout="contiguous"
    )
    results = []
    for impl in (TRITON_FP8, "reference"):
        for t in (x, parameter):
            t.grad = None
        y = ops.fp8_grouped_mm(x, weight(parameter), offs, recipe, impl=impl)
        y.backward(torch.linspace(-1, 1, y.numel(), device=DEVICE).view(y.shape))
        results.append((y.detach(), x.grad, parameter.grad))
    tol = 1e-5 if DEVICE == "cpu" else 1e-3
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol * want.abs().max().item())


def test_opcheck():
    x, parameter, weight, offs = case("empty first and last, rows past the last group", 32, 48)
    w = weight(parameter)
    torch.library.opcheck(torch.ops.turbo_inductor.grouped_mm, (x, w, offs, "reference"))
    for transposed in (False, True):
        dy = torch.randn(x.shape[0], 48, device=DEVICE)
        torch.library.opcheck(
            torch.ops.turbo_inductor.grouped_mm_wgrad, (x.detach(), dy, offs, transposed, "reference")
        )
    # FP8 outputs cannot be compared on CPU by the schema test (as ops/test_fp8_linear.py's test_opcheck): skipped
    # where an op returns (takes) fp8 tensors. The public op gets every test, AOT autograd included.
    no_schema = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    x, parameter, weight, offs = case("odd sizes", 32, 32)
    torch.library.opcheck(torch.ops.turbo_inductor.fp8_grouped_mm, (x, weight(parameter), offs, "rowwise", "reference"))
    fwd = torch.ops.turbo_inductor.fp8_grouped_mm_fwd
    for recipe in ("rowwise", "mxfp8"):  # mxfp8: W's rows padded to whole 32-row blocks, the scales cut back
        torch.library.opcheck(fwd, (x, weight(parameter), offs, recipe, "reference"), test_utils=no_schema[:2])
    saved = fwd(x.detach(), weight(parameter.detach()), offs, "rowwise", "reference")[1:]
    dy = torch.randn(x.shape[0], 32, device=DEVICE)
    torch.library.opcheck(
        torch.ops.turbo_inductor.fp8_grouped_mm_bwd,
        (dy, None, weight(parameter.detach()), offs, *saved, "rowwise", "reference"),
        test_utils=no_schema,
    )
    # a weight that wants no gradient: no x^T saved, an empty dweight
    saved = fwd(x.detach(), weight(parameter.detach()), offs, "rowwise", "reference", False)[1:]
    assert saved[0].numel() == 0
    dx, dweight = torch.ops.turbo_inductor.fp8_grouped_mm_bwd(
        dy, None, weight(parameter.detach()), offs, *saved, "rowwise", "reference"
    )
    assert dx.shape == x.shape and dweight.shape == (0,)


@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise"])
def test_the_fp8_gemms_accumulate_fast_in_the_forward_as_the_recipe_says_and_in_the_backward(recipe, monkeypatch):
    """The forward GEMM sums in the tensor cores' fast mode where the recipe says so; the experts' dgrad and wgrad
    sum fast (FAST_ACCUM_DGRAD, FAST_ACCUM_WGRAD: docs/fp8.md, "The rows-grouped GEMM")."""
    asked = []
    select = registry.select

    def recording(kernel, device, impl=registry.AUTO):
        fn = select(kernel, device, impl)
        if kernel not in ("fp8_grouped_gemm", "fp8_grouped_gemm_wgrad"):
            return fn
        return lambda *args, **kwargs: asked.append((kernel, kwargs.get("fast_accum"))) or fn(*args, **kwargs)

    monkeypatch.setattr(registry, "select", recording)
    x, parameter, weight, offs = case("odd sizes", 32, 48)
    y = ops.fp8_grouped_mm(x, weight(parameter), offs, recipe, impl="reference")
    y.backward(torch.randn_like(y))
    forward = ("fp8_grouped_gemm", RECIPES[recipe].fast_accum_forward)
    assert asked == [forward, ("fp8_grouped_gemm", True), ("fp8_grouped_gemm_wgrad", True)]


@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise", "blockwise"])
def test_without_saving_w_t_the_backward_quantizes_it_again_to_the_same_results(recipe):
    """save_weight_t=False: the forward returns no W^T (nothing of W's FP8 is held until the backward), and the
    backward quantizes it from W, as the forward would have: outputs and gradients bit-equal to saving it."""
    x, parameter, weight, offs = case("empty first and last, rows past the last group", 32, 48)
    dy = torch.randn(x.shape[0], 48, device=DEVICE)
    results = []
    for save in (True, False):
        for t in (x, parameter):
            t.grad = None
        fwd = torch.ops.turbo_inductor.fp8_grouped_mm_fwd
        w_t = fwd(x.detach(), weight(parameter.detach()), offs, recipe, EXACT_IMPL, save_weight_t=save)[3]
        assert (w_t.dim() == 3) is save
        y = ops.fp8_grouped_mm(x, weight(parameter), offs, recipe, impl=EXACT_IMPL, save_weight_t=save)
        y.backward(dy)
        results.append((y.detach(), x.grad, parameter.grad))
    for got, want in zip(*results, strict=True):
        assert torch.equal(got, want)


def test_the_eager_backward_gets_no_zero_filled_gradient_of_the_saved_fp8_operands():
    """The saved FP8 operands (x^T, W^T) are outputs of the forward op that take no gradient: eager autograd would
    hand the backward a zero-filled tensor of each (W^T: as large as W), unless told not to."""
    x, parameter, weight, offs = case("empty first and last, rows past the last group", 32, 48)
    y = ops.fp8_grouped_mm(x, weight(parameter), offs, "rowwise", impl=EXACT_IMPL)
    ran, fills = ops_and_fp8_fills(lambda: y.backward(torch.randn_like(y)))
    assert "fp8_grouped_mm_bwd" in ran and fills == []


@pytest.mark.parametrize(
    "recipe, k, n",
    [("rowwise", 32, 48), ("rowwise", 48, 32), ("tensorwise", 32, 48), ("blockwise", 32, 48)]
    + [("rowwise_with_gw_hp", 32, 48)],
)
def test_fp8_fakes_give_each_outputs_layout(recipe, k, n):
    """fp8_grouped_mm_fwd's and _bwd's fakes against the real outputs: shape, dtype and strides of each, the saved
    x^T in the padded layout included (rowwise: x's bytes transposed where K > N, else x saved), with a weight
    gradient and without (opcheck cannot compare FP8 outputs on CPU: test_opcheck)."""
    x, parameter, weight, offs = case("empty first and last, rows past the last group", k, n)
    x, w, dy = x.detach(), weight(parameter.detach()), torch.randn(x.shape[0], n, device=DEVICE)
    x_saved = saves_x(recipe, x, w)

    def forward_and_backward(x, w, offs, dy, weight_grad):
        fwd = torch.ops.turbo_inductor.fp8_grouped_mm_fwd(x, w, offs, recipe, EXACT_IMPL, weight_grad)
        saved_x = x if x_saved and weight_grad else None
        return *fwd, *torch.ops.turbo_inductor.fp8_grouped_mm_bwd(dy, saved_x, w, offs, *fwd[1:], recipe, EXACT_IMPL)

    for weight_grad in (True, False):
        real = forward_and_backward(x, w, offs, dy, weight_grad)
        with FakeTensorMode() as mode:
            fake = forward_and_backward(*(mode.from_tensor(t) for t in (x, w, offs, dy)), weight_grad)
        for i, (r, f) in enumerate(zip(real, fake)):
            assert (f.shape, f.dtype, f.stride()) == (r.shape, r.dtype, r.stride()), f"output {i}"


@pytest.mark.parametrize("recipe", ["rowwise", "blockwise", "tensorwise"])
@pytest.mark.parametrize("weight_layout", ["transposed", "contiguous"])
def test_the_dgrad_weight_operand_is_the_forward_copy_transposed(recipe, weight_layout):
    """W quantized once for both GEMMs: the dgrad operand is the forward's q transposed by the Triton kernel, in
    row-major strides, its scales the forward's transposed, with or without the forward's (``save_weight_t=False``'s
    backward). Where both layouts' blocks cut the same elements (tensorwise per expert, blockwise's 128 x 128), that
    is bit for bit W quantized in the dgrad's own layout; rowwise's scales lie along the contracted N."""
    # K 64, N 128 (blockwise: whole blocks of N, a partial one of K)
    parameter = torch.randn((3, 64, 128) if weight_layout == "contiguous" else (3, 128, 64), device=DEVICE)
    w = parameter if weight_layout == "contiguous" else parameter.transpose(-2, -1)
    quantize = registry.implementations("fp8_quantize")["reference"].fn
    (q, scale), (q_t, scale_t) = weight_operands(w, recipe, quantize, True, True, impl="triton")
    assert q_t.is_contiguous() and q_t.shape == (3, 64, 128)
    assert torch.equal(q_t.view(torch.uint8), q.transpose(1, 2).view(torch.uint8))
    assert torch.equal(scale_t, scale.transpose(1, 2))
    alone = weight_operands(w, recipe, quantize, False, True, impl="triton")
    assert alone[0] is None and all(torch.equal(a.view(b.dtype), b) for a, b in zip(alone[1], (q_t, scale_t)))
    if recipe == "rowwise":
        assert scale_t.shape == (3, 1, 128)
        return
    for g in range(3):  # each expert's W [K, N] quantized in the recipe's blocks
        want_q, want_scale = quantize(
            w[g], torch.float8_e4m3fn, *kernel_block(RECIPES[recipe].weight_block, 64, 128), False
        )
        assert torch.equal(q_t[g].view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(scale_t[g], want_scale)


@pytest.mark.parametrize("recipe", ["rowwise", "rowwise_pow2"])
def test_the_rowwise_dgrad_moves_w_scales_onto_dy_as_accurately_as_quantizing_w_again(recipe):
    """The rowwise dgrad reads W's forward copy transposed, W^T's row scales moved onto dy's columns (per expert, the
    forward launching ``fp8_transpose`` and the backward ``fp8_quantize_grouped_rows``): W quantized once. Where W's
    rows differ up to 100-fold in size and the experts' by 2^12, dx against float64 meets the 25 dB gate and is within
    0.5 dB of the other reading of the recipe, W quantized again per row of the dgrad's [K, N]."""
    sizes, k, n = [40, 0, 23, 65], 64, 96
    gen = torch.Generator().manual_seed(7)
    rows_size = torch.exp2(torch.rand(len(sizes), n, 1, generator=gen) * 6.64) * torch.exp2(
        torch.tensor([-6.0, 0.0, 3.0, 6.0])
    ).view(-1, 1, 1)
    parameter = (torch.randn(len(sizes), n, k, generator=gen) * rows_size / k**0.5).to(DEVICE).requires_grad_()
    x = torch.randn(sum(sizes), k, generator=gen).to(DEVICE).requires_grad_()
    offs = torch.tensor(sizes, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(DEVICE)
    dy = torch.randn(sum(sizes), n, generator=gen).to(DEVICE)
    registry.reset_kernel_calls()
    ops.fp8_grouped_mm(x, parameter.transpose(-2, -1), offs, recipe, impl="reference").backward(dy)
    calls = registry.kernel_calls()
    assert calls[("fp8_transpose", "reference")] == 1 and calls[("fp8_quantize_grouped_rows", "reference")] == 1
    quantize, pow2 = registry.implementations("fp8_quantize")["reference"].fn, RECIPES[recipe].power_of_two
    dy_q, dy_scale = quantize(dy, torch.float8_e4m3fn, 1, n, False, power_of_two=pow2)
    want, again = torch.zeros_like(x, dtype=torch.float64), torch.zeros_like(x)
    for g, (start, end) in enumerate(zip([0] + offs.tolist(), offs.tolist())):
        w = parameter[g].detach().t()  # [K, N]
        want[start:end] = dy[start:end].double() @ w.double().t()
        w_q, w_scale = quantize(w, torch.float8_e4m3fn, 1, n, False, power_of_two=pow2)
        again[start:end] = (dy_q[start:end].float() * dy_scale[start:end]) @ (w_q.float() * w_scale).t()
    got = snr_db(x.grad, want)
    assert got >= 25 and got >= snr_db(again, want) - 0.5, (got, snr_db(again, want))


@pytest.mark.parametrize("recipe", ["rowwise", "rowwise_pow2"])
@pytest.mark.parametrize(
    "k, n, top_k",
    [(96, 32, None), (32, 96, None), (32, 96, 2)],
    ids=["x moved (K > N)", "x moved (K < N, rows of their own)", "dy moved (K < N, a top-2 permute's tokens)"],
)
def test_the_rowwise_wgrad_moves_one_operands_fp8_bytes_and_folds_its_row_scales(recipe, k, n, top_k):
    """The rowwise wgrad moves one operand's rowwise FP8 bytes into the padded per-group layout and scales the other's
    rows by their row scales before quantizing it per group and column. Where the rows of x and of dy differ up to
    2^12-fold, dW against float64 meets the 20 dB gate and is within 0.5 dB of the other reading, both operands
    quantized per group and column from their own values. The forward saves x's bytes transposed with their row
    scales, or, where dy is wider and x is the tokens of a permute to 2 experts (bf16 x then holds no more bytes than
    x^T in FP8), x itself, whose rows the backward reads through the positions."""
    sizes = [40, 0, 23, 65]
    rows = sum(sizes)
    gen = torch.Generator().manual_seed(11)
    rows_size = lambda r: torch.exp2(torch.rand(r, 1, generator=gen) * 12 - 6)  # noqa: E731
    tokens = rows if top_k is None else rows // top_k
    x = (torch.randn(tokens, k, generator=gen) * rows_size(tokens)).to(DEVICE, torch.bfloat16).requires_grad_()
    parameter = (torch.randn(len(sizes), n, k, generator=gen) / k**0.5).to(DEVICE, torch.bfloat16).requires_grad_()
    dy = (torch.randn(rows, n, generator=gen) * rows_size(rows)).to(DEVICE, torch.bfloat16)
    offs = torch.tensor(sizes, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(DEVICE)
    w, pow2 = parameter.transpose(-2, -1), RECIPES[recipe].power_of_two
    permuted = {}
    if top_k is not None:  # the permute's output: row positions[t, j] holds token t, quantized per row
        positions = torch.randperm(rows, generator=gen).view(tokens, top_k).to(DEVICE)
        token_of_row = torch.empty(rows, dtype=torch.int64, device=DEVICE)
        token_of_row[positions.reshape(-1)] = torch.arange(rows, device=DEVICE) // top_k
        x_q, x_scale = registry.implementations("fp8_quantize")["reference"].fn(
            x.detach()[token_of_row], torch.float8_e4m3fn, 1, k, False, power_of_two=pow2
        )
        permuted = dict(x_q=x_q, x_scale=x_scale, positions=positions)
    x_rows = x.detach() if top_k is None else x.detach()[token_of_row]
    registry.reset_kernel_calls()
    ops.fp8_grouped_mm(x, w, offs, recipe, impl="reference", **permuted).backward(dy)
    calls = registry.kernel_calls()
    assert calls[("fp8_transpose_grouped", "reference")] == 1 and calls[("fp8_quantize_grouped", "reference")] == 1
    want = float64_reference(x_rows, parameter, lambda p: p.transpose(-2, -1), offs, dy)[2]
    # The other reading: x^T and dy^T each quantized per group and column from their own values.
    grouped = registry.implementations("fp8_quantize_grouped")["reference"].fn
    (x_t, x_s, padded), (dy_t, dy_s, _) = (grouped(t, offs, torch.float8_e4m3fn, pow2) for t in (x_rows, dy))
    again, ends = torch.zeros_like(want), padded.tolist()
    for g, (start, end) in enumerate(zip([0] + ends, ends)):
        a, b = x_t[:, start:end].double() * x_s[g, :, None], dy_t[:, start:end].double() * dy_s[g, :, None]
        again[g] = b @ a.t()
    got = snr_db(parameter.grad, want)
    assert got >= 20 and got >= snr_db(again, want) - 0.5, (got, snr_db(again, want))

    fwd = torch.ops.turbo_inductor.fp8_grouped_mm_fwd(
        x.detach(), w.detach(), offs, recipe, "reference", True, *permuted.values()
    )
    if top_k is None:
        x_q, x_scale = registry.implementations("fp8_quantize")["reference"].fn(
            x_rows, torch.float8_e4m3fn, 1, k, False, power_of_two=pow2
        )
        moved = registry.implementations("fp8_transpose_grouped")["reference"].fn(x_q, offs)[0]
        assert torch.equal(fwd[1].view(torch.uint8), moved.view(torch.uint8)) and torch.equal(fwd[2], x_scale)
        assert not saves_x(recipe, x, w)
    else:
        assert fwd[1].numel() == 0 and saves_x(recipe, x, w, positions)


def test_no_rows_gives_empty_outputs_and_zero_weight_gradients():
    x, parameter, weight, offs = case("odd sizes", 32, 32)
    x = x.detach()[:0].requires_grad_()
    offs = torch.zeros_like(offs)
    for y in (ops.grouped_mm(x, weight(parameter), offs), ops.fp8_grouped_mm(x, weight(parameter), offs)):
        assert y.shape == (0, 32)
        y.sum().backward()
        assert parameter.grad.count_nonzero() == 0 and parameter.grad.shape == parameter.shape
        parameter.grad = None


def _bad(**changes):
    """Good CPU inputs (offs values are checked on the host only) with ``changes``."""
    x, parameter, weight, offs = case("odd sizes", 32, 32)
    args = dict(x=x.detach().cpu(), weight=weight(parameter.detach()).cpu(), offs=offs.cpu()) | changes
    return args["x"], args["weight"], args["offs"]


@pytest.mark.parametrize(
    "args, message",
    [
        (lambda: _bad(x=torch.ones(26, 32, dtype=torch.int32)), "x has dtype torch.int32"),
        (lambda: _bad(weight=torch.randn(32, 32)), "weight must be 3-D"),
        (lambda: _bad(weight=torch.randn(4, 32, 32, dtype=torch.bfloat16)), "in x's dtype"),
        (lambda: _bad(weight=torch.randn(4, 16, 32)), "must share K"),
        (lambda: _bad(offs=torch.tensor([1, 4, 21, 26])), "offs must be a 1-D int32 tensor"),
        (lambda: _bad(offs=torch.tensor([[1, 4, 21, 26]], dtype=torch.int32)), "offs must be a 1-D int32 tensor"),
        (lambda: _bad(offs=torch.tensor([1, 4, 26], dtype=torch.int32)), "4 values, got 3"),
        (lambda: _bad(offs=torch.tensor([1, 4, 3, 26], dtype=torch.int32)), r"non-decreasing within \[0, 26\]"),
        (lambda: _bad(offs=torch.tensor([1, 4, 21, 27], dtype=torch.int32)), r"non-decreasing within \[0, 26\]"),
        (lambda: _bad(offs=torch.tensor([1, 4, 21, 26], dtype=torch.int32, device="meta")), "different devices"),
    ],
)
def test_bad_input_is_named(args, message):
    x, weight, offs = args()
    for call in (ops.grouped_mm, lambda *a: ops.fp8_grouped_mm(*a, impl="reference")):
        with pytest.raises(OpInputError, match=message):
            call(x, weight, offs)


@pytest.mark.parametrize(
    "host_offs, message",
    [
        (torch.tensor([1, 4, 21], dtype=torch.int32), r"copy_to_host of a tensor of shape \[4\], got cpu \[3\]"),
        (torch.tensor([1, 4, 21, 26], dtype=torch.int32, device="meta"), "got meta"),
        (torch.tensor([1, 4, 21, 26]), "host_offs must have dtype torch.int32, got torch.int64"),
    ],
)
def test_a_bad_host_copy_of_offs_is_named(host_offs, message):
    x, weight, offs = _bad()
    dy = torch.randn(x.shape[0], weight.shape[2])
    for call in (
        lambda: ops.grouped_mm(x, weight, offs, host_offs=host_offs),
        lambda: torch.ops.turbo_inductor.grouped_mm_wgrad(x, dy, offs, False, "auto", host_offs),
    ):
        with pytest.raises(OpInputError, match=message):
            call()


def test_a_host_copy_of_offs_is_read_in_their_place_forward_and_backward():
    """Where given, offs' host copy is what an implementation reading offs on the host reads (the reference here),
    forward and backward: given a copy of other offs, the results are those of the other offs."""
    x, parameter, weight, offs = case("empty first and last, rows past the last group", 32, 48)
    assert torch.equal(ops.copy_to_host(offs), offs.cpu()) and ops.copy_to_host(offs).device.type == "cpu"
    other = torch.tensor([5, 5, 17, x.shape[0]], dtype=torch.int32, device=DEVICE)
    dy = torch.randn(x.shape[0], 48, device=DEVICE)
    results = []
    for offs_read, host_offs in ((other, None), (offs, ops.copy_to_host(other))):
        y = ops.grouped_mm(x, weight(parameter), offs_read, impl="reference", host_offs=host_offs)
        y.backward(dy)
        results.append((y.detach(), x.grad, parameter.grad))
        x.grad = parameter.grad = None
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    host = ops.copy_to_host(offs)
    torch.library.opcheck(torch.ops.turbo_inductor.copy_to_host, (offs,))
    torch.library.opcheck(torch.ops.turbo_inductor.grouped_mm, (x, weight(parameter), offs, "reference", host))
    wgrad = torch.ops.turbo_inductor.grouped_mm_wgrad
    torch.library.opcheck(wgrad, (x.detach(), dy, offs, True, "reference", host))


def test_fp8_bad_input_is_named():
    x, weight, offs = _bad()
    with pytest.raises(OpInputError, match="recipe must be one of"):
        ops.fp8_grouped_mm(x, weight, offs, "fp4")
    with pytest.raises(OpInputError, match=r"multiples of 16 for the FP8 GEMM, got \[32, 24\]"):
        ops.fp8_grouped_mm(x, torch.randn(4, 32, 24, device=x.device), offs)


def test_fp8_backward_bad_saved_operands_are_named():
    """The backward's saved operands as the forward leaves them, or a named error: x and x^T both, x for a recipe whose
    wgrad takes x^T, positions without x or not covering dy's rows."""
    x, parameter, weight, offs = case("odd sizes", 32, 32)
    x, w = x.detach(), weight(parameter.detach())
    dy = torch.randn(x.shape[0], 32, device=DEVICE)
    bwd = torch.ops.turbo_inductor.fp8_grouped_mm_bwd
    saved = torch.ops.turbo_inductor.fp8_grouped_mm_fwd(x, w, offs, "rowwise", "reference")[1:]
    positions = torch.arange(x.shape[0], device=DEVICE).view(-1, 1)
    for args, message in (
        ((dy, x, w, offs, *saved, "rowwise"), "give x or x_t for the wgrad, not both"),
        ((dy, x, w, offs, *saved, "tensorwise"), "x must be None for recipe 'tensorwise'"),
        ((dy, None, w, offs, *saved, "rowwise", "reference", positions), "positions is for x saved as the forward's"),
        (
            (dy[:-1], x, w, offs, *(t.new_empty(0) for t in saved[:2]), *saved[2:], "rowwise", "reference", positions),
            "dy's 25",
        ),
    ):
        with pytest.raises(OpInputError, match=message):
            bwd(*args)


def test_rewrite_predicates():
    x, parameter, weight, offs = case("odd sizes", 32, 48)
    assert can_rewrite(x, weight(parameter), offs)
    assert can_rewrite_fp8(x, weight(parameter), offs)
    assert not can_rewrite(x, weight(parameter), offs.long())
    assert not can_rewrite(x, weight(parameter)[:3], offs)
    assert can_rewrite(x, weight(parameter)[..., :40], offs)
    assert not can_rewrite_fp8(x, weight(parameter)[..., :40], offs)  # N = 40: no FP8 GEMM shape
    assert GroupedMMNode.call_arguments(x=1, weight=2, offs=3) == ((1, 2, 3), {})
