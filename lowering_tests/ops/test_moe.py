"""MoE routing glue: the permute and combine ops (opcheck, float64 references, every routing shape, determinism, bad
input, the Triton kernels at real sizes), and FP8 grouped GEMMs taking their input from the GLU."""

from __future__ import annotations

import pytest
import torch

import turbo_inductor
from turbo_inductor.ops.library import OpInputError
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.tolerance import TOLERANCE, snr_db

ops = turbo_inductor.ops
TRITON = "moe_route=triton,moe_dispatch=triton,moe_gather_sum=triton"
IMPLS = ["reference", TRITON]
T, K, H, E = 13, 3, 40, 4  # k = 3 and H = 40: partial tiles in both directions


ROUTINGS = {
    "random": lambda: torch.randint(0, E, (T, K)),
    "one expert takes every token": lambda: torch.full((T, K), 2),
    # expert-parallel sentinels (indices outside [0, E)) go last, uncounted
    "sentinels": lambda: torch.where(
        torch.rand(T, K) < 0.3, E + torch.randint(0, 3, (T, K)), torch.randint(0, E, (T, K))
    ),
}


def _routing(name: str):
    indices = ROUTINGS[name]().to(DEVICE)
    weights = torch.rand(T, K, device=DEVICE)
    return indices, weights


def _expected_order(indices: torch.Tensor) -> list[int]:
    """A stable sort of the choices by expert, sentinels last."""
    flat = indices.flatten().tolist()
    return sorted(range(len(flat)), key=lambda i: (flat[i] if 0 <= flat[i] < E else E, i))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("routing", sorted(ROUTINGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_permute_and_combine_match_float64(impl, routing, dtype):
    """The permutation is a stable sort (sentinels last); x_sorted copies rows exactly; offs count the experts; the
    combine and both backwards equal float64 references; two runs are bitwise equal."""
    indices, weights = _routing(routing)
    x = torch.randn(T, H, device=DEVICE, dtype=dtype, requires_grad=True)
    w = weights.clone().requires_grad_()
    y = torch.randn(T * K, H, device=DEVICE, dtype=dtype, requires_grad=True)
    results = []
    for _ in range(2):
        x_sorted, w_sorted, offs, order, positions = ops.moe_permute(x, indices, w, E, impl=impl)
        out = ops.moe_combine(y, w, positions, impl=impl)
        outputs = (x_sorted, w_sorted, out)
        generator = torch.Generator().manual_seed(0)
        cotangents = [torch.randn(t.shape, generator=generator).to(DEVICE, t.dtype) for t in outputs]
        grads = torch.autograd.grad(outputs, (x, w, y), cotangents)
        results.append((x_sorted, w_sorted, offs, order, positions, out, *grads))
    for first, second in zip(*results):
        assert torch.equal(first, second)
    x_sorted, w_sorted, offs, order, positions, out, dx, dw, dy = results[0]
    expected = torch.tensor(_expected_order(indices), device=DEVICE)
    assert order.dtype == positions.dtype == torch.int64 and torch.equal(order, expected)
    assert torch.equal(positions.flatten()[order], torch.arange(T * K, device=DEVICE))
    counts = torch.stack([(indices == e).sum() for e in range(E)])
    assert offs.dtype == torch.int32 and torch.equal(offs, counts.cumsum(0).to(torch.int32))
    assert torch.equal(x_sorted, x.detach()[order // K]) and torch.equal(w_sorted, w.detach().flatten()[order])
    # float64: out[t] = sum_j w[t, j] y[positions[t, j]]; dx[t] = sum_j dx_sorted[positions[t, j]]
    dx_sorted, dw_sorted, dout = (c.double() for c in cotangents)
    y64, w64 = y.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    out64 = (w64.unsqueeze(-1) * y64[positions]).sum(1)
    dy64, dw64 = torch.autograd.grad(out64, (y64, w64), dout)
    tol = TOLERANCE[dtype]
    for got, want in ((out, out64), (dy, dy64), (dx, dx_sorted[positions].sum(1)), (dw, dw64 + dw_sorted[positions])):
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * max(1.0, want.abs().max().item()))
    assert out.dtype == dtype and dx.dtype == dtype and dw.dtype == torch.float32


@pytest.mark.skipif(DEVICE != "cuda", reason="real sizes: the GPU's kernels against the reference")
@pytest.mark.parametrize(
    "tokens, k, experts, hidden", [(8192, 8, 128, 2048), (8192, 2, 8, 4096)], ids=["qwen3", "mixtral"]
)
def test_triton_routing_at_real_sizes_equals_the_reference(tokens, k, experts, hidden):
    """Qwen3-30B-A3B's and Mixtral's routing of batch 2 x 4096: the order, offsets and row copies exactly the
    reference's, the sums within bf16 rounding of it (another summation order), every kernel bitwise reproducible."""
    indices = torch.topk(torch.randn(tokens, experts, device=DEVICE), k).indices
    weights = torch.rand(tokens, k, device=DEVICE)
    x = torch.randn(tokens, hidden, device=DEVICE, dtype=torch.bfloat16)
    y = torch.randn(tokens * k, hidden, device=DEVICE, dtype=torch.bfloat16)
    results = {}
    for impl in ("reference", TRITON, TRITON):
        x_sorted, _, offs, order, positions = ops.moe_permute(x, indices, None, experts, impl=impl)
        out = ops.moe_combine(y, weights, positions, impl=impl)
        dy, dweights = torch.ops.turbo_inductor.moe_combine_bwd(x, y, weights, positions, impl)
        got = (x_sorted, offs, order, positions, out, dy, dweights)
        if impl in results:
            assert all(torch.equal(a, b) for a, b in zip(got, results[impl]))
        results[impl] = got
    for i, (a, b) in enumerate(zip(results[TRITON], results["reference"])):
        if i < 4 or i == 5:
            assert torch.equal(a, b), i
        else:
            torch.testing.assert_close(a.float(), b.float(), rtol=1e-2, atol=1e-2)


def test_no_tokens_and_unweighted_combine():
    x = torch.randn(0, H, device=DEVICE)
    indices = torch.zeros(0, K, dtype=torch.int64, device=DEVICE)
    x_sorted, w_sorted, offs, order, positions = ops.moe_permute(x, indices, None, E)
    assert x_sorted.shape == (0, H) and w_sorted.numel() == 0 and torch.equal(offs, torch.zeros_like(offs))
    assert ops.moe_combine(x_sorted, None, positions).shape == (0, H)
    indices, _ = _routing("random")
    y = torch.randn(T * K, H, device=DEVICE)
    positions = ops.moe_permute(torch.randn(T, H, device=DEVICE), indices, None, E)[4]
    torch.testing.assert_close(ops.moe_combine(y, None, positions), y[positions].sum(1))


def test_opcheck():
    indices, weights = _routing("sentinels")
    x = torch.randn(T, H, device=DEVICE)
    y = torch.randn(T * K, H, device=DEVICE)
    positions = ops.moe_permute(x, indices, None, E)[4]
    for w in (weights, None):
        torch.library.opcheck(torch.ops.turbo_inductor.moe_permute, (x, indices, w, E, "reference"))
        torch.library.opcheck(torch.ops.turbo_inductor.moe_combine, (y, w, positions, "reference"))
        torch.library.opcheck(torch.ops.turbo_inductor.moe_combine_bwd, (x, y, w, positions, "reference"))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda x, i, w, p: ops.moe_permute(x[0], i, None, E), "x must be 2-D"),
        (lambda x, i, w, p: ops.moe_permute(x, i.float(), None, E), "indices must be int32 or int64"),
        (lambda x, i, w, p: ops.moe_permute(x, i[:5], None, E), r"indices must be \[T, k\] with T = 13"),
        (lambda x, i, w, p: ops.moe_permute(x, i, w[:, :2], E), r"weights must be \[T, k\] = \[13, 3\]"),
        (lambda x, i, w, p: ops.moe_permute(x, i, None, 0), "num_experts must be at least 1"),
        (lambda x, i, w, p: ops.moe_combine(x, None, p), "y must be 2-D with 39 rows"),
        (lambda x, i, w, p: ops.moe_combine(torch.randn(39, H), None, p.int()), "positions must be moe_permute's"),
    ],
)
def test_bad_input_is_named(call, message):
    indices, weights = (t.cpu() for t in _routing("random"))
    x = torch.randn(T, H)
    positions = ops.moe_permute(x, indices, None, E)[4]
    with pytest.raises(OpInputError, match=message):
        call(x, indices, weights, positions)


@pytest.mark.parametrize("recipe", ["rowwise", "blockwise"])
def test_fp8_grouped_mm_takes_the_glus_fp8_output(recipe):
    """A GLU's q and scale handed to fp8_grouped_mm give exactly what it computes from the GLU's output, forward and
    backward; a scale of the wrong shape is named."""
    sizes = [5, 0, 17, 10]
    offs = torch.tensor(sizes, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(DEVICE)
    h = torch.randn(sum(sizes), 2 * 128, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(len(sizes), 32, 128, device=DEVICE) / 12).to(torch.bfloat16).requires_grad_()
    results = []
    for fused in (True, False):
        if fused:
            out, q, scale = ops.glu_fp8(h, recipe=recipe, impl="reference")
            y = ops.fp8_grouped_mm(out, w.transpose(-2, -1), offs, recipe, impl="reference", x_q=q, x_scale=scale)
        else:
            out = ops.glu_fused(h, impl="reference")
            y = ops.fp8_grouped_mm(out, w.transpose(-2, -1), offs, recipe, impl="reference")
        results.append([y, *torch.autograd.grad(y, (h, w), torch.ones_like(y))])
    for got, want in zip(*results):
        assert torch.equal(got, want)
    with pytest.raises(OpInputError, match="x_scale must be the rowwise scales of x"):
        ops.fp8_grouped_mm(out.detach(), w.transpose(-2, -1), offs, "rowwise", x_q=q, x_scale=scale[:, :0])


# ---- the permute in FP8 ---------------------------------------------------------------------------------------

FP8_OUT = ("test_autograd_registration", "test_faketensor")  # fp8 outputs: opcheck's schema and AOT tests sum them


def _fp8_experts(recipe: str, hidden: int = 128, experts: int = E):
    """Tokens [T, hidden] bf16, a routing with an empty expert and sentinels, router weights and experts' W^T."""
    indices = torch.randint(0, experts - 1, (T, K))  # the last expert gets no token
    indices = torch.where(torch.rand(T, K) < 0.2, experts + 1, indices).to(DEVICE)  # sentinels: last, uncounted
    x = torch.randn(T, hidden, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    weights = torch.rand(T, K, device=DEVICE, requires_grad=True)
    w = (torch.randn(experts, 32, hidden, device=DEVICE) / 12).to(torch.bfloat16).requires_grad_()
    return x, indices, weights, w


def _experts_through(fused: bool, x, indices, weights, w, recipe: str, impl: str = "reference", masked=False):
    """y = the FP8 experts' rows times weights_sorted, through moe_permute_fp8 (fused) or moe_permute. ``masked``:
    x_sorted's sentinel rows zeroed in place first, as transformers 5.17 does."""
    if fused:
        q, scale, w_sorted, offs, _, positions = torch.ops.turbo_inductor.moe_permute_fp8(
            x, indices, weights, E, recipe, impl
        )
        y = ops.fp8_grouped_mm(
            x, w.transpose(-2, -1), offs, recipe, impl=impl, x_q=q, x_scale=scale, positions=positions
        )
    else:
        x_sorted, w_sorted, offs, order, _ = ops.moe_permute(x, indices, weights, E, impl=impl)
        if masked:
            x_sorted.masked_fill_((indices.reshape(-1)[order] >= E).unsqueeze(-1), 0.0)
        y = ops.fp8_grouped_mm(x_sorted, w.transpose(-2, -1), offs, recipe, impl=impl)
    return y * w_sorted.unsqueeze(-1).to(y.dtype)


@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "sentinels_masked"])
@pytest.mark.parametrize("recipe", ["rowwise", "rowwise_with_gw_hp", "blockwise", "mxfp8"])
def test_fp8_permute_is_bit_identical_to_quantizing_x_sorted(recipe, masked):
    """A scale within a row is the same whichever expert the row goes to: the forward, dx (the rows' gradients
    gather-summed), the router weights' and the experts' gradients equal the bf16 permute's bit for bit. An empty
    expert and sentinel rows included; those x_sorted rows, past offs[-1], may be zeroed in place (transformers
    5.17's mask, which the pass drops): the GEMMs never read them and write their gradient as zero."""
    x, indices, weights, w = _fp8_experts(recipe)
    results = []
    for fused in (False, True):
        y = _experts_through(fused, x, indices, weights, w, recipe, masked=masked)
        dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(0)).to(DEVICE, y.dtype)
        results.append((y, *torch.autograd.grad(y, (x, weights, w), dy)))
    for got, want in zip(*results):
        assert torch.equal(got, want)


def test_fp8_permute_meets_the_gates_against_float64():
    """rowwise: out >= 25 dB, every gradient >= 20 dB against the routing and experts in float64."""
    x, indices, weights, w = _fp8_experts("rowwise")
    impl = "reference" if DEVICE == "cpu" else "auto"  # the interpreter's fp8 stores round wrongly
    y = _experts_through(True, x, indices, weights, w, "rowwise", impl=impl)
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, weights, w), dy)
    x64, weights64, w64 = (t.detach().double().requires_grad_() for t in (x, weights, w))
    rows = torch.arange(T * K, device=DEVICE) // K
    expert = indices.flatten()
    y64 = torch.zeros(T * K, 32, device=DEVICE, dtype=torch.float64)
    for e in range(E):  # each choice of a real expert: x's row times W[e]^T, times its router weight
        mine = expert == e
        y64 = torch.where(mine[:, None], x64[rows] @ w64[e].t(), y64)
    y64 = y64 * weights64.flatten()[:, None]
    order = torch.tensor(_expected_order(indices.cpu()), device=DEVICE)
    want = torch.autograd.grad(y64[order], (x64, weights64, w64), dy.double())
    assert snr_db(y, y64[order]) >= 25
    for got, truth in zip(grads, want):
        assert snr_db(got, truth) >= 20


def test_fp8_permute_opcheck_and_no_tokens():
    x, indices, weights, w = _fp8_experts("rowwise")
    for recipe, wts in (("rowwise", weights), ("blockwise", None)):
        args = (x.detach(), indices, wts, E, recipe, "reference")
        torch.library.opcheck(torch.ops.turbo_inductor.moe_permute_fp8, args, test_utils=FP8_OUT)
    q, scale, _, offs, _, positions = torch.ops.turbo_inductor.moe_permute_fp8(x, indices, None, E, "rowwise")
    fwd_args = (x.detach(), w.detach().transpose(-2, -1), offs, "rowwise", "reference", True, q, scale, positions)
    torch.library.opcheck(torch.ops.turbo_inductor.fp8_grouped_mm_fwd, fwd_args, test_utils=FP8_OUT)
    empty = torch.ops.turbo_inductor.moe_permute_fp8(x[:0], indices[:0], None, E, "mxfp8")
    assert empty[0].shape == (0, 128) and empty[1].shape == (0, 4) and not empty[3].any()


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda x, i, w, p: fp8_permute(x, i, "tensorwise"), "recipe must quantize x in blocks within a row"),
        (lambda x, i, w, p: fp8_permute(x, i[:5], "rowwise"), r"indices must be \[T, k\] with T = 13"),
        (
            lambda x, i, w, p: ops.fp8_grouped_mm(x, w, p[3], "rowwise", positions=p[5]),
            "positions needs x_q and x_scale",
        ),
        (
            lambda x, i, w, p: ops.fp8_grouped_mm(x, w, p[3], "rowwise", x_q=p[0], x_scale=p[1], positions=p[5][1:]),
            r"positions must be moe_permute_fp8's \[T, k\] int64 with T = 13",
        ),
        (
            lambda x, i, w, p: ops.fp8_grouped_mm(x, w, p[3], "rowwise", x_q=p[0][1:], x_scale=p[1], positions=p[5]),
            r"x_q must be x quantized as \[39, 128\]",
        ),
    ],
)
def test_fp8_permute_bad_input_is_named(call, message):
    x, indices, _, w = (t.cpu().detach() for t in _fp8_experts("rowwise"))
    permuted = fp8_permute(x, indices, "rowwise")
    with pytest.raises(OpInputError, match=message):
        call(x, indices, w.transpose(-2, -1), permuted)


def fp8_permute(x, indices, recipe):
    return torch.ops.turbo_inductor.moe_permute_fp8(x, indices, None, E, recipe)
