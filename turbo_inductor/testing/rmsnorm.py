"""RMSNorm kernels called directly (not through torch.ops) against float64 math written out here: the contract of
``rmsnorm_fwd`` and ``rmsnorm_bwd``, for every implementation's tests."""

from __future__ import annotations

import torch

from turbo_inductor.kernels.triton import interpreting
from turbo_inductor.kernels.triton import rmsnorm as triton_rmsnorm
from turbo_inductor.testing import DEVICE as _DEVICE

DEVICE = torch.device(_DEVICE)
EPS = 1e-6
TOL = {torch.float32: 1e-4, torch.bfloat16: 1e-2, torch.float16: 1e-2}


def rand(*shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    # Away from zero so that no row has a tiny norm; signs random.
    t = torch.randn(*shape, generator=g, dtype=torch.float64)
    return (t + 0.1 * torch.sign(t)).to(dtype).to(DEVICE)


def weight_of(H, dtype, seed):
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
def expected_fwd(x, weight, residual, eps):
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


def expected_bwd(dy, s, weight, rstd, dresidual):
    dy = dy.double()
    s = s.double()
    r = rstd.double()[:, None]
    dyw = dy * weight.double() if weight is not None else dy
    dx = r * (dyw - s * r * r * (dyw * s).mean(dim=-1, keepdim=True))
    if dresidual is not None:
        dx = dx + dresidual.double()
    dw = (dy * s * r).sum(dim=0) if weight is not None else None
    return dx, dw


def check_fwd(impl, rows, H, dtype, has_weight, has_residual, weight_dtype=None, seed=0):
    x = rand(rows, H, dtype=dtype, seed=seed)
    residual = rand(rows, H, dtype=dtype, seed=seed + 1) if has_residual else None
    weight = weight_of(H, weight_dtype or dtype, seed + 2) if has_weight else None
    y, s_out, rstd = impl.rmsnorm_fwd(x, weight, residual, EPS)
    y_ref, s_ref, rstd_ref = expected_fwd(x, weight, residual, EPS)

    assert y.shape == (rows, H) and y.dtype == dtype and y.is_contiguous()
    assert rstd.shape == (rows,) and rstd.dtype == torch.float32
    if has_residual:
        assert s_out.shape == (rows, H) and s_out.dtype == dtype and s_out.is_contiguous()
        if _bf16_rounding_is_broken(impl, dtype):
            # Within one bf16 ulp of the correctly rounded sum; then check the norm of the sum it stored.
            torch.testing.assert_close(s_out.double(), s_ref.double(), rtol=2.0**-7, atol=0)
            y_ref, _, rstd_ref = expected_fwd(s_out, weight, None, EPS)
        else:
            # The rounded sum must be exactly what the unfused add produces.
            torch.testing.assert_close(s_out, s_ref, rtol=0, atol=0)
    else:
        assert s_out is None
    _assert_close(y, y_ref, dtype)
    torch.testing.assert_close(rstd.double().cpu(), rstd_ref.cpu(), rtol=1e-4, atol=1e-4)


def check_bwd(impl, rows, H, dtype, has_weight, has_dresidual, weight_dtype=None, seed=0):
    s = rand(rows, H, dtype=dtype, seed=seed)
    dy = rand(rows, H, dtype=dtype, seed=seed + 1)
    dres = rand(rows, H, dtype=dtype, seed=seed + 2) if has_dresidual else None
    weight = weight_of(H, weight_dtype or dtype, seed + 3) if has_weight else None
    s64 = s.double()
    rstd = (1.0 / torch.sqrt((s64 * s64).mean(dim=-1) + EPS)).float()
    dx, dw = impl.rmsnorm_bwd(dy, s, weight, rstd, dres)
    dx_ref, dw_ref = expected_bwd(dy, s, weight, rstd, dres)

    assert dx.shape == (rows, H) and dx.dtype == dtype and dx.is_contiguous()
    _assert_close(dx, dx_ref, dtype)
    if has_weight:
        assert dw.shape == (H,) and dw.dtype == weight.dtype
        _assert_close(dw, dw_ref, weight.dtype if weight.dtype != torch.float32 else dtype)
    else:
        assert dw is None
