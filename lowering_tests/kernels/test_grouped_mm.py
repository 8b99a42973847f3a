"""Grouped GEMM kernels: the implementations' ranking, what the vendor kernels decline and the operands they hand
torch (its CPU grouped GEMM, and a checked emulation of torch._scaled_grouped_mm), and the Triton kernels' sums over
whole and partial chunks of each group, against the reference."""

from __future__ import annotations

import pytest
import torch

from turbo_inductor.kernels import registry
from turbo_inductor.kernels.reference.grouped_mm import group_bounds
from turbo_inductor.kernels.vendor import grouped_mm as vendor_grouped
from turbo_inductor.ops.fp8_operands import (
    contracts_weight_scales,
    fold_contracted_weight_scales,
    kernel_block,
    weight_operands,
)
from turbo_inductor.recipes import RECIPES
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.grouped_mm import case
from turbo_inductor.testing.tolerance import snr_db


def test_implementations_rank_vendor_then_triton_then_reference(monkeypatch):
    """Except the FP8 rows kernel on NVIDIA GPUs, where Triton's was measured ahead of torch's (not on ROCm)."""
    for kernel in ("grouped_gemm", "grouped_gemm_wgrad", "fp8_grouped_gemm", "fp8_grouped_gemm_wgrad"):
        impls = registry.implementations(kernel)
        priority = {name: i.priority_on(torch.device("cuda")) for name, i in impls.items()}
        faster = ["vendor", "triton"] if kernel != "fp8_grouped_gemm" else ["triton", "vendor"]
        assert priority[faster[0]] > priority[faster[1]] > priority["reference"], (kernel, priority)
        assert impls["triton"].priority_on(torch.device("cpu")) < priority["reference"]  # the interpreter is slow
        if "triton_tma" in impls:  # until measured ahead of the pointer kernels
            assert priority["triton_tma"] < priority["triton"]
        if "vendor_per_group" in impls:  # until measured ahead of the grouped kernels in a model
            assert priority["reference"] < priority["vendor_per_group"] < priority["triton"]
    monkeypatch.setattr(torch.version, "hip", "6.4")
    rows = registry.implementations("fp8_grouped_gemm")
    assert rows["vendor"].priority_on(torch.device("cuda")) > rows["triton"].priority_on(torch.device("cuda"))


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


@pytest.mark.parametrize("pattern", ["empty first and last, rows past the last group", "odd sizes"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_gemm_per_group_matches_the_reference_and_declines_a_graph_capture(monkeypatch, pattern, dtype):
    """``vendor_per_group`` (one torch.mm per group after reading offs on the host): the reference's sums, rows past
    the last group zero and empty groups' gradients zero (the outputs start as garbage, NaN here); it declines
    another output dtype and a CUDA graph capture, which forbids reading offs on the host."""
    x, parameter, weight, offs = case(pattern, 32, 48, dtype)
    x, w, dy = x.detach(), weight(parameter.detach()), torch.randn(x.shape[0], 48, device=DEVICE).to(dtype)
    monkeypatch.setattr(torch, "empty", lambda *args, **kwargs: torch.full(*args, float("nan"), **kwargs))
    tolerance = dict(rtol=1e-2, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    for kernel, fn, args in (
        ("grouped_gemm", vendor_grouped.grouped_gemm_per_group, (x, w, offs, dtype)),
        ("grouped_gemm_wgrad", vendor_grouped.grouped_gemm_wgrad_per_group, (x, dy, offs, dtype)),
    ):
        assert vendor_grouped.per_group_supports(*args) is None
        want = registry.implementations(kernel)["reference"].fn(*args)
        torch.testing.assert_close(fn(*args), want, **tolerance)
    assert "operands' dtype" in vendor_grouped.per_group_supports(x, w, offs, torch.float16)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert "CUDA graph capture" in vendor_grouped.per_group_supports(x, w, offs, dtype)


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
    if contracts_weight_scales(recipe):  # the GEMM's scale of dx's columns; the rest goes onto dy, given here
        backward = (backward[0], fold_contracted_weight_scales(backward[1], w.shape[1])[0])
    reference = registry.implementations("fp8_grouped_gemm")["reference"].fn
    for a, operand in ((x.detach(), forward), (torch.randn(x.shape[0], 48), backward)):
        a_q = quantize(a, torch.float8_e4m3fn, 1 if recipe == "rowwise" else 999, a.shape[1] + 1, False)
        args = (*a_q, *operand, offs, torch.bfloat16)
        assert vendor_grouped.fp8_grouped_gemm_supports(*args) is None
        got = vendor_grouped.fp8_grouped_gemm(*args)
        torch.testing.assert_close(got, reference(*args), rtol=1e-2, atol=1e-2)
        assert got[offs[-1] :].count_nonzero() == 0


@pytest.mark.parametrize("fast_accum", [False, True])
def test_triton_kernels_sum_whole_and_partial_chunks_of_each_group(fast_accum):
    """Groups holding whole chunks and partial ones at either end (or within one): the weight gradients in fp32 and
    FP8 (scales in the epilogue, per chunk of 32 and of 128 rows, per group in the padded layout), and the FP8
    forward rowwise with K = 48 (a partial last chunk of K) and blockwise with K = 256, against the reference on the
    same operands; the FP8 kernels loading through pointers and through tensor descriptors (where the device has
    them); the FP8 weight gradients promoting each chunk's sum or summing in the MMA's accumulator."""
    x, parameter, _, offs = case("long groups", 48, 32)
    x, dy, w = x.detach(), torch.randn(x.shape[0], 32, device=DEVICE), parameter.detach()
    impls = {kernel: registry.implementations(kernel) for kernel in ("grouped_gemm_wgrad", "fp8_grouped_gemm_wgrad")}
    want = impls["grouped_gemm_wgrad"]["reference"].fn(x, dy, offs, torch.float32)
    got = impls["grouped_gemm_wgrad"]["triton"].fn(x, dy, offs, torch.float32)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    tma = impls["fp8_grouped_gemm_wgrad"]["triton_tma"].unavailable_reason(x.device) is None
    run = {name: [] for name in ("reference", "triton", *(["triton_tma"] if tma else []))}

    def call(kernel, *args, **kwargs):
        for name in run:
            impl = registry.implementations(kernel)[name]
            assert impl.declines(*args, **kwargs) is None, (name, impl.declines(*args, **kwargs))
            run[name].append(impl.fn(*args, **kwargs))

    quantize = registry.implementations("fp8_quantize")["reference"].fn
    for block in (x.shape[0] + 1, 32, 128):  # per row of x^T and dy^T over all of S, and 1 x 32, 1 x 128
        # S = 152: rows 16-byte aligned in a wider buffer (as descriptors need), the tiles past S read as zeros
        (x_t, x_scale), (dy_t, dy_scale) = (
            quantize(t.t().contiguous(), torch.float8_e4m3fn, 1, block, False) for t in (x, dy)
        )
        call(
            "fp8_grouped_gemm_wgrad",
            rows_16_bytes_apart(x_t),
            x_scale,
            rows_16_bytes_apart(dy_t),
            dy_scale,
            offs,
            torch.float32,
            fast_accum=fast_accum,
        )
    # each group's own scales, on x^T and dy^T in the padded layout (groups start at multiples of 16, not of a chunk)
    grouped = registry.implementations("fp8_quantize_grouped")["reference"].fn
    (x_t, x_scale, padded_offs), (dy_t, dy_scale, _) = (grouped(t, offs, torch.float8_e4m3fn) for t in (x, dy))
    per_group = (x_t, x_scale.unsqueeze(-1), dy_t, dy_scale.unsqueeze(-1), padded_offs, torch.float32)
    call("fp8_grouped_gemm_wgrad", *per_group, fast_accum=fast_accum)
    for recipe, k in (("rowwise", 48), ("blockwise", 256)):  # blockwise: 128x128 weight scales per chunk
        x_k, w_k = torch.randn(x.shape[0], k, device=DEVICE), torch.randn(w.shape[0], 32, k, device=DEVICE) / k**0.5
        x_q = quantize(x_k, torch.float8_e4m3fn, *kernel_block(RECIPES[recipe].activation_block, *x_k.shape), False)
        w_q = weight_operands(w_k.transpose(-2, -1), recipe, quantize, True, False)[0]
        call("fp8_grouped_gemm", *x_q, *w_q, offs, torch.float32)
    # Hopper's FP8 MMA keeps fewer bits than fp32 in its accumulator; the interpreter's sums are exact
    rtol = 1e-3 if DEVICE == "cuda" else 1e-5
    for name in set(run) - {"reference"}:
        assert len(run[name]) == 6
        for got, want in zip(run[name], run["reference"]):
            torch.testing.assert_close(
                got, want, rtol=rtol, atol=rtol * want.abs().max().item(), msg=lambda m, name=name: f"{name}: {m}"
            )


def rows_16_bytes_apart(t: torch.Tensor) -> torch.Tensor:
    """``t`` [R, C] copied into a buffer whose rows start a multiple of 16 elements apart, viewed to its size."""
    out = t.new_empty(t.shape[0], -(-t.shape[1] // 16) * 16)[:, : t.shape[1]]
    return out.copy_(t)


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


def test_fp8_gemms_feed_hopper_tensor_cores_from_shared_memory():
    """The Triton FP8 GEMMs as an H200 runs them (``turbo_inductor.testing.hopper``): operands go from global memory
    into shared memory and from there to the MMA. No tile goes back through registers into shared memory (as a tile
    bitcast after its load does), which would make every MMA finish before the next is issued. The fast-accumulation
    forward keeps one MMA in flight while the next tiles land; the others add each chunk's product apart. The same
    for the grouped GEMMs loading by TMA, which issue no pointer load."""
    from turbo_inductor.testing import hopper

    tma = ("grouped_fwd_tma", "grouped_dgrad_tma", "grouped_wgrad_tma")
    cases = ("grouped_fwd", "grouped_dgrad", "grouped_blockwise", "grouped_wgrad", "dense_blockwise", *tma)
    launches = {f["case"]: f for f in hopper.facts_in_a_process(*cases) if f["mma_in_flight"]}
    assert set(launches) == set(cases), launches
    for name, gemm in launches.items():
        assert gemm["register_round_trips"] == 0 and gemm["mma_waits_added"] == 0 and gemm["spilled"] == 0, gemm
        assert gemm["shared"] <= hopper.MAX_SHARED, gemm
        if name in tma:
            assert gemm["descriptors"] == ["A", "B"] and gemm["vector_loads"] == 0, gemm
        else:
            assert gemm["writes"] == ["OUT"], gemm
    for name in ("grouped_fwd", "grouped_fwd_tma"):
        assert launches[name]["mma_in_flight"] == [1], launches[name]
