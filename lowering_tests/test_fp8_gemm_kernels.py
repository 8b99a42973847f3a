"""The Triton FP8 GEMM against the fp32 emulation (the reference implementation) for every scaling granularity of
the recipes, odd sizes included, and through fp8_linear forward and backward. On CPU the kernel runs in Triton's
interpreter (small sizes); test_gpu.py runs it at real sizes."""
from __future__ import annotations

import pytest
import torch

import turbo_inductor
from conftest import DEVICE
from turbo_inductor.kernels.reference import fp8_gemm as reference_gemm
from turbo_inductor.kernels.reference import fp8_quant as reference_quant
from turbo_inductor.kernels.triton import fp8_gemm as triton_gemm

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
