"""RMSNorm and the GLU writing their output in FP8 (the quantization fused into its producer): the fused kernels
against the producer followed by the quantization kernel, bit for bit."""

import pytest
import torch

from turbo_inductor.kernels import registry
from turbo_inductor.kernels.triton import glu as triton_glu
from turbo_inductor.kernels.triton import rmsnorm as triton_rmsnorm
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.fp8 import E4M3, assert_bitwise_equal, quantize_rows


def _norm_then_quantize(impl, x, weight, residual, eps, block_cols, power_of_two):
    y, s_out, rstd = registry.implementations("rmsnorm_fwd")[impl].fn(x, weight, residual, eps)
    return y, s_out, rstd, *quantize_rows(impl, y, block_cols, power_of_two)


def _fused(impl, *args, **kwargs):
    return registry.implementations("rmsnorm_fwd_fp8")[impl].fn(*args, **kwargs)


IMPLS = ["reference", "triton"]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "block_cols, power_of_two", [(10**6, False), (128, False), (32, True)], ids=["row", "1x128", "1x32_pow2"]
)
@pytest.mark.parametrize("H", [256, 200])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("residual, weight", [(True, True), (False, True), (False, False)])
def test_fused_kernel_equals_the_norm_then_the_quantization(impl, block_cols, power_of_two, H, dtype, residual, weight):
    """Bit for bit (on CPU): the epilogue quantizes y as rounded to its dtype, with the quantization kernel's numerics
    (rows of a width that is not a power of two end in a partial block; 37 rows leave the last row tile partly
    empty)."""
    x = torch.randn(37, H, device=DEVICE, dtype=dtype) * 3
    x[5, 7] = float("nan")  # a NaN stays in its row's block and scale
    r = torch.randn_like(x) if residual else None
    w = torch.randn(H, device=DEVICE, dtype=dtype) if weight else None
    block = min(block_cols, H)
    got = _fused(impl, x, w, r, 1e-5, E4M3, block, power_of_two)
    want = _norm_then_quantize(impl, x, w, r, 1e-5, block, power_of_two)
    if DEVICE == "cuda":
        # Compiled with the epilogue, the row's sum of squares may be reduced in another order: y and rstd are within
        # a few ulps of the plain kernel's, and q and scale are exactly the quantization of the fused kernel's own y.
        for g, w_ in zip(got[:3], want[:3]):
            if w_ is not None:
                torch.testing.assert_close(
                    g, w_, rtol=2**-7 if dtype == torch.bfloat16 else 5e-7, atol=0, equal_nan=True
                )
        want = (*got[:3], *quantize_rows(impl, got[0], block, power_of_two))
    assert_bitwise_equal(got, want)
    assert got[4].shape == (37, -(-H // block)) and torch.isnan(got[4][5, 7 // block])


@pytest.mark.parametrize("case", ["wide rows", "block not a power of two"])
def test_triton_quantizes_after_the_norm_where_its_tile_cannot(case, monkeypatch):
    """Rows wider than one register tile (the norm's chunked kernel) and blocks that are not powers of two: y is
    quantized by the quantization kernel after the norm, with the same result."""
    if case == "wide rows":
        monkeypatch.setattr(triton_rmsnorm, "FWD_MAX_FUSED_BYTES", 256)
        block = 128
    else:
        block = 96
    x = torch.randn(9, 384, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(384, device=DEVICE, dtype=torch.bfloat16)
    assert_bitwise_equal(
        _fused("triton", x, w, None, 1e-6, E4M3, block, False),
        _norm_then_quantize("triton", x, w, None, 1e-6, block, False),
    )


GLU_SIZES = [
    (1792, 128, False),  # several chunks of 1 x 128 blocks per row (a chunk is 256 wide)
    (300, 32, True),  # rows narrower than a tile (several rows per tile), a partial last block
    (300, 300, False),  # one block per row, the row in one tile
    (1300, 1300, False),  # one block per row, wider than a tile: the quantization kernel after the GLU
    (300, 96, False),  # not a power of two: likewise
    (2100, 2048, False),  # a block wider than a tile: likewise
]
GLU_FORMS = ["halves", "separate", "moe"]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("F, block_cols, power_of_two", GLU_SIZES, ids=lambda v: str(v))
@pytest.mark.parametrize("form", GLU_FORMS)
def test_glu_kernel_equals_the_glu_then_the_quantization(impl, F, block_cols, power_of_two, form, monkeypatch):
    """Bit for bit, GPU included (the GLU is elementwise: no reduction order to differ): gate and up as the halves of
    one tensor (strided rows), as two tensors, and with MoE probs and a row mask (dropped rows: zeros, floor scales).
    The dtype alternates over sizes and forms."""
    size = GLU_SIZES.index((F, block_cols, power_of_two))
    dtype = [torch.bfloat16, torch.float32][(size + GLU_FORMS.index(form)) % 2]
    monkeypatch.setattr(triton_glu, "MAX_BLOCK_F", 1024)  # several chunks per row at test sizes
    monkeypatch.setattr(triton_glu, "MIN_BLOCK_F", 256)
    x = torch.randn(7, 2 * F, device=DEVICE, dtype=dtype) * 3
    gate, up = (x[:, :F], x[:, F:]) if form == "halves" else (x[:, :F].contiguous(), x[:, F:].contiguous())
    probs = torch.rand(7, device=DEVICE) if form == "moe" else None
    mask = torch.tensor([1, 0, 1, 1, 1, 0, 1], device=DEVICE, dtype=torch.bool) if form == "moe" else None
    glu = registry.implementations("glu_fwd")[impl].fn
    got = registry.implementations("glu_fwd_fp8")[impl].fn(
        gate, up, probs, mask, "silu", E4M3, block_cols, power_of_two
    )
    out = glu(gate, up, probs, mask, "silu")
    assert_bitwise_equal(got, (out, *quantize_rows(impl, out, block_cols, power_of_two)))
