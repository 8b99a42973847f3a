"""GLU (SwiGLU / GeGLU) kernels called directly (not through torch.ops): the reference and the Triton implementation
against float64 math written here. Without a GPU the Triton kernels run in the interpreter (conftest sets
TRITON_INTERPRET=1)."""

from __future__ import annotations

import contextlib
import math
import warnings

import pytest
import torch
import torch.nn.functional as F_

from turbo_inductor.kernels import registry
from turbo_inductor.kernels.reference import glu as reference_glu
from turbo_inductor.kernels.triton import glu as triton_glu

# The interpreter's range() over runtime bounds reads a 1-element array as a scalar: numpy warns, harmlessly.
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")

DEVICE = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
# Against float64. bf16 allows the interpreter's fp32 -> bf16 truncation (one ulp = 2^-7 relative at most).
TOL = {torch.float32: 1e-4, torch.bfloat16: 1e-2, torch.float16: 1e-2}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
IMPLS = {"reference": reference_glu, "triton": triton_glu}
ACTIVATIONS = ["silu", "gelu", "gelu_tanh"]
# (has_probs, has_mask)
FORMS = {"plain": (False, False), "probs": (True, False), "mask": (False, True), "probs_mask": (True, True)}
LAYOUTS = ["separate", "halves"]


# ---------------------------------------------------------------------------------------------------------------
# float64 oracle (the math of the contract, written out here)
# ---------------------------------------------------------------------------------------------------------------
def _act64(x, activation):
    """(act(x), act'(x)) in float64, from the textbook formulas."""
    if activation == "silu":
        s = 1.0 / (1.0 + torch.exp(-x))
        return x * s, s + x * s * (1.0 - s)
    if activation == "gelu":
        cdf = 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))
        pdf = torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        return x * cdf, cdf + x * pdf
    k, c = math.sqrt(2.0 / math.pi), 0.044715
    t = torch.tanh(k * (x + c * x**3))
    return 0.5 * x * (1.0 + t), 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * c * x * x)


def _expected(gate, up, dout, probs, mask, activation):
    """(out, dgate, dup, dprobs, dprobs_scale) in float64; dropped rows zero. dprobs_scale: sum of |terms| per row
    (the scale of an fp32 summation's rounding error)."""
    g, u, do = gate.double(), up.double(), dout.double()
    a, da = _act64(g, activation)
    p = probs.double()[:, None] if probs is not None else 1.0
    out, dg, du = a * u * p, do * u * p * da, do * a * p
    terms = do * a * u
    dprobs, scale = terms.sum(dim=1), terms.abs().sum(dim=1)
    if mask is not None:
        keep = mask[:, None]
        out, dg, du = (torch.where(keep, t, 0.0) for t in (out, dg, du))
        dprobs, scale = torch.where(mask, dprobs, 0.0), torch.where(mask, scale, 0.0)
    return out, dg, du, (dprobs if probs is not None else None), scale


# ---------------------------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------------------------
def _rand(*shape, dtype, seed, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    # Away from zero, signs random; scale 2 reaches both tails of the activations.
    t = torch.randn(*shape, generator=g, dtype=torch.float64)
    return (scale * (t + 0.1 * torch.sign(t))).to(dtype)


def _inputs(rows, F, dtype, layout, has_probs, has_mask, seed):
    """gate, up, dout, probs, mask on DEVICE. Dropped rows of every input hold NaN: nothing of them may leak out."""
    mask = (torch.arange(rows) % 2 == 0) if has_mask else None  # drops rows 1, 3, ...
    g = torch.Generator().manual_seed(seed + 3)
    probs = (0.1 + 0.9 * torch.rand(rows, generator=g, dtype=torch.float64)).float() if has_probs else None
    x = _rand(rows, 2 * F, dtype=dtype, seed=seed)
    dout = _rand(rows, F, dtype=dtype, seed=seed + 1)
    if mask is not None:
        drop = ~mask
        x[drop] = float("nan")
        dout[drop] = float("nan")
        if probs is not None:
            probs[drop] = float("nan")
    if layout == "halves":
        x = x.to(DEVICE)
        gate, up = x[:, :F], x[:, F:]  # row stride 2F
    else:
        gate, up = x[:, :F].contiguous().to(DEVICE), x[:, F:].contiguous().to(DEVICE)

    def to_dev(t):
        return t.to(DEVICE) if t is not None else None

    return gate, up, dout.to(DEVICE), to_dev(probs), to_dev(mask)


def _backward(impl, dout, gate, up, probs, mask, activation, layout):
    """(dgate, dup, dprobs) from ``impl``; for halves of one tensor, its single [rows, 2F] gradient, split."""
    fused = layout == "halves"
    dgate, dup, dprobs = impl.glu_bwd(dout, gate, up, probs, mask, activation, fused)
    if fused:
        assert dup is None and dgate.shape == (gate.shape[0], 2 * gate.shape[1]) and dgate.is_contiguous()
        dgate, dup = dgate[:, : gate.shape[1]], dgate[:, gate.shape[1] :]
    else:
        assert dgate.is_contiguous() and dup.is_contiguous()
    return dgate, dup, dprobs


@contextlib.contextmanager
def _poisoned_allocations():
    """torch.empty / empty_like return NaN-filled floating tensors meanwhile: an output element the kernel leaves
    unwritten then shows as NaN instead of whatever memory happened to hold."""
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def poison(t):
        if t.is_floating_point():
            t.fill_(float("nan"))
        return t

    torch.empty = lambda *a, **k: poison(real_empty(*a, **k))
    torch.empty_like = lambda *a, **k: poison(real_empty_like(*a, **k))
    try:
        yield
    finally:
        torch.empty, torch.empty_like = real_empty, real_empty_like


def _assert_close(actual, expected, tol):
    torch.testing.assert_close(actual.double().cpu(), expected.double().cpu(), rtol=tol, atol=tol, equal_nan=False)


def _assert_dropped_rows_zero(t, mask):
    if mask is not None and t.numel():
        dropped = t[~mask]
        assert torch.equal(dropped, torch.zeros_like(dropped)), "dropped rows must be exact zeros"


def _check(impl, activation, dtype, F, rows, layout, has_probs, has_mask, seed=0):
    gate, up, dout, probs, mask = _inputs(rows, F, dtype, layout, has_probs, has_mask, seed)
    out_ref, dg_ref, du_ref, dp_ref, dp_scale = _expected(gate, up, dout, probs, mask, activation)
    tol = TOL[dtype]

    with _poisoned_allocations():
        out = impl.glu_fwd(gate, up, probs, mask, activation)
    assert out.shape == (rows, F) and out.dtype == dtype and out.is_contiguous() and out.device.type == DEVICE.type
    _assert_close(out, out_ref, tol)
    _assert_dropped_rows_zero(out, mask)

    with _poisoned_allocations():
        dgate, dup, dprobs = _backward(impl, dout, gate, up, probs, mask, activation, layout)
    for grad in (dgate, dup):  # every element written
        assert not grad.isnan().any(), "gradient left partly unwritten"
    assert dgate.dtype == dup.dtype == dtype
    _assert_close(dgate, dg_ref, tol)
    _assert_close(dup, du_ref, tol)
    _assert_dropped_rows_zero(dgate, mask)
    _assert_dropped_rows_zero(dup, mask)
    if not has_probs:
        assert dprobs is None
        return
    assert dprobs.shape == (rows,) and dprobs.dtype == torch.float32
    _assert_dropped_rows_zero(dprobs, mask)
    # fp32 sum of the row's terms (computed from the same rounded inputs): rounding error scales with sum |terms|.
    err = (dprobs.double().cpu() - dp_ref.cpu()).abs()
    bound = 1e-4 * dp_ref.abs().cpu() + 1e-5 * dp_scale.cpu() + 1e-6
    assert bool((err <= bound).all()), f"dprobs off by {err.max().item()} (bound {bound.min().item()})"


# ---------------------------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------------------------
# Widths: one column; short rows packed 16 per tile; 3000, rows cut into 1024-column chunks two rows per tile, so
# that 5 rows end in a partial row block and every row in a partial chunk.
WIDTHS = [1, 127, 3000]


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rows", [0, 1, 5])
@pytest.mark.parametrize("F", WIDTHS)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("impl_name", list(IMPLS))
def test_glu_fwd_bwd(impl_name, activation, F, rows, layout, form):
    # The dtype rotates over sizes and forms, so that each meets every activation, form and layout.
    dtype = DTYPES[(WIDTHS.index(F) + [0, 1, 5].index(rows) + list(FORMS).index(form)) % len(DTYPES)]
    _check(IMPLS[impl_name], activation, dtype, F, rows, layout, *FORMS[form])


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_oracle_matches_autograd(activation):
    # The float64 formulas above against torch's own activations and autograd.
    x = _rand(257, dtype=torch.float64, seed=11, scale=3.0).requires_grad_()
    torch_act = {"silu": F_.silu, "gelu": F_.gelu, "gelu_tanh": lambda t: F_.gelu(t, approximate="tanh")}
    y = torch_act[activation](x)
    (dy,) = torch.autograd.grad(y.sum(), x)
    a, da = _act64(x.detach(), activation)
    torch.testing.assert_close(a, y.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(da, dy, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("impl_name", list(IMPLS))
def test_extreme_gate_values(impl_name, activation):
    # Far tails: exp overflows to inf in the sigmoid (the interpreter's numpy warns); results stay finite and exact.
    vals = torch.tensor([-1e4, -100.0, -30.0, -8.0, 8.0, 30.0, 100.0, 1e4], dtype=torch.float64)
    gate = vals.repeat(3, 1).float().to(DEVICE)
    up = _rand(3, vals.numel(), dtype=torch.float32, seed=5).to(DEVICE)
    dout = _rand(3, vals.numel(), dtype=torch.float32, seed=6).to(DEVICE)
    probs = torch.tensor([0.5, 0.25, 1.0], device=DEVICE)
    impl = IMPLS[impl_name]
    out_ref, dg_ref, du_ref, dp_ref, _ = _expected(gate, up, dout, probs, None, activation)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out = impl.glu_fwd(gate, up, probs, None, activation)
        dgate, dup, dprobs = impl.glu_bwd(dout, gate, up, probs, None, activation, False)
    for actual, expected in ((out, out_ref), (dgate, dg_ref), (dup, du_ref), (dprobs, dp_ref)):
        assert torch.isfinite(actual).all()
        _assert_close(actual, expected, 1e-4)


@pytest.fixture
def tiny_tiles(monkeypatch):
    """Shrink the tiles so that rows span several chunks (the backward's loop over a row with probs) and short rows
    pack several per tile, on small shapes."""
    monkeypatch.setattr(triton_glu, "TILE_ELEMENTS", 64)
    monkeypatch.setattr(triton_glu, "MAX_BLOCK_F", 32)
    monkeypatch.setattr(triton_glu, "MIN_BLOCK_F", 16)


# F = 40: three 16-column chunks (the last partial) in tiles of 4 rows; F = 7: tiles of 8 rows. 9 rows end in a
# partial row block.
@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("dtype,F", [(torch.float32, 40), (torch.bfloat16, 7)], ids=str)
def test_triton_multi_chunk_and_multi_row_tiles(tiny_tiles, dtype, F, form):
    tiling = triton_glu.glu_tiling(F)
    assert (tiling.block_f < F) if F > 32 else (tiling.block_rows > 1)
    _check(triton_glu, "gelu_tanh", dtype, F, 9, "halves", *FORMS[form], seed=9)


def test_triton_dprobs_is_bitwise_deterministic(tiny_tiles):
    # Each row's dprobs sums over 3 chunks, in row blocks of 4 (the last partial).
    gate, up, dout, probs, mask = _inputs(9, 40, torch.bfloat16, "halves", True, True, seed=21)
    results = []
    for _ in range(2):
        results.append(triton_glu.glu_bwd(dout, gate, up, probs, mask, "silu", True))
    (dx, no_dup, dprobs), again = results
    assert no_dup is None and torch.equal(dx, again[0]) and torch.equal(dprobs, again[2])


def test_tiling_heuristics():
    # Common FFN widths: whole 2048-column chunks where they divide F, halved where the tail would idle lanes.
    assert triton_glu.glu_tiling(14336) == triton_glu.GluTiling(1, 2048, 8)
    assert triton_glu.glu_tiling(4096).block_f == 2048
    assert triton_glu.glu_tiling(11008) == triton_glu.GluTiling(2, 1024, 8)
    assert triton_glu.block_f_for(4097) == triton_glu.MIN_BLOCK_F
    # Short rows: padded to a power of two, several per tile.
    assert triton_glu.glu_tiling(127) == triton_glu.GluTiling(16, 128, 8)
    assert triton_glu.glu_tiling(1).block_rows == triton_glu.TILE_ELEMENTS
    for F in (1, 127, 4097, 11008, 14336, 100000):
        tiling = triton_glu.glu_tiling(F)
        assert tiling.block_rows * tiling.block_f <= triton_glu.TILE_ELEMENTS
        assert 1 <= tiling.num_warps <= triton_glu.MAX_NUM_WARPS


@pytest.mark.parametrize("impl_name", list(IMPLS))
def test_unknown_activation_is_rejected(impl_name):
    gate = torch.ones(2, 3, device=DEVICE)
    with pytest.raises(ValueError, match="activation"):
        IMPLS[impl_name].glu_fwd(gate, gate, None, None, "relu")


def test_registered_with_the_dispatcher():
    for kernel in ("glu_fwd", "glu_bwd"):
        impls = registry.implementations(kernel)
        assert impls["triton"].fn is getattr(triton_glu, kernel)
        assert impls["reference"].fn is getattr(reference_glu, kernel)
        assert impls["triton"].priority == 20 and impls["reference"].priority == 0
        assert impls["reference"].unavailable_reason(torch.device("cpu")) is None
