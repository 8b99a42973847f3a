"""The Triton FP8 GEMM against the fp32 emulation (the reference implementation) for every scaling granularity of
the recipes, odd sizes included, and through fp8_linear forward and backward. On CPU the kernel runs in Triton's
interpreter (small sizes); system/test_gpu.py runs it at real sizes."""

from __future__ import annotations

import pytest
import torch

import turbo_inductor
from turbo_inductor.kernels import registry
from turbo_inductor.kernels.reference import fp8_gemm as reference_gemm
from turbo_inductor.kernels.reference import fp8_quant as reference_quant
from turbo_inductor.kernels.triton import fp8_gemm as triton_gemm
from turbo_inductor.testing import DEVICE

# fp8 products are exact and summed in fp32: in the interpreter the result differs from the emulation only by the
# order of the sums. Hopper's FP8 tensor cores accumulate with fewer mantissa bits (about 14, the DeepSeek-V3
# report): on a GPU, up to ~3e-4 of the largest output (measured on an H200).
FP32_TOL = 1e-5 if DEVICE == "cpu" else 1e-3

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
# name: (a block, b block, power-of-two scales); 0 = the whole dimension
GRANULARITIES = {
    "tensorwise": ((0, 0), (0, 0), False),
    "rowwise": ((1, 0), (1, 0), False),
    "blockwise": ((1, 128), (128, 128), False),
    "mxfp8": ((1, 32), (1, 32), True),
}


def _quantized(rows, cols, block, dtype, power_of_two, seed):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, cols, generator=gen) * torch.rand(rows, 1, generator=gen) * 4).to(DEVICE)
    block_rows, block_cols = block[0] or rows, block[1] or cols
    return reference_quant.fp8_quantize(x, dtype, block_rows, block_cols, False, power_of_two=power_of_two)


@pytest.mark.parametrize("granularity", sorted(GRANULARITIES))
@pytest.mark.parametrize("M, N, K", [(1, 16, 256), (33, 48, 256), (70, 144, 384), (16, 32, 96)])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_matches_the_emulation(granularity, M, N, K, out_dtype):
    a_block, b_block, pow2 = GRANULARITIES[granularity]
    if granularity == "blockwise" and K % 128:
        pytest.skip("blockwise scales come in 128-wide blocks along K")
    a, a_scale = _quantized(M, K, a_block, E4M3, pow2, seed=1)
    b, b_scale = _quantized(N, K, b_block, E4M3, pow2, seed=2)
    got = triton_gemm.fp8_gemm(a, a_scale, b, b_scale, out_dtype)
    want = reference_gemm.fp8_gemm(a, a_scale, b, b_scale, torch.float32)
    assert got.shape == (M, N) and got.dtype == out_dtype and got.is_contiguous()
    # fp32: the same exact products summed in another order; bf16: one rounding of that
    tol = FP32_TOL if out_dtype == torch.float32 else 8e-3
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol * want.abs().max().item())


def test_mixed_formats_e5m2_gradient_times_e4m3_weight():
    dy, dy_scale = _quantized(40, 128, (1, 128), E5M2, False, seed=3)
    w, w_scale = _quantized(64, 128, (128, 128), E4M3, False, seed=4)
    got = triton_gemm.fp8_gemm(dy, dy_scale, w, w_scale, torch.float32)
    want = reference_gemm.fp8_gemm(dy, dy_scale, w, w_scale, torch.float32)
    torch.testing.assert_close(got, want, rtol=FP32_TOL, atol=FP32_TOL * want.abs().max().item())


def test_chunk_never_straddles_a_scaling_block():
    assert triton_gemm.block_k_for(4096, 128, 128) == 128
    assert triton_gemm.block_k_for(4096, 32, 32) == 32
    assert triton_gemm.block_k_for(96, 96, 96) == 128  # one block spans K: any chunk
    assert triton_gemm.block_k_for(192, 96, 192) == 32  # 96 = 3 x 32
    assert triton_gemm.block_k_for(4096, 1, 4096) is None


def test_the_triton_gemm_is_the_fallback_on_a_gpu_and_the_emulation_on_a_cpu():
    triton_impl = registry.implementations("fp8_gemm")["triton"]
    assert triton_impl.priority_on(torch.device("cuda")) > registry.implementations("fp8_gemm")["reference"].priority
    assert triton_impl.priority_on(torch.device("cpu")) < registry.implementations("fp8_gemm")["reference"].priority


def test_too_narrow_scaling_blocks_are_refused_by_triton_and_run_emulated_by_default():
    # one scale per element: 1-wide blocks along K
    a, a_scale = _quantized(4, 64, (1, 1), E4M3, False, seed=6)
    with pytest.raises(ValueError, match="'triton' of fp8_gemm cannot take these arguments: .*narrower than the 16"):
        torch.ops.turbo_inductor.fp8_gemm(a, a_scale, a, a_scale, torch.float32, "fp8_gemm=triton")
    turbo_inductor.reset_kernel_calls()
    got = torch.ops.turbo_inductor.fp8_gemm(a, a_scale, a, a_scale, torch.float32)
    torch.testing.assert_close(got, reference_gemm.fp8_gemm(a, a_scale, a, a_scale, torch.float32))
    assert turbo_inductor.kernel_calls() == {("fp8_gemm", "reference"): 1}


@pytest.mark.parametrize("recipe", ["blockwise", "mxfp8"])
def test_fp8_linear_forward_and_backward_on_the_triton_gemm(recipe):
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(3, 11, 128, generator=gen).to(DEVICE).requires_grad_()
    w = (torch.randn(64, 128, generator=gen) * 0.05).to(DEVICE).requires_grad_()
    results = []
    for gemm in ("triton", "reference"):
        out = turbo_inductor.ops.fp8_linear(x, w, None, recipe, impl=f"fp8_quantize=reference,fp8_gemm={gemm}")
        dx, dw = torch.autograd.grad(out, (x, w), torch.ones_like(out))
        results.append((out, dx, dw))
    turbo_inductor.reset_kernel_calls()
    tol = max(FP32_TOL, 1e-4)
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol * want.abs().max().item())


def _scaled_mm_checked(a, b, scale_a, scale_b, out_dtype, use_fast_accum=False):
    """torch._scaled_mm on a CPU: its own meta function checks the scale shapes, the strides cuBLASLt reads block
    scales in are asserted, and the product is computed from the scales as given."""
    meta = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta") for t in (a, b, scale_a, scale_b)]
    torch.ops.aten._scaled_mm(*meta[:2], scale_a=meta[2], scale_b=meta[3], out_dtype=out_dtype)
    m, n = a.shape[0], b.shape[1]
    if scale_a.dim() == 2 and scale_a.shape[1] > 1:  # 1x128 blocks: K-block-major
        assert scale_a.stride() == (1, m), scale_a.stride()
        assert scale_b.stride() == ((1, scale_b.shape[0]) if scale_b.shape[1] < n else (n, 1)), scale_b.stride()

    def expand(s, t):
        return reference_gemm.expand_scale(s.reshape(s.shape if s.dim() == 2 else (1, 1)), t.shape)

    return ((a.float() * expand(scale_a, a)) @ (b.float() * expand(scale_b, b))).to(out_dtype)


@pytest.mark.parametrize(
    "granularity, a_block, b_block",
    [
        ("tensorwise", (0, 0), (0, 0)),
        ("rowwise", (1, 0), (1, 0)),
        ("blockwise forward and dgrad", (1, 128), (128, 128)),
        ("blockwise wgrad", (1, 128), (1, 128)),
    ],
)
@pytest.mark.parametrize("M", [1, 33, 256])
def test_vendor_gemm_lays_out_the_scales_torch_scaled_mm_takes(monkeypatch, granularity, a_block, b_block, M):
    """The vendor GEMM's padding and scale layouts, on a CPU: torch._scaled_mm replaced by a checked emulation."""
    from turbo_inductor.kernels.vendor import fp8_gemm as vendor_gemm

    monkeypatch.setattr(torch, "_scaled_mm", _scaled_mm_checked)
    monkeypatch.setattr(vendor_gemm, "deepseek_unsupported", lambda device: None)
    a, a_scale = _quantized(M, 512, a_block, E4M3, False, seed=7)
    b, b_scale = _quantized(256, 512, b_block, E4M3, False, seed=8)
    a, a_scale, b, b_scale = (t.cpu() for t in (a, a_scale, b, b_scale))
    assert vendor_gemm.supports(a, a_scale, b, b_scale, torch.bfloat16) is None
    got = vendor_gemm.fp8_gemm(a, a_scale, b, b_scale, torch.bfloat16, fast_accum=True)
    want = reference_gemm.fp8_gemm(a, a_scale, b, b_scale, torch.bfloat16)
    assert got.shape == (M, 256)
    torch.testing.assert_close(got, want, rtol=8e-3, atol=8e-3 * want.abs().max().item())


def test_vendor_gemm_declines_block_shapes_cublaslt_refuses(monkeypatch):
    from turbo_inductor.kernels.vendor import fp8_gemm as vendor_gemm

    monkeypatch.setattr(vendor_gemm, "deepseek_unsupported", lambda device: None)
    a, a_scale = _quantized(64, 384, (1, 128), E4M3, False, seed=9)  # 3 blocks along K: cuBLASLt reads 4
    b, b_scale = _quantized(128, 384, (128, 128), E4M3, False, seed=10)
    assert "K of 512" in vendor_gemm.supports(a, a_scale, b, b_scale, torch.bfloat16)
    assert vendor_gemm.supports(a, a_scale, b, b_scale.new_ones(128, 3), torch.bfloat16) is None  # 1x128 b
    assert "writes bfloat16" in vendor_gemm.supports(a, a_scale, b, b_scale.new_ones(128, 3), torch.float32)
    mx, mx_scale = _quantized(64, 384, (1, 32), E4M3, True, seed=11)
    assert "1x128 x (128x128 | 1x128) scales only" in vendor_gemm.supports(mx, mx_scale, mx, mx_scale, torch.bfloat16)


def test_vendor_gemm_writes_float32_where_torch_scaled_mm_can(monkeypatch):
    """torch._scaled_mm writes float32 at tensorwise scales, and at rowwise ones through cuBLASLt (sm_90, CUDA >=
    12.9); CUTLASS's and hipBLASLt's rowwise kernels write bf16 only, as block scales do: declined, not raised."""
    from turbo_inductor.kernels.vendor import fp8_gemm as vendor_gemm

    tensorwise = (*_quantized(32, 64, (0, 0), E4M3, False, seed=12), *_quantized(16, 64, (0, 0), E4M3, False, seed=13))
    rowwise = (*_quantized(32, 64, (1, 0), E4M3, False, seed=12), *_quantized(16, 64, (1, 0), E4M3, False, seed=13))
    monkeypatch.setattr(vendor_gemm, "deepseek_unsupported", lambda device: "not sm_90")
    assert vendor_gemm.writes_float32(*tensorwise) and vendor_gemm.supports(*tensorwise, torch.float32) is None
    assert not vendor_gemm.writes_float32(*rowwise) and vendor_gemm.supports(*rowwise, torch.bfloat16) is None
    assert "writes float32 through cuBLASLt only" in vendor_gemm.supports(*rowwise, torch.float32)
    monkeypatch.setattr(vendor_gemm, "deepseek_unsupported", lambda device: None)
    assert vendor_gemm.writes_float32(*rowwise) and vendor_gemm.supports(*rowwise, torch.float32) is None


def test_an_fp32_weight_gradient_is_cast_where_the_gemm_writes_bf16_only(monkeypatch):
    """fp8_linear's wgrad writes an fp32 W's gradient in fp32 where the GEMM it runs can; elsewhere it writes bf16
    and casts: the same gradient, rounded once to bf16."""
    x = torch.randn(24, 64, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(32, 64, device=DEVICE) * 0.05
    dy = torch.randn(24, 32, device=DEVICE, dtype=torch.bfloat16)
    saved = torch.ops.turbo_inductor.fp8_linear_fwd(x, w, None, "rowwise", "reference")[1:]
    wgrads = []
    for writes in (True, False):
        monkeypatch.setattr(registry, "has_capability", lambda *args, writes=writes: writes)
        _, dweight = torch.ops.turbo_inductor.fp8_linear_bwd(dy, None, w, *saved, "rowwise", "reference")
        assert dweight.dtype == torch.float32
        wgrads.append(dweight)
    torch.testing.assert_close(wgrads[1], wgrads[0].bfloat16().float(), rtol=0, atol=0)
    assert not torch.equal(wgrads[0], wgrads[1])
