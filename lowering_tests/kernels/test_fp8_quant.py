"""FP8 quantization kernels called directly (not through torch.ops): the reference and the Triton implementation
against float64 math written here. Without a GPU the Triton kernels run in the interpreter (conftest sets
TRITON_INTERPRET=1), whose fp32 -> fp8 casts round ~2% of values wrongly: there, quantized values are compared after
dequantization, and the only deviations allowed are the documented ones. On a GPU the Triton kernel must equal the
reference bit for bit."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from turbo_inductor.kernels import registry
from turbo_inductor.kernels.aiter import fp8_quant as aiter_fp8
from turbo_inductor.kernels.native import fp8_quant as native_fp8
from turbo_inductor.kernels.reference import fp8_quant as reference_fp8
from turbo_inductor.kernels.triton import fp8_quant as triton_fp8
from turbo_inductor.kernels.triton import interpreting
from turbo_inductor.testing.implementations import native_on_device

# The interpreter's range() over runtime bounds reads a 1-element array as a scalar: numpy warns, harmlessly.
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")

DEVICE = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
INTERPRETED = interpreting()
IMPLS = {"reference": reference_fp8, "triton": triton_fp8, **native_on_device()}
OCP = [torch.float8_e4m3fn, torch.float8_e5m2]
FNUZ = [torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]
# Mantissa bits (torch.finfo(float8_e5m2fnuz).eps says 0.125: wrong, it has two).
MANTISSA_BITS = {torch.float8_e4m3fn: 3, torch.float8_e5m2: 2, torch.float8_e4m3fnuz: 3, torch.float8_e5m2fnuz: 2}
INPUT_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# Shapes covering each size in both dimensions: one element, one row or column, whole and partial 128-blocks.
# 140 x 140 still takes the two-pass path for whole-tensor and column blocks.
SHAPES = [(1, 1), (1, 300), (17, 128), (128, 17), (300, 1), (140, 140)]
# name -> (block_rows, block_cols, power_of_two); None stands for the whole dim.
BLOCKS = {
    "tensorwise": (None, None, False),
    "rowwise": (1, None, False),
    "column": (None, 1, False),  # a transposed rowwise operand's blocks
    "act_1x128": (1, 128, False),
    "weight_128x128": (128, 128, False),
    "mx_1x32": (1, 32, True),
}


def _block(name, M, K):
    br, bc, pow2 = BLOCKS[name]
    return (M if br is None else br), (K if bc is None else bc), pow2


def _fmt(d):
    return str(d).replace("torch.float8_", "")


# ---------------------------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------------------------
def _rand(M, K, dtype, seed, outliers=True):
    """Normal values, row magnitudes spread over 2^-6 .. 2^6, and ~1% outliers 30x larger. Never zero."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g, dtype=torch.float64)
    x = x + 0.01 * torch.sign(x)
    if outliers:
        x = x * torch.exp2(torch.randint(-6, 7, (M, 1), generator=g).double())
        x = torch.where(torch.rand(M, K, generator=g) < 0.01, 30.0 * x, x)
    return x.to(dtype).to(DEVICE)


# ---------------------------------------------------------------------------------------------------------------
# float64 oracle
# ---------------------------------------------------------------------------------------------------------------
def _block_amax64(t, br, bc):
    """max |t| per br x bc block (partial edge blocks: the elements that exist), float64."""
    M, K = t.shape
    nr, nc = -(-M // br), -(-K // bc)
    padded = torch.zeros(nr * br, nc * bc, dtype=torch.float64)
    padded[:M, :K] = t.double().cpu().abs()
    return padded.view(nr, br, nc, bc).amax(dim=(1, 3))


def _expand(scale, br, bc, M, K):
    """A per-block tensor broadcast to every element of [M, K]."""
    return scale.repeat_interleave(br, 0)[:M].repeat_interleave(bc, 1)[:, :K]


def _correct_fp8(x, scale_full, fp8_dtype):
    """What a correctly rounding saturating cast gives for x / scale (torch's cast is correct on CPU)."""
    fmax = torch.finfo(fp8_dtype).max
    y = x.float().cpu() / scale_full.float()
    return y.clamp(-fmax, fmax).to(fp8_dtype).float()


@contextlib.contextmanager
def _poisoned_allocations():
    """torch.empty returns NaN-filled floating (fp8 too) tensors meanwhile: an output element the kernel leaves
    unwritten shows as NaN (finite inputs never give NaN)."""
    real_empty = torch.empty

    def empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        if t.is_floating_point():
            t.fill_(float("nan"))
        return t

    torch.empty = empty
    try:
        yield
    finally:
        torch.empty = real_empty


def _check_dequantized(impl_name, x, qx, s, fp8_dtype, br, bc):
    """q (in x's orientation, float) times its blocks' scales ``s`` against finite x, float64. Returns deq on CPU."""
    M, K = x.shape
    x64 = x.double().cpu()
    # Dequantized values: correct rounding is within half an ulp (relative 2^-(m+1)) in the normal range and half
    # the smallest subnormal below it; the interpreter truncates subnormals (a whole one: the abs term allows it).
    assert bool(torch.isfinite(qx).all()), "finite input must give finite fp8 (saturating cast, all written)"
    s_full = _expand(s, br, bc, M, K)
    deq = qx.double() * s_full
    m = MANTISSA_BITS[fp8_dtype]
    smallest_subnormal = torch.finfo(fp8_dtype).smallest_normal * 2.0**-m
    tol = 2.0 ** -(m + 1) * (1 + 1e-5) * x64.abs() + smallest_subnormal * s_full
    bad = (deq - x64).abs() > tol
    if impl_name == "triton" and INTERPRETED:
        # The interpreter's store defect: a value rounding up onto a power of two 2^e (odd exponent field) is
        # stored as 2^(e-1). Exactly that, and nothing else, may be off.
        correct = _correct_fp8(x, s_full, fp8_dtype)
        onto_power_of_two = torch.frexp(correct)[0].abs() == 0.5
        defect = bad & (qx == correct / 2) & onto_power_of_two
        assert torch.equal(bad, defect), f"{int((bad & ~defect).sum())} values off beyond the interpreter's defect"
        deq = torch.where(defect, correct.double() * s_full, deq)
    else:
        assert not bool(bad.any()), (
            f"{int(bad.sum())} of {bad.numel()} values off; worst {((deq - x64).abs() - tol).max().item()}"
        )
    return deq


def _check(impl_name, x, fp8_dtype, block_rows, block_cols, transpose, power_of_two=False):
    """Quantizes finite ``x`` and checks layout, scales (float64 oracle), dequantized values (the format's rounding
    bound) and saturation. Returns (q, scale, deq) with q in x's orientation and deq float64 on CPU (on the
    interpreter, elements hit by its store defect are repaired in deq after being checked to be exactly that)."""
    impl = IMPLS[impl_name]
    with _poisoned_allocations():
        q, scale = impl.fp8_quantize(x, fp8_dtype, block_rows, block_cols, transpose, power_of_two=power_of_two)
    M, K = x.shape
    n_br, n_bc = -(-M // block_rows), -(-K // block_cols)
    assert q.dtype == fp8_dtype and tuple(q.shape) == ((K, M) if transpose else (M, K)) and q.is_contiguous()
    assert scale.dtype == torch.float32 and tuple(scale.shape) == (n_br, n_bc) and scale.is_contiguous()
    assert q.device.type == DEVICE.type and scale.device.type == DEVICE.type
    br, bc = min(block_rows, M), min(block_cols, K)
    fmax = torch.finfo(fp8_dtype).max
    x64 = x.double().cpu()
    qx = (q.t() if transpose else q).float().cpu()  # q in x's orientation
    s = scale.double().cpu()

    # Scales against float64.
    amax = _block_amax64(x64, br, bc)
    ratio = amax.clamp_min(1e-12) / fmax
    if power_of_two:
        mantissa, _ = torch.frexp(s)
        assert bool((mantissa == 0.5).all()), "power-of-two scales must be exact powers of two"
        assert bool((s >= ratio * (1 - 2.0**-23)).all()) and bool((s < 2 * ratio).all())
    else:
        torch.testing.assert_close(s, ratio, rtol=1e-6, atol=0)

    deq = _check_dequantized(impl_name, x, qx, s, fp8_dtype, br, bc)

    # Saturation: each block's largest value lands on +-fmax exactly (not beyond: the cast saturates).
    if not power_of_two:
        assert bool((_block_amax64(qx, br, bc) == fmax).all())

    # On a GPU the Triton and native kernels equal the reference bit for bit.
    if impl_name != "reference" and not INTERPRETED:
        q_ref, s_ref = reference_fp8.fp8_quantize(
            x, fp8_dtype, block_rows, block_cols, transpose, power_of_two=power_of_two
        )
        assert torch.equal(scale, s_ref)
        assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    return (q.t() if transpose else q), scale, deq


def _snr_db(x, deq):
    x64 = x.double().cpu()
    return 10 * math.log10(float((x64**2).sum()) / float(((x64 - deq) ** 2).sum()))


# ---------------------------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("M, K", SHAPES, ids=lambda size: str(size))
@pytest.mark.parametrize("transpose", [False, True], ids=["rowmajor", "transposed"])
@pytest.mark.parametrize("block", list(BLOCKS))
@pytest.mark.parametrize("fp8_dtype", OCP, ids=_fmt)
@pytest.mark.parametrize("impl_name", list(IMPLS))
def test_quantize(impl_name, fp8_dtype, block, transpose, M, K):
    # Input dtypes rotate over the shapes and blocks, so that every block shape sees all three.
    dtype = INPUT_DTYPES[(SHAPES.index((M, K)) + list(BLOCKS).index(block)) % 3]
    br, bc, pow2 = _block(block, M, K)
    x = _rand(M, K, dtype, seed=M * 1000 + K)
    _check(impl_name, x, fp8_dtype, br, bc, transpose, power_of_two=pow2)


@pytest.mark.parametrize("transpose", [False, True], ids=["rowmajor", "transposed"])
@pytest.mark.parametrize("block", list(BLOCKS))
@pytest.mark.parametrize("fp8_dtype", FNUZ, ids=_fmt)
def test_fnuz_reference(fp8_dtype, block, transpose):
    # Triton's interpreter cannot cast to the fnuz formats: the reference only (the Triton kernel on ROCm).
    M, K = 130, 300
    br, bc, pow2 = _block(block, M, K)
    _check("reference", _rand(M, K, torch.bfloat16, seed=3), fp8_dtype, br, bc, transpose, power_of_two=pow2)


@pytest.mark.skipif(DEVICE.type != "cpu", reason="what the CPU interpreter cannot do")
@pytest.mark.parametrize("fp8_dtype", FNUZ, ids=_fmt)
def test_triton_fnuz_is_refused_on_cpu(fp8_dtype):
    with pytest.raises(NotImplementedError, match="reference"):
        triton_fp8.fp8_quantize(torch.ones(4, 4), fp8_dtype, 1, 4, False)


@pytest.mark.parametrize("block", ["tensorwise", "rowwise", "weight_128x128", "mx_1x32"])
@pytest.mark.parametrize("impl_name", list(IMPLS))
def test_power_of_two_scales(impl_name, block):
    # Power-of-two scales on every granularity (mx_1x32 covers them already in test_quantize; here the others),
    # and scales-as-usual on the MX granularity.
    M, K = 130, 200
    br, bc, pow2 = _block(block, M, K)
    x = _rand(M, K, torch.float32, seed=5)
    for fp8_dtype in OCP:
        _check(impl_name, x, fp8_dtype, br, bc, transpose=False, power_of_two=not pow2)


@pytest.mark.parametrize("fp8_dtype", OCP + FNUZ, ids=_fmt)
def test_saturating_cast(fp8_dtype):
    # Values beyond fmax * scale cannot come out of fp8_quantize (the scale comes from the amax), so the clamp is
    # tested on the reference's cast step with a hand-built block.
    fmax = torch.finfo(fp8_dtype).max
    y = torch.tensor([1e30, -1e30, float("inf"), float("-inf"), 1.01 * fmax, -1.5 * fmax, fmax, 0.5, float("nan")])
    out = reference_fp8.saturating_cast(y, fp8_dtype).float()
    expected = torch.tensor([fmax, -fmax, fmax, -fmax, fmax, -fmax, fmax, 0.5, float("nan")])
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf / inf in the interpreter
@pytest.mark.parametrize("bad", ["nan", "inf"])
@pytest.mark.parametrize("block", list(BLOCKS))
@pytest.mark.parametrize("fp8_dtype", OCP, ids=_fmt)
@pytest.mark.parametrize("impl_name", list(IMPLS))
def test_non_finite_input(impl_name, fp8_dtype, block, bad):
    # A NaN (inf) makes its block's scale NaN (inf) and the block dequantize to NaN; the other blocks are untouched.
    M, K = 40, 70
    br, bc, pow2 = _block(block, M, K)
    impl = IMPLS[impl_name]
    x = _rand(M, K, torch.float32, seed=7)
    r, c = 33, 45
    x_bad = x.clone()
    x_bad[r, c] = float(bad)
    for transpose in (False, True):
        q_bad, s_bad = impl.fp8_quantize(x_bad, fp8_dtype, br, bc, transpose, power_of_two=pow2)
        q, s = impl.fp8_quantize(x, fp8_dtype, br, bc, transpose, power_of_two=pow2)
        if transpose:
            q_bad, q = q_bad.t(), q.t()
        rb, cb = r // min(br, M), c // min(bc, K)
        hit = torch.zeros_like(s, dtype=torch.bool)
        hit[rb, cb] = True
        assert (s_bad[rb, cb].isnan() if bad == "nan" else s_bad[rb, cb] == float("inf")).item()
        assert torch.equal(s_bad[~hit], s[~hit])
        in_block = _expand(hit.cpu(), min(br, M), min(bc, K), M, K).to(DEVICE)
        deq_bad = q_bad.float() * _expand(s_bad.cpu(), min(br, M), min(bc, K), M, K).to(DEVICE)
        assert bool(deq_bad[in_block].isnan().all())
        assert q_bad.float()[r, c].isnan().item()  # NaN / scale, inf / inf: NaN
        assert torch.equal(q_bad.view(torch.uint8)[~in_block], q.view(torch.uint8)[~in_block])


@pytest.mark.parametrize("power_of_two", [False, True])
@pytest.mark.parametrize("block", list(BLOCKS))
@pytest.mark.parametrize("impl_name", list(IMPLS))
def test_amax_floor_on_zero_block(impl_name, block, power_of_two):
    # The only place zeros are allowed: an all-zero block gets the floored scale (1e-12 / fmax) and exact zeros.
    M, K = 140, 160
    br, bc, _ = _block(block, M, K)
    x = _rand(M, K, torch.float32, seed=11)
    x[: min(br, M), : min(bc, K)] = 0.0  # block (0, 0)
    fp8_dtype = torch.float8_e4m3fn
    q, s = IMPLS[impl_name].fp8_quantize(x, fp8_dtype, br, bc, False, power_of_two=power_of_two)
    floor_scale = torch.tensor(1e-12, dtype=torch.float32) / torch.finfo(fp8_dtype).max  # fp32 division
    if power_of_two:
        floor_scale = torch.exp2(torch.ceil(torch.log2(floor_scale.double()))).float()
    assert s[0, 0].item() == floor_scale.item()
    assert torch.equal(
        q[: min(br, M), : min(bc, K)].view(torch.uint8),
        torch.zeros(min(br, M), min(bc, K), dtype=torch.uint8, device=DEVICE),
    )
    if s.numel() > 1:
        assert bool((s.flatten()[1:] > 1e-6).all())  # the other blocks are scaled as usual
    assert bool(torch.isfinite(q.float()).all())


@pytest.mark.parametrize("block", list(BLOCKS))
@pytest.mark.parametrize("fp8_dtype", OCP, ids=_fmt)
@pytest.mark.parametrize("impl_name", list(IMPLS))
def test_round_trip_snr(impl_name, fp8_dtype, block):
    # SNR of x against dequant(quant(x)) on normal data: >= 25 dB for e4m3, >= 20 dB for e5m2.
    M, K = 136, 256  # whole-tensor blocks still take two passes (256 x 256 padded)
    x = _rand(M, K, torch.float32, seed=13, outliers=False)
    br, bc, pow2 = _block(block, M, K)
    _, _, deq = _check(impl_name, x, fp8_dtype, br, bc, transpose=False, power_of_two=pow2)
    floor = 25.0 if fp8_dtype == torch.float8_e4m3fn else 20.0
    assert _snr_db(x, deq) >= floor


@pytest.mark.parametrize("layout", ["transposed_view", "column_stride_2", "row_slice"])
@pytest.mark.parametrize("block", ["rowwise", "act_1x128", "tensorwise"])
@pytest.mark.parametrize("impl_name", list(IMPLS))
def test_strided_input(impl_name, block, layout):
    M, K = 70, 150
    if layout == "transposed_view":
        x = _rand(K, M, torch.bfloat16, seed=17).t()
    elif layout == "column_stride_2":
        x = _rand(M, 2 * K, torch.bfloat16, seed=17)[:, ::2]
    else:
        x = _rand(M + 5, K + 3, torch.bfloat16, seed=17)[3 : M + 3, 2 : K + 2]
    assert tuple(x.shape) == (M, K) and not x.is_contiguous()
    br, bc, pow2 = _block(block, M, K)
    q, s, _ = _check(impl_name, x, torch.float8_e4m3fn, br, bc, transpose=True, power_of_two=pow2)
    q_c, s_c = IMPLS[impl_name].fp8_quantize(x.contiguous(), torch.float8_e4m3fn, br, bc, True)
    assert torch.equal(s, s_c) and torch.equal(q.t().contiguous().view(torch.uint8), q_c.view(torch.uint8))


@pytest.mark.parametrize("impl_name", list(IMPLS))
def test_odd_block_shapes(impl_name):
    # Blocks that are not powers of two (and larger than the tensor): outside the usual recipes, still exact.
    x = _rand(23, 50, torch.float32, seed=19)
    for br, bc in [(3, 5), (5, 48), (100, 7), (23, 50), (1000, 1000)]:
        for transpose in (False, True):
            _check(impl_name, x, torch.float8_e5m2, br, bc, transpose)


@pytest.fixture
def tiny_tiles(monkeypatch):
    """Shrink the tiles so that every block shape takes the two-pass path (amax, scale, cast), with several
    sub-tiles per block, several tiles per amax program where a block spans all rows, and several loop iterations
    in the scale kernel, on small shapes."""
    monkeypatch.setattr(triton_fp8, "TILE_ELEMENTS", 128)
    monkeypatch.setattr(triton_fp8, "MAX_TILE_ELEMENTS", 16)
    monkeypatch.setattr(triton_fp8, "MAX_TILE_COLS", 32)
    monkeypatch.setattr(triton_fp8, "TRANSPOSE_MIN_ROWS", 8)
    monkeypatch.setattr(triton_fp8, "REDUCE_TILE_ELEMENTS", 4)
    monkeypatch.setattr(triton_fp8, "AMAX_PROGRAMS", 2)  # blocks spanning all rows: the amax pass loops


# 10 rows: partial row tiles in both layouts. 140 columns: a partial 128-block, and more partial maxima per row than
# a scale-kernel step takes. Column and MX blocks need fewer: 40 columns give side-by-side scales in several
# programs, 70 a partial 32-block.
TWO_PASS_SHAPES = {
    "tensorwise": (10, 140),
    "rowwise": (10, 140),
    "column": (10, 40),
    "act_1x128": (10, 140),
    "weight_128x128": (130, 140),
    "mx_1x32": (10, 70),
}


@pytest.mark.parametrize("transpose", [False, True], ids=["rowmajor", "transposed"])
@pytest.mark.parametrize("block", list(BLOCKS))
def test_triton_two_pass_path(tiny_tiles, monkeypatch, block, transpose):
    M, K = TWO_PASS_SHAPES[block]
    if block == "weight_128x128":
        # Two block rows and columns, the second partial, in 512-element tiles: still many sub-tiles per block,
        # in a third of the programs (the interpreter runs them in turn).
        monkeypatch.setattr(triton_fp8, "TILE_ELEMENTS", 512)
    br, bc, pow2 = _block(block, M, K)
    tiling = triton_fp8.fp8_tiling(M, K, br, bc, transpose)
    assert not tiling.fused
    x = _rand(M, K, torch.bfloat16, seed=23)
    q, s, _ = _check("triton", x, torch.float8_e4m3fn, br, bc, transpose, power_of_two=pow2)
    # Deterministic (no atomics): a second run is bitwise identical.
    q2, s2 = triton_fp8.fp8_quantize(x, torch.float8_e4m3fn, br, bc, transpose, power_of_two=pow2)
    assert torch.equal(s, s2) and torch.equal(
        (q.t() if transpose else q).contiguous().view(torch.uint8), q2.view(torch.uint8)
    )


@pytest.mark.parametrize("experts, rows", [(4, 32), (3, 48)])
def test_per_expert_column_blocks_reduce_several_tiles_of_one_expert_per_program(tiny_tiles, experts, rows):
    """An MoE weight's transposed rowwise operand: a column block per expert's rows. An amax program reduces several
    tiles, all of one expert: its four 8-row tiles for 32 rows, pairs of its six for 48."""
    M, K = experts * rows, 24
    tiling = triton_fp8.fp8_tiling(M, K, rows, 1, True)
    row_tiles = triton_fp8.amax_row_tiles(tiling, M, K, rows, experts)
    assert not tiling.fused and rows % (tiling.tile_rows * row_tiles) == 0
    assert tiling.tile_rows == 8 and row_tiles == (4 if rows == 32 else 2), (tiling, row_tiles)
    x = _rand(M, K, torch.bfloat16, seed=29)
    _check("triton", x, torch.float8_e4m3fn, rows, 1, True)


def _both_layouts_block(name, M, K):
    """A block for both layouts: the whole dimension as the larger of the two, which spans it in either layout."""
    br, bc, pow2 = BLOCKS[name]
    return br or max(M, K), bc or max(M, K), pow2


# The tiny tiles' many programs take the interpreter long: 18 rows (or columns) still make partial tiles in both
# layouts, with 42 the other way (140 for a partial 128-block); three blocks take each orientation.
TINY_TILES_SHAPES = {
    "tensorwise": (18, 42),
    "rowwise": (42, 18),
    "column": (18, 42),
    "act_1x128": (18, 140),
    "weight_128x128": (140, 18),
    "mx_1x32": (42, 18),
}


@pytest.mark.parametrize(
    "block,M,K,two_pass",
    [
        (block, *shape)
        for block in BLOCKS
        for shape in [(130, 140, False), (140, 130, False), (*TINY_TILES_SHAPES[block], True)]
    ],
    ids=lambda v: str(v) if not isinstance(v, bool) else ("tiny_tiles" if v else "default_tiles"),
)
@pytest.mark.parametrize("impl_name", list(IMPLS))
def test_both_layouts_from_one_call(impl_name, block, M, K, two_pass, request):
    """``both_layouts``: x in its blocks and x^T in blocks of the same shape over x^T, from one call, bit for bit what
    quantizing x and x^T apart gives; q_t is q transposed where the blocks are the same in both layouts."""
    if two_pass:
        request.getfixturevalue("tiny_tiles")
    br, bc, pow2 = _both_layouts_block(block, M, K)
    x = _rand(M, K, torch.bfloat16, seed=31)
    quantize = IMPLS[impl_name].fp8_quantize
    q, scale, q_t, scale_t = quantize(x, torch.float8_e4m3fn, br, bc, False, power_of_two=pow2, both_layouts=True)
    want_q, want_scale = quantize(x, torch.float8_e4m3fn, br, bc, False, power_of_two=pow2)
    want_q_t, want_scale_t = quantize(x.t().contiguous(), torch.float8_e4m3fn, br, bc, False, power_of_two=pow2)
    assert q.shape == (M, K) and q_t.shape == (K, M) and all(t.is_contiguous() for t in (q, scale, q_t, scale_t))
    assert torch.equal(scale, want_scale) and torch.equal(scale_t, want_scale_t)
    # Row-major strides, also of a size-1 dimension: the fakes allocate them, and the native kernels write them.
    assert scale_t.stride() == want_scale_t.stride()
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(q_t.view(torch.uint8), want_q_t.view(torch.uint8))
    if reference_fp8.layouts_share_blocks(M, K, br, bc):
        assert torch.equal(q_t.view(torch.uint8), q.t().contiguous().view(torch.uint8))
    with pytest.raises(ValueError, match="both layouts only with transpose=False"):
        quantize(x, torch.float8_e4m3fn, br, bc, True, both_layouts=True)


def _bits(t):
    """``t``'s bits, to compare NaN equal to NaN."""
    return t.view(torch.uint8 if t.element_size() == 1 else torch.int32)


@pytest.mark.parametrize(
    "experts, rows, programs, row_tiles",
    [(1, 40, 1024, 1), (1, 40, 2, 4), (3, 32, 2, 8), (4, 24, 4, 2)],
    ids=["rowwise", "rowwise_looping", "per_expert_one_program_each", "per_expert_three_programs_each"],
)
def test_both_layouts_with_column_blocks_read_x_twice(monkeypatch, experts, rows, programs, row_tiles):
    """Both layouts where x^T's blocks are columns of x: rowwise over all rows, or an MoE weight's per-expert rows
    (``block_cols_t``). The one-pass row kernel also writes column maxima (its programs loop over tiles of one
    block), which give x^T's scales: bit for bit what two calls give, NaN included, and the float64 oracle's scales."""
    monkeypatch.setattr(triton_fp8, "TILE_ELEMENTS", 128)  # rows of 24 in 4-row tiles, so that programs loop
    monkeypatch.setattr(triton_fp8, "COLUMN_MAXIMA_PROGRAMS", programs)
    monkeypatch.setattr(triton_fp8, "COLUMN_MAXIMA_MIN_ROWS", 1)
    original, taken = triton_fp8._rows_and_column_blocks, []
    monkeypatch.setattr(triton_fp8, "_rows_and_column_blocks", lambda *args: taken.append(args) or original(*args))
    M, K = experts * rows, 24
    # Rowwise: blocks of the whole dimension in either layout (as kernel_block gives them); per expert: explicit.
    block_cols, block_cols_t = (K, rows) if experts > 1 else (M + K + 1, 0)
    assert triton_fp8.column_maxima_row_tiles(M, K, 1, block_cols, block_cols_t or block_cols) == row_tiles
    x = _rand(M, K, torch.bfloat16, seed=41)
    quantize = triton_fp8.fp8_quantize
    fp8 = torch.float8_e4m3fn
    q, scale, q_t, scale_t = quantize(x, fp8, 1, block_cols, False, both_layouts=True, block_cols_t=block_cols_t)
    assert len(taken) == 1
    oracle = _block_amax64(x, rows, 1).clamp_min(1e-12) / torch.finfo(fp8).max
    torch.testing.assert_close(scale_t.double().cpu(), oracle.t(), rtol=1e-6, atol=0)
    x[5, 7] = float("nan")
    got = quantize(x, fp8, 1, block_cols, False, both_layouts=True, block_cols_t=block_cols_t)
    want = reference_fp8.both_layouts_by_two_calls(quantize, x, fp8, 1, block_cols, False, block_cols_t)
    assert len(taken) == 2 and scale_t.shape == (K, experts) and bool(got[3][7].isnan().any())
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.stride() == w.stride() and torch.equal(_bits(g), _bits(w))


# Compiles the row kernel writing column maxima to sm_90 machine code with Triton's own ptxas, specialized as a launch
# on contiguous bf16 x: Mixtral's expert weights flattened for their per-expert transposed operand (rows of 4096 and of
# 14336). Prints per weight its tiles per program, spilled bytes and 16-byte loads.
def test_the_row_pass_with_column_maxima_compiles_for_hopper_without_spills():
    """The kernel as the GPU runs it (``turbo_inductor.testing.hopper``): at Mixtral's expert widths its programs loop
    over tiles, read 16 bytes at a time, and the column maxima beside the tile spill no register (a 16384-wide tile
    holds 32 values and 32 maxima per thread of 16 warps)."""
    from turbo_inductor.testing import hopper

    launches = hopper.facts_in_a_process("gate_up_weight", "down_weight")
    row_passes = [f for f in launches if f["constexprs"].get("COLUMN_MAXIMA")]
    assert len(row_passes) == 2, launches
    for row_pass in row_passes:
        assert row_pass["constexprs"]["ROW_TILES"] > 1 and row_pass["vector_loads"] > 0, row_pass
        assert row_pass["spilled"] == 0, row_pass


def test_both_layouts_with_column_blocks_take_two_calls_where_the_row_pass_cannot_give_them():
    """The column maxima need x's blocks in one pass, room in registers beside the tile, and x^T's blocks one column
    wide, holding whole row tiles and at least COLUMN_MAXIMA_MIN_ROWS rows; where x^T's blocks take one pass, two
    calls read x twice already."""
    tiles = triton_fp8.column_maxima_row_tiles
    assert tiles(8192, 4096, 1, 4096, 8192) and tiles(8 * 28672, 4096, 1, 4096, 28672)
    assert not tiles(8192, 65536, 1, 65536, 8192)  # x's rows take two passes
    assert tiles(8192, 16384, 1, 16384, 8192) and not tiles(8192, 28672, 1, 28672, 8192)  # 32768 maxima: no room
    assert tiles(16384, 4096, 1, 128, 4096)  # x's 1 x 128 blocks, a row per tile
    assert not tiles(8208, 256, 1, 256, 4104)  # x^T's blocks of 4104 rows split x's 16-row tiles
    # Qwen3-MoE's experts: blocks of fewer rows than COLUMN_MAXIMA_MIN_ROWS, faster in two calls on an H100
    assert not tiles(128 * 1536, 2048, 1, 2048, 1536) and not tiles(128 * 2048, 768, 1, 768, 2048)
    assert not tiles(8192, 4096, 128, 128, 128)  # x^T's blocks span 128 columns
    assert not tiles(8192, 1, 1, 1, 8192)  # one column: x^T's blocks take one pass
    assert not tiles(0, 4096, 1, 4096, 8192)


def test_layouts_share_blocks():
    share = reference_fp8.layouts_share_blocks
    assert share(300, 200, 300, 300) and share(300, 200, 128, 128) and share(300, 200, 1000, 1000)
    assert not share(300, 200, 300, 200)  # the whole of x is not the whole of x^T: x^T's rows are only 200 long
    assert not share(300, 200, 1, 300) and not share(300, 200, 1, 128)
    assert share(1, 1, 1, 300)


@pytest.mark.parametrize("shape", [(1, 7), (7, 1), (3, 5)])
@pytest.mark.parametrize("copy", [False, True])
def test_transposed_scale(shape, copy):
    """Row-major strides whatever the input's; a contiguous vector's transpose is a view of it unless ``copy``, and
    a block grid's a copy."""
    scale = torch.rand(shape)
    t = reference_fp8.transposed_scale(scale, copy=copy)
    assert t.shape == shape[::-1] and t.stride() == (shape[0], 1) and torch.equal(t, scale.t())
    assert (t.untyped_storage().data_ptr() == scale.untyped_storage().data_ptr()) == (1 in shape and not copy)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("M,K", [(128, 256), (144, 256), (256, 128)])
@pytest.mark.parametrize("block", ["tensorwise", "rowwise", "weight_128x128"])
@pytest.mark.parametrize("impl_name", list(IMPLS))
def test_both_layouts_at_linear_sizes(impl_name, block, M, K, dtype):
    """Where Triton 3.6's kernel storing both layouts in one launch wrote a wrong x^T on the H200 (fp32 at every
    size, bf16 at some): q_t must be what quantizing x^T gives, bit for bit."""
    br, bc, _ = _both_layouts_block(block, M, K)
    x = _rand(M, K, dtype, seed=37)
    quantize = IMPLS[impl_name].fp8_quantize
    _, _, q_t, scale_t = quantize(x, torch.float8_e4m3fn, br, bc, False, both_layouts=True)
    want_q_t, want_scale_t = quantize(x.t().contiguous(), torch.float8_e4m3fn, br, bc, False)
    assert torch.equal(scale_t, want_scale_t) and torch.equal(q_t.view(torch.uint8), want_q_t.view(torch.uint8))


def test_tiling_heuristics():
    T, tiling = triton_fp8, triton_fp8.fp8_tiling
    # One pass, about TILE_ELEMENTS per program: whole rows of 1x128 / 1x32 blocks, one 128x128 block.
    assert tiling(8192, 4096, 1, 128, False) == T.Fp8Tiling(True, 1, 128, 1, 32, 8)
    assert tiling(8192, 4096, 1, 32, False) == T.Fp8Tiling(True, 1, 32, 1, 128, 8)
    assert tiling(8192, 4096, 128, 128, False) == T.Fp8Tiling(True, 128, 128, 1, 1, 16)
    assert tiling(8192, 4096, 128, 128, True).fused
    # Rowwise in one pass up to 32768 columns; a row per program (rows group when they are short).
    assert tiling(8192, 4096, 1, 4096, False) == T.Fp8Tiling(True, 1, 4096, 1, 1, 8)
    assert tiling(8192, 28672, 1, 28672, False) == T.Fp8Tiling(True, 1, 32768, 1, 1, 16)
    assert tiling(8192, 256, 1, 256, False) == T.Fp8Tiling(True, 1, 256, 16, 1, 8)
    assert not tiling(64, 65536, 1, 65536, False).fused
    # Transposed: tiles hold TRANSPOSE_MIN_ROWS rows (32 contiguous bytes per q^T row).
    assert tiling(8192, 4096, 1, 128, True) == T.Fp8Tiling(True, 1, 128, 32, 1, 8)
    assert tiling(8192, 4096, 1, 32, True) == T.Fp8Tiling(True, 1, 32, 32, 4, 8)
    assert tiling(8192, 4096, 1, 4096, True) == T.Fp8Tiling(False, 1, 128, 32, 1, 8)
    # Column blocks (a transposed rowwise operand): two passes over coalesced 32-row tiles, not one tall column.
    assert tiling(8192, 4096, 8192, 1, True) == T.Fp8Tiling(False, 32, 1, 1, 128, 8)
    assert tiling(8192, 1, 8192, 1, True).fused  # a one-column x is contiguous down its rows
    # Tensorwise: two passes; one sub-tile per tile (one partial max per program).
    assert tiling(8192, 4096, 8192, 4096, False) == T.Fp8Tiling(False, 4, 1024, 1, 1, 8)
    assert tiling(8192, 4096, 8192, 4096, True) == T.Fp8Tiling(False, 32, 128, 1, 1, 8)
    for M, K, br, bc, tr in [
        (1, 1, 1, 1, False),
        (17, 300, 128, 128, True),
        (300, 17, 3, 5, True),
        (5, 100000, 1, 100000, False),
        (100000, 3, 100000, 3, True),
    ]:
        t = tiling(M, K, br, bc, tr)
        assert t.tile_rows * t.tile_cols <= max(T.TILE_ELEMENTS, T.MAX_TILE_ELEMENTS)
        assert 1 <= t.num_warps <= T.MAX_NUM_WARPS


@pytest.mark.parametrize("impl_name", list(IMPLS))
def test_empty_and_invalid(impl_name):
    impl = IMPLS[impl_name]
    for M, K, transpose in [(0, 5, False), (4, 0, True)]:
        q, s = impl.fp8_quantize(torch.empty(M, K, device=DEVICE), torch.float8_e4m3fn, 1, 128, transpose)
        assert tuple(q.shape) == ((K, M) if transpose else (M, K)) and tuple(s.shape) == (M, -(-K // 128))
    x = torch.ones(4, 4, device=DEVICE)
    for args in [
        (x[None], torch.float8_e4m3fn, 1, 4),
        (x.double(), torch.float8_e4m3fn, 1, 4),
        (x, torch.bfloat16, 1, 4),
        (x, torch.float8_e4m3fn, 0, 4),
    ]:
        with pytest.raises(ValueError, match="fp8_quantize"):
            impl.fp8_quantize(*args, False)


def test_registered_with_the_dispatcher():
    impls = registry.implementations("fp8_quantize")
    assert impls["triton"].fn is triton_fp8.fp8_quantize
    assert impls["reference"].fn is reference_fp8.fp8_quantize
    assert impls["triton"].priority == 20 and impls["reference"].priority == 0
    assert impls["reference"].unavailable_reason(torch.device("cpu")) is None


@pytest.mark.parametrize("two_pass", [False, True], ids=["default_tiles", "tiny_tiles"])
@pytest.mark.parametrize("transpose", [False, True], ids=["rowmajor", "transposed"])
@pytest.mark.parametrize("block", list(BLOCKS))
@pytest.mark.parametrize("impl_name", ["reference", "triton"])
def test_cast_by_given_scale(impl_name, block, transpose, two_pass, request):
    """A given scale (the backward's W^T cast by the forward's scales): q alone, the bytes of a call that took the
    same scales itself; a scale twice as large casts by that one."""
    if two_pass:
        if impl_name == "reference":
            pytest.skip("the reference has no tiles")
        request.getfixturevalue("tiny_tiles")
    M, K = TWO_PASS_SHAPES[block]
    br, bc, pow2 = _block(block, M, K)
    impl = IMPLS[impl_name]
    x = _rand(M, K, torch.bfloat16, seed=29)
    q, scale = impl.fp8_quantize(x, torch.float8_e4m3fn, br, bc, transpose, power_of_two=pow2)
    given = impl.fp8_quantize(x, torch.float8_e4m3fn, br, bc, transpose, scale=scale)
    assert given.shape == q.shape and torch.equal(given.view(torch.uint8), q.view(torch.uint8))
    doubled = impl.fp8_quantize(x, torch.float8_e4m3fn, br, bc, transpose, scale=scale * 2)
    qx = (doubled.t() if transpose else doubled).float().cpu()
    _check_dequantized(impl_name, x, qx, scale.double().cpu() * 2, torch.float8_e4m3fn, min(br, M), min(bc, K))
    assert not torch.equal(doubled.view(torch.uint8), q.view(torch.uint8))


def test_given_scale_of_the_wrong_shape_is_named():
    """A given scale must have one float32 value per block of x; the native and aiter kernels decline one."""
    x = _rand(8, 64, torch.bfloat16, seed=31)
    for impl in (reference_fp8, triton_fp8):
        with pytest.raises(ValueError, match=r"given scale must be float32 \[8, 1\]"):
            impl.fp8_quantize(x, torch.float8_e4m3fn, 1, 64, False, scale=torch.ones(1, 1, device=x.device))
    for adapter in (native_fp8, aiter_fp8):
        reason = adapter.supports(x, torch.float8_e4m3fn, 1, 64, False, scale=torch.ones(8, 1, device=x.device))
        assert "no given scale" in reason
