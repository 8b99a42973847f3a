"""RMSNorm kernels called directly (not through torch.ops): the reference and the Triton implementation against
float64 math written here. Without a GPU the Triton kernels run in the interpreter (conftest sets
TRITON_INTERPRET=1)."""

from __future__ import annotations

import pytest
import torch
from conftest import native_on_device

from turbo_inductor.kernels import registry
from turbo_inductor.kernels.reference import rmsnorm as reference_rmsnorm
from turbo_inductor.kernels.triton import interpreting
from turbo_inductor.kernels.triton import rmsnorm as triton_rmsnorm

# The interpreter's range() over runtime bounds reads a 1-element array as a scalar: numpy warns, harmlessly.
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")

DEVICE = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
EPS = 1e-6
TOL = {torch.float32: 1e-4, torch.bfloat16: 1e-2, torch.float16: 1e-2}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
IMPLS = {"reference": reference_rmsnorm, "triton": triton_rmsnorm, **native_on_device()}
# (has_weight, has_residual) for the forward, (has_weight, has_dresidual) for the backward
FLAGS = [(True, True), (True, False), (False, True), (False, False)]


def _flag_id(flags):
    return f"w{int(flags[0])}r{int(flags[1])}"


def _rand(*shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    # Away from zero so that no row has a tiny norm; signs random.
    t = torch.randn(*shape, generator=g, dtype=torch.float64)
    return (t + 0.1 * torch.sign(t)).to(dtype).to(DEVICE)


def _weight(H, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return (0.5 + torch.rand(H, generator=g, dtype=torch.float64)).to(dtype).to(DEVICE)


def _bf16_rounding_is_broken(impl, dtype):
    """Triton's interpreter (3.6) rounds fp32 -> bf16 casts toward zero, not to nearest even: a stored bf16 can
    be one ulp off. Compiled for a GPU the cast rounds correctly, and the rounded sum is compared bit-exactly."""
    return impl is triton_rmsnorm and dtype == torch.bfloat16 and interpreting()


def _assert_close(actual, expected, dtype):
    tol = TOL[dtype]
    torch.testing.assert_close(actual.double().cpu(), expected.double().cpu(), rtol=tol, atol=tol)


# ---------------------------------------------------------------------------------------------------------------
# float64 oracle (the math of the contract, written out here)
# ---------------------------------------------------------------------------------------------------------------
def _expected_fwd(x, weight, residual, eps):
    if residual is not None:
        # The contract: the sum in fp32, rounded to x.dtype; the norm sees the rounded value.
        s_low = (x.float() + residual.float()).to(x.dtype)
    else:
        s_low = None
    s = (s_low if s_low is not None else x).double()
    rstd = 1.0 / torch.sqrt((s * s).mean(dim=-1) + eps)
    y = s * rstd[:, None]
    if weight is not None:
        y = y * weight.double()
    return y, s_low, rstd


def _expected_bwd(dy, s, weight, rstd, dresidual):
    dy = dy.double()
    s = s.double()
    r = rstd.double()[:, None]
    dyw = dy * weight.double() if weight is not None else dy
    dx = r * (dyw - s * r * r * (dyw * s).mean(dim=-1, keepdim=True))
    if dresidual is not None:
        dx = dx + dresidual.double()
    dw = (dy * s * r).sum(dim=0) if weight is not None else None
    return dx, dw


def _check_fwd(impl, rows, H, dtype, has_weight, has_residual, weight_dtype=None, seed=0):
    x = _rand(rows, H, dtype=dtype, seed=seed)
    residual = _rand(rows, H, dtype=dtype, seed=seed + 1) if has_residual else None
    weight = _weight(H, weight_dtype or dtype, seed + 2) if has_weight else None
    y, s_out, rstd = impl.rmsnorm_fwd(x, weight, residual, EPS)
    y_ref, s_ref, rstd_ref = _expected_fwd(x, weight, residual, EPS)

    assert y.shape == (rows, H) and y.dtype == dtype and y.is_contiguous()
    assert rstd.shape == (rows,) and rstd.dtype == torch.float32
    if has_residual:
        assert s_out.shape == (rows, H) and s_out.dtype == dtype and s_out.is_contiguous()
        if _bf16_rounding_is_broken(impl, dtype):
            # Within one bf16 ulp of the correctly rounded sum; then check the norm of the sum it stored.
            torch.testing.assert_close(s_out.double(), s_ref.double(), rtol=2.0**-7, atol=0)
            y_ref, _, rstd_ref = _expected_fwd(s_out, weight, None, EPS)
        else:
            # The rounded sum must be exactly what the unfused add produces.
            torch.testing.assert_close(s_out, s_ref, rtol=0, atol=0)
    else:
        assert s_out is None
    _assert_close(y, y_ref, dtype)
    torch.testing.assert_close(rstd.double().cpu(), rstd_ref.cpu(), rtol=1e-4, atol=1e-4)


def _check_bwd(impl, rows, H, dtype, has_weight, has_dresidual, weight_dtype=None, seed=0):
    s = _rand(rows, H, dtype=dtype, seed=seed)
    dy = _rand(rows, H, dtype=dtype, seed=seed + 1)
    dres = _rand(rows, H, dtype=dtype, seed=seed + 2) if has_dresidual else None
    weight = _weight(H, weight_dtype or dtype, seed + 3) if has_weight else None
    s64 = s.double()
    rstd = (1.0 / torch.sqrt((s64 * s64).mean(dim=-1) + EPS)).float()
    dx, dw = impl.rmsnorm_bwd(dy, s, weight, rstd, dres)
    dx_ref, dw_ref = _expected_bwd(dy, s, weight, rstd, dres)

    assert dx.shape == (rows, H) and dx.dtype == dtype and dx.is_contiguous()
    _assert_close(dx, dx_ref, dtype)
    if has_weight:
        assert dw.shape == (H,) and dw.dtype == weight.dtype
        _assert_close(dw, dw_ref, weight.dtype if weight.dtype != torch.float32 else dtype)
    else:
        assert dw is None


# ---------------------------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------------------------
# 17 rows: a partial row block after a whole one at H = 256 (16 rows a tile), several row blocks per backward
# program at H = 4097 (a row a tile, 4 programs in the interpreter).
ROWS, WIDTHS = [0, 1, 3, 17], [1, 127, 256, 4097]


def sweep(test):
    """Every implementation x H x rows x (weight, residual) combination; the dtype rotates over them, so that each
    dtype meets every width, row count and flag."""
    for mark in (
        pytest.mark.parametrize("flags", FLAGS, ids=_flag_id),
        pytest.mark.parametrize("rows", ROWS),
        pytest.mark.parametrize("H", WIDTHS),
        pytest.mark.parametrize("impl_name", list(IMPLS)),
    ):
        test = mark(test)
    return test


def _dtype(H, rows, flags):
    return DTYPES[(WIDTHS.index(H) + ROWS.index(rows) + FLAGS.index(flags)) % len(DTYPES)]


@sweep
def test_rmsnorm_fwd(impl_name, H, rows, flags):
    _check_fwd(IMPLS[impl_name], rows, H, _dtype(H, rows, flags), *flags)


@sweep
def test_rmsnorm_bwd(impl_name, H, rows, flags):
    _check_bwd(IMPLS[impl_name], rows, H, _dtype(H, rows, flags), *flags)


@pytest.mark.parametrize("impl_name", list(IMPLS))
def test_weight_dtype_differs_from_input(impl_name):
    # bf16 activations with an fp32 weight (mixed-precision training keeps fp32 master weights).
    _check_fwd(IMPLS[impl_name], 5, 127, torch.bfloat16, True, True, weight_dtype=torch.float32)
    _check_bwd(IMPLS[impl_name], 5, 127, torch.bfloat16, True, True, weight_dtype=torch.float32)


def test_empty_rows_give_zero_dw():
    for impl in IMPLS.values():
        w = _weight(127, torch.float32, 0)
        dx, dw = impl.rmsnorm_bwd(
            torch.empty(0, 127, dtype=torch.float16, device=DEVICE),
            torch.empty(0, 127, dtype=torch.float16, device=DEVICE),
            w,
            torch.empty(0, device=DEVICE),
            None,
        )
        assert dx.shape == (0, 127)
        assert dw.dtype == torch.float32 and torch.equal(dw, torch.zeros_like(dw))


@pytest.mark.parametrize("H", [256, 4097])
def test_triton_bwd_is_bitwise_deterministic(H):
    rows = 17  # more rows than programs: each program accumulates several rows into its dw partial
    s = _rand(rows, H, dtype=torch.bfloat16, seed=7)
    dy = _rand(rows, H, dtype=torch.bfloat16, seed=8)
    dres = _rand(rows, H, dtype=torch.bfloat16, seed=9)
    w = _weight(H, torch.bfloat16, 10)
    rstd = torch.rsqrt(s.float().square().mean(-1) + EPS)
    dx1, dw1 = triton_rmsnorm.rmsnorm_bwd(dy, s, w, rstd, dres)
    dx2, dw2 = triton_rmsnorm.rmsnorm_bwd(dy, s, w, rstd, dres)
    assert torch.equal(dx1, dx2) and torch.equal(dw1, dw2)


@pytest.fixture
def tiny_fused_limit(monkeypatch):
    """Shrink the register-tile limit so that the wide-row (chunked) kernels run on small rows."""
    monkeypatch.setattr(triton_rmsnorm, "FWD_MAX_FUSED_BYTES", 256)
    monkeypatch.setattr(triton_rmsnorm, "BWD_MAX_FUSED_BYTES", 256)
    monkeypatch.setattr(triton_rmsnorm, "CHUNK_BYTES", 128)


# Chunks of 32 (fp32) or 64 elements: 3 to 5 per row, the last partial. 12 rows give the chunked backward 2 to 4
# programs per chunk, each taking several rows (the interpreter runs every row's program in turn).
@pytest.mark.parametrize("flags", FLAGS, ids=_flag_id)
@pytest.mark.parametrize("dtype,H", [(torch.float32, 127), (torch.bfloat16, 150), (torch.float16, 300)], ids=str)
def test_triton_chunked_path(tiny_fused_limit, dtype, H, flags):
    element_size = torch.empty((), dtype=dtype).element_size()
    for tiling in (triton_rmsnorm.fwd_tiling(H, element_size), triton_rmsnorm.bwd_tiling(H, element_size)):
        assert tiling.chunked and tiling.block_h < H
    _check_fwd(triton_rmsnorm, 12, H, dtype, *flags, seed=3)
    _check_bwd(triton_rmsnorm, 12, H, dtype, *flags, seed=4)


def test_tiling_heuristics():
    # Llama-style hidden sizes stay in one register tile; small rows are packed several per program.
    for tiling in (triton_rmsnorm.fwd_tiling, triton_rmsnorm.bwd_tiling):
        bf16 = tiling(4096, 2)
        assert (bf16.chunked, bf16.block_rows, bf16.block_h) == (False, 1, 4096)
        small = tiling(127, 4)
        assert not small.chunked and small.block_h == 128 and small.block_rows > 1
    assert triton_rmsnorm.fwd_tiling(32768, 2).chunked is False
    assert triton_rmsnorm.fwd_tiling(32769, 2).chunked is True
    assert triton_rmsnorm.bwd_tiling(16384, 2).chunked is False
    assert triton_rmsnorm.bwd_tiling(16385, 2).chunked is True
    assert triton_rmsnorm.bwd_grid_size(1, 2, DEVICE) == 1
    # Backward schedule (shared memory unbounded on CPU): two pipelined programs per SM at bf16 H=4096, one at
    # fp32 (twice the staged bytes), no pipelining for tiles too wide to stage.
    cpu = torch.device("cpu")
    schedule = triton_rmsnorm.bwd_schedule
    assert schedule(triton_rmsnorm.bwd_tiling(4096, 2), 2, 2, cpu) == triton_rmsnorm.BwdSchedule(3, 2)
    assert schedule(triton_rmsnorm.bwd_tiling(4096, 4), 4, 2, cpu) == triton_rmsnorm.BwdSchedule(3, 1)
    assert schedule(triton_rmsnorm.bwd_tiling(16384, 2), 2, 2, cpu).loop_stages == 1


def test_registered_with_the_dispatcher():
    for kernel in ("rmsnorm_fwd", "rmsnorm_bwd"):
        impls = registry.implementations(kernel)
        assert impls["triton"].fn is getattr(triton_rmsnorm, kernel)
        assert impls["reference"].fn is getattr(reference_rmsnorm, kernel)
        assert impls["triton"].priority > impls["reference"].priority
        assert impls["reference"].unavailable_reason(torch.device("cpu")) is None
