"""Grouped GEMM ops (MoE experts), bf16/fp32 and FP8: forward and gradients against float64 for each implementation,
the FP8 recipes at their SNR gates, groups of every shape (empty, odd sizes, one expert taking every token, rows past
the last group), weights as transformers and torchtitan pass them, bad input, and what torch's kernels take."""

from __future__ import annotations

import pytest
import torch
from compare import snr_db
from conftest import DEVICE, TOLERANCE
from torch._subclasses.fake_tensor import FakeTensorMode

import turbo_inductor
from turbo_inductor.kernels import registry
from turbo_inductor.kernels.reference.grouped_mm import group_bounds
from turbo_inductor.kernels.vendor import grouped_mm as vendor_grouped
from turbo_inductor.ops.fp8_grouped_mm import can_rewrite_fp8, weight_operands
from turbo_inductor.ops.fp8_operands import kernel_block
from turbo_inductor.ops.grouped_mm import GroupedMMNode, can_rewrite
from turbo_inductor.ops.library import OpInputError
from turbo_inductor.recipes import RECIPES

ops = turbo_inductor.ops
GRADIENT_GATE = {"e4m3": 25.0, "e5m2": 20.0}
# The interpreter's fp8 stores round wrongly near binade edges: SNR gates run on the reference quantization on CPU.
EXACT_IMPL = "auto" if DEVICE == "cuda" else "reference"
IMPLS = ["reference", "triton"] + (["auto"] if DEVICE == "cuda" else [])
TRITON_FP8 = (
    "fp8_quantize=reference,fp8_quantize_grouped=reference,fp8_grouped_gemm=triton,fp8_grouped_gemm_wgrad=triton,"
    "grouped_gemm_wgrad=triton"
)

# name: (rows per group, rows past the last group)
PATTERNS = {
    "odd sizes": ([1, 3, 17, 5], 0),
    "one expert takes every token": ([0, 0, 26, 0], 0),
    "empty first and last, rows past the last group": ([0, 9, 14, 0], 5),
    # groups holding whole 32-row chunks (the interpreter's) and partial ones at either end, or within one chunk
    "long groups": ([45, 70, 0, 3, 32], 2),
}


def case(pattern: str, k: int, n: int, dtype=torch.float32, weight_layout: str = "transposed", seed: int = 0):
    """(x, parameter, weight, offs): x [S, K] random, and ``weight(parameter)`` the weight [E, K, N], either as
    transformers and torchtitan pass it (the transpose of an [E, N, K] parameter) or contiguous."""
    sizes, padding = PATTERNS[pattern]
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(sizes) + padding, k, generator=gen)
    if weight_layout == "transposed":
        parameter = torch.randn(len(sizes), n, k, generator=gen) / k**0.5
        weight = lambda p: p.transpose(-2, -1)  # noqa: E731
    else:
        parameter = torch.randn(len(sizes), k, n, generator=gen) / k**0.5
        weight = lambda p: p  # noqa: E731
    offs = torch.tensor(sizes, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    x, parameter = (t.to(DEVICE, dtype).requires_grad_() for t in (x, parameter))
    return x, parameter, weight, offs.to(DEVICE)


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
    # FP8 outputs cannot be compared on CPU by the schema test (as test_fp8_linear.test_opcheck): skipped where an
    # op returns (takes) fp8 tensors. The public op gets every test, AOT autograd included.
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


@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise", "blockwise", "rowwise_with_gw_hp"])
def test_fp8_fakes_give_each_outputs_layout(recipe):
    """fp8_grouped_mm_fwd's and _bwd's fakes against the real outputs: shape, dtype and strides of each, the saved
    x^T in the padded layout included, with a weight gradient and without (opcheck cannot compare FP8 outputs on
    CPU: test_opcheck)."""
    x, parameter, weight, offs = case("empty first and last, rows past the last group", 32, 48)
    x, w, dy = x.detach(), weight(parameter.detach()), torch.randn(x.shape[0], 48, device=DEVICE)
    keeps_x = RECIPES[recipe].high_precision_wgrad

    def forward_and_backward(x, w, offs, dy, weight_grad):
        fwd = torch.ops.turbo_inductor.fp8_grouped_mm_fwd(x, w, offs, recipe, EXACT_IMPL, weight_grad)
        saved_x = x if keeps_x and weight_grad else None
        return *fwd, *torch.ops.turbo_inductor.fp8_grouped_mm_bwd(dy, saved_x, w, offs, *fwd[1:], recipe, EXACT_IMPL)

    for weight_grad in (True, False):
        real = forward_and_backward(x, w, offs, dy, weight_grad)
        with FakeTensorMode() as mode:
            fake = forward_and_backward(*(mode.from_tensor(t) for t in (x, w, offs, dy)), weight_grad)
        for i, (r, f) in enumerate(zip(real, fake)):
            assert (f.shape, f.dtype, f.stride()) == (r.shape, r.dtype, r.stride()), f"output {i}"


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


def test_fp8_bad_input_is_named():
    x, weight, offs = _bad()
    with pytest.raises(OpInputError, match="recipe must be one of"):
        ops.fp8_grouped_mm(x, weight, offs, "fp4")
    with pytest.raises(OpInputError, match=r"multiples of 16 for the FP8 GEMM, got \[32, 24\]"):
        ops.fp8_grouped_mm(x, torch.randn(4, 32, 24, device=x.device), offs)


def test_rewrite_predicates():
    x, parameter, weight, offs = case("odd sizes", 32, 48)
    assert can_rewrite(x, weight(parameter), offs)
    assert can_rewrite_fp8(x, weight(parameter), offs)
    assert not can_rewrite(x, weight(parameter), offs.long())
    assert not can_rewrite(x, weight(parameter)[:3], offs)
    assert can_rewrite(x, weight(parameter)[..., :40], offs)
    assert not can_rewrite_fp8(x, weight(parameter)[..., :40], offs)  # N = 40: no FP8 GEMM shape
    assert GroupedMMNode.call_arguments(x=1, weight=2, offs=3) == ((1, 2, 3), {})


def test_implementations_rank_vendor_then_triton_then_reference():
    for kernel in ("grouped_gemm", "grouped_gemm_wgrad", "fp8_grouped_gemm", "fp8_grouped_gemm_wgrad"):
        impls = registry.implementations(kernel)
        priority = {name: i.priority_on(torch.device("cuda")) for name, i in impls.items()}
        assert priority["triton"] > priority["reference"] and priority.get("vendor", 99) > priority["triton"]
        assert impls["triton"].priority_on(torch.device("cpu")) < priority["reference"]  # the interpreter is slow


def test_vendor_declines_what_torch_cannot_take_with_the_reason():
    assert "GPUs only" in registry.implementations("grouped_gemm")["vendor"].unavailable_reason(torch.device("cpu"))
    x = torch.randn(26, 32, dtype=torch.bfloat16)
    w = torch.randn(4, 48, 32, dtype=torch.bfloat16).transpose(-2, -1)
    offs = torch.tensor([1, 4, 21, 26], dtype=torch.int32)
    bf16 = torch.bfloat16
    supports = vendor_grouped.grouped_gemm_supports
    assert "NVIDIA GPUs only, not on cpu" in supports(x, w, offs, bf16)
    assert "bfloat16 only" in supports(x.half(), w.half(), offs, torch.half)
    assert "N a multiple of 8" in supports(x, w[..., :44], offs, bf16)
    assert "16-byte-aligned" in supports(x[:, 1:17], w[:, 1:17], offs, bf16)
    assert "x must be row-major" in supports(x.t().contiguous().t(), w, offs, bf16)
    assert "NVIDIA GPUs only" in vendor_grouped.grouped_gemm_wgrad_supports(x, x, offs, bf16)
    q, wq = torch.zeros(26, 32, dtype=torch.float8_e4m3fn), torch.zeros(4, 48, 32, dtype=torch.float8_e4m3fn)
    rowwise = (torch.ones(26, 1), torch.ones(4, 48, 1))
    fp8_supports = vendor_grouped.fp8_grouped_gemm_supports
    assert "NVIDIA GPUs only" in fp8_supports(q, rowwise[0], wq, rowwise[1], offs, bf16)
    assert "a scale per row of x" in fp8_supports(q, torch.ones(26, 2), wq, torch.ones(4, 48, 2), offs, bf16)
    e5m2 = q.view(torch.float8_e5m2)
    assert "float8_e4m3fn to bfloat16, got" in fp8_supports(e5m2, rowwise[0], wq, rowwise[1], offs, bf16)
    assert "float8_e4m3fn to bfloat16, got" in fp8_supports(q, rowwise[0], wq, rowwise[1], offs, torch.float32)
    # the weight gradient: x^T [K, S_pad] and dy^T [N, S_pad] in the padded layout, scales per group and row
    wgrad_supports = vendor_grouped.fp8_grouped_gemm_wgrad_supports
    x_t, dy_t = torch.zeros(32, 80, dtype=torch.float8_e4m3fn), torch.zeros(48, 80, dtype=torch.float8_e4m3fn)
    per_group = (torch.ones(4, 32, 1), torch.ones(4, 48, 1))
    assert "GPUs only" in wgrad_supports(x_t, per_group[0], dy_t, per_group[1], offs, bf16)
    assert "scales per group and row" in wgrad_supports(x_t, torch.ones(32, 1), dy_t, torch.ones(48, 1), offs, bf16)
    assert "both per group [4, rows blocks, 1]" in wgrad_supports(
        x_t, per_group[0], dy_t, torch.ones(48, 1), offs, bf16
    )
    assert "one scale per group and row" in wgrad_supports(x_t, torch.ones(4, 1, 1), dy_t, per_group[1], offs, bf16)
    e5m2_t = dy_t.view(torch.float8_e5m2)
    assert "float8_e4m3fn to bfloat16" in wgrad_supports(x_t, per_group[0], e5m2_t, per_group[1], offs, bf16)
    assert "the padded S multiples of 16" in wgrad_supports(
        x_t[:, :72], per_group[0], dy_t[:, :72], per_group[1], offs, bf16
    )


@pytest.mark.skipif(DEVICE != "cpu", reason="on a GPU the vendor kernels run in the tests above (impl auto)")
def test_vendor_bf16_kernels_on_torchs_cpu_grouped_mm(monkeypatch):
    """The vendor implementation around torch._grouped_mm's own CPU loop: the layouts it hands torch, and the rows
    past the last group zeroed (torch leaves them unwritten: garbage)."""
    monkeypatch.setattr(vendor_grouped, "device_unsupported", lambda device, weight_gradient=False: None)
    x, parameter, weight, offs = case("empty first and last, rows past the last group", 32, 48, torch.bfloat16)
    x, w, dy = x.detach(), weight(parameter.detach()), torch.randn(x.shape[0], 48).to(torch.bfloat16)
    reference = registry.implementations("grouped_gemm")["reference"].fn
    reference_wgrad = registry.implementations("grouped_gemm_wgrad")["reference"].fn
    assert vendor_grouped.grouped_gemm_supports(x, w, offs, torch.bfloat16) is None
    assert vendor_grouped.grouped_gemm_wgrad_supports(x, dy, offs, torch.bfloat16) is None
    got = vendor_grouped.grouped_gemm(x, w, offs, torch.bfloat16)
    torch.testing.assert_close(got, reference(x, w, offs, torch.bfloat16), rtol=1e-2, atol=1e-2)
    assert got[offs[-1] :].count_nonzero() == 0
    got = vendor_grouped.grouped_gemm_wgrad(x, dy, offs, torch.bfloat16)
    torch.testing.assert_close(got, reference_wgrad(x, dy, offs, torch.bfloat16), rtol=1e-2, atol=1e-2)


def _scaled_grouped_mm_checked(mat_a, mat_b, scale_a, scale_b, offs=None, out_dtype=None, use_fast_accum=False):
    """torch._scaled_grouped_mm on a CPU: its meta function checks dtypes, layouts and scale shapes; the product is
    computed from the scales as given, and the rows past offs[-1] are left as NaN (torch leaves them unwritten).
    Both operands 2-D (the weight gradient): the group sizes its CUDA kernel asserts on, checked."""
    meta = [
        torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta") for t in (mat_a, mat_b, scale_a, scale_b)
    ]
    torch.ops.aten._scaled_grouped_mm(*meta, offs=offs.to("meta"), out_dtype=out_dtype)
    assert scale_a.is_contiguous() and scale_b.is_contiguous()
    if mat_b.dim() == 2:
        ends = offs.tolist()
        sizes = [b - a for a, b in zip([0] + ends, ends)]
        assert all(n > 0 for n in sizes) and all(n % 16 == 0 for n in sizes[:-1]) and ends[-1] <= mat_a.shape[1]
        (m, _), n = mat_a.shape, mat_b.shape[1]
        a, b = mat_a.float(), mat_b.float()
        return torch.stack(
            [
                (a[:, start:end] * scale_a[g * m : (g + 1) * m, None])
                @ (b[start:end] * scale_b[g * n : (g + 1) * n][None, :])
                for g, (start, end) in enumerate(zip([0] + ends, ends))
            ]
        ).to(out_dtype)
    out = torch.full((mat_a.shape[0], mat_b.shape[2]), float("nan"), dtype=out_dtype)
    a, ends = mat_a.float() * scale_a[:, None], [0] + offs.tolist()
    for g in range(len(ends) - 1):
        b = mat_b[g].float() * scale_b[g][None, :]
        out[ends[g] : ends[g + 1]] = (a[ends[g] : ends[g + 1]] @ b).to(out_dtype)
    return out


@pytest.mark.skipif(DEVICE != "cpu", reason="on a GPU the vendor kernels run in the tests above (impl auto)")
@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise"])
@pytest.mark.parametrize("weight_layout", ["transposed", "contiguous"])
def test_the_fp8_operands_the_op_builds_are_what_torch_scaled_grouped_mm_takes(monkeypatch, recipe, weight_layout):
    """Both weight operands (the forward's W^T and dx's W), from either flattening of W, handed to
    torch._scaled_grouped_mm (a checked emulation on CPU): accepted as they are, with the reference's result."""
    monkeypatch.setattr(vendor_grouped, "device_unsupported", lambda device, weight_gradient=False: None)
    monkeypatch.setattr(torch, "_scaled_grouped_mm", _scaled_grouped_mm_checked)
    x, parameter, weight, offs = case(
        "empty first and last, rows past the last group", 32, 48, weight_layout=weight_layout
    )
    quantize = registry.implementations("fp8_quantize")["reference"].fn
    w = weight(parameter.detach())
    forward, backward = weight_operands(w, recipe, quantize, True, True)
    reference = registry.implementations("fp8_grouped_gemm")["reference"].fn
    for a, operand in ((x.detach(), forward), (torch.randn(x.shape[0], 48), backward)):
        a_q = quantize(a, torch.float8_e4m3fn, 1 if recipe == "rowwise" else 999, a.shape[1] + 1, False)
        args = (*a_q, *operand, offs, torch.bfloat16)
        assert vendor_grouped.fp8_grouped_gemm_supports(*args) is None
        got = vendor_grouped.fp8_grouped_gemm(*args)
        torch.testing.assert_close(got, reference(*args), rtol=1e-2, atol=1e-2)
        assert got[offs[-1] :].count_nonzero() == 0


def test_triton_kernels_sum_whole_and_partial_chunks_of_each_group():
    """Groups holding whole chunks and partial ones at either end (or within one): the weight gradients in fp32 and
    FP8 (scales in the epilogue, per chunk of 32 and of 128 rows, per group in the padded layout), and the FP8
    forward rowwise with K = 48 (a partial last chunk of K) and blockwise with K = 256, against the reference on the
    same operands."""
    x, parameter, _, offs = case("long groups", 48, 32)
    x, dy, w = x.detach(), torch.randn(x.shape[0], 32, device=DEVICE), parameter.detach()
    impls = {kernel: registry.implementations(kernel) for kernel in ("grouped_gemm_wgrad", "fp8_grouped_gemm_wgrad")}
    run = {name: [impls["grouped_gemm_wgrad"][name].fn(x, dy, offs, torch.float32)] for name in ("triton", "reference")}
    quantize = registry.implementations("fp8_quantize")["reference"].fn
    for block in (x.shape[0] + 1, 32, 128):  # per row of x^T and dy^T over all of S, and 1 x 32, 1 x 128
        x_t = quantize(x.t().contiguous(), torch.float8_e4m3fn, 1, block, False)
        dy_t = quantize(dy.t().contiguous(), torch.float8_e4m3fn, 1, block, False)
        for name in run:
            run[name].append(impls["fp8_grouped_gemm_wgrad"][name].fn(*x_t, *dy_t, offs, torch.float32))
    # each group's own scales, on x^T and dy^T in the padded layout (groups start at multiples of 16, not of a chunk)
    grouped = registry.implementations("fp8_quantize_grouped")["reference"].fn
    (x_t, x_scale, padded_offs), (dy_t, dy_scale, _) = (grouped(t, offs, torch.float8_e4m3fn) for t in (x, dy))
    for name in run:
        run[name].append(
            impls["fp8_grouped_gemm_wgrad"][name].fn(
                x_t, x_scale.unsqueeze(-1), dy_t, dy_scale.unsqueeze(-1), padded_offs, torch.float32
            )
        )
    for recipe, k in (("rowwise", 48), ("blockwise", 256)):  # blockwise: 128x128 weight scales per chunk
        x_k, w_k = torch.randn(x.shape[0], k, device=DEVICE), torch.randn(w.shape[0], 32, k, device=DEVICE) / k**0.5
        x_q = quantize(x_k, torch.float8_e4m3fn, *kernel_block(RECIPES[recipe].activation_block, *x_k.shape), False)
        w_q = weight_operands(w_k.transpose(-2, -1), recipe, quantize, True, False)[0]
        for name in run:
            run[name].append(registry.implementations("fp8_grouped_gemm")[name].fn(*x_q, *w_q, offs, torch.float32))
    # Hopper's FP8 MMA keeps fewer bits than fp32 in its accumulator; the interpreter's sums are exact
    fp8_rtol = 1e-3 if DEVICE == "cuda" else 1e-5
    for i, (got, want) in enumerate(zip(run["triton"], run["reference"])):
        rtol = 1e-5 if i == 0 else fp8_rtol
        torch.testing.assert_close(got, want, rtol=rtol, atol=rtol * want.abs().max().item())


@pytest.mark.skipif(DEVICE != "cpu", reason="on a GPU the vendor kernels run in the tests above (impl auto)")
def test_vendor_fp8_weight_gradient_hands_torch_padded_groups(monkeypatch):
    """The weight gradient through torch._scaled_grouped_mm (a checked emulation on CPU, the group sizes its CUDA
    kernel asserts on included) on x^T and dy^T as fp8_quantize_grouped writes them: empty groups, odd sizes and rows
    past the last group give the reference's result, and the float64 product of the operands per group."""
    monkeypatch.setattr(vendor_grouped, "device_unsupported", lambda device, weight_gradient=False: None)
    monkeypatch.setattr(torch, "_scaled_grouped_mm", _scaled_grouped_mm_checked)
    x, _, _, offs = case("empty first and last, rows past the last group", 32, 48)
    x, dy = x.detach(), torch.randn(x.shape[0], 48)
    quantize = registry.implementations("fp8_quantize_grouped")["reference"].fn
    (x_t, x_scale, padded_offs), (dy_t, dy_scale, _) = (quantize(t, offs, torch.float8_e4m3fn) for t in (x, dy))
    args = (x_t, x_scale.unsqueeze(-1), dy_t, dy_scale.unsqueeze(-1), padded_offs, torch.bfloat16)
    assert vendor_grouped.fp8_grouped_gemm_wgrad_supports(*args) is None
    got = vendor_grouped.fp8_grouped_gemm_wgrad(*args)
    want = registry.implementations("fp8_grouped_gemm_wgrad")["reference"].fn(*args)
    assert got.shape == want.shape == (4, 32, 48) and got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2 * want.abs().max().item())
    assert got[0].count_nonzero() == 0 and got[-1].count_nonzero() == 0
    exact = torch.stack([x[a:b].double().t() @ dy[a:b].double() for a, b in group_bounds(offs, x.shape[0])])
    assert snr_db(got, exact) >= 25
