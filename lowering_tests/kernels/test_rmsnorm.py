"""RMSNorm kernels called directly (not through torch.ops): the reference and the Triton implementation against
float64 math (turbo_inductor/testing/rmsnorm.py). Without a GPU the Triton kernels run in the interpreter (conftest
sets TRITON_INTERPRET=1)."""

from __future__ import annotations

import pytest
import torch

from turbo_inductor.kernels import registry
from turbo_inductor.kernels.reference import rmsnorm as reference_rmsnorm
from turbo_inductor.kernels.triton import rmsnorm as triton_rmsnorm
from turbo_inductor.testing.implementations import native_on_device
from turbo_inductor.testing.rmsnorm import EPS, check_bwd, check_fwd, rand, weight_of

# The interpreter's range() over runtime bounds reads a 1-element array as a scalar: numpy warns, harmlessly.
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")

DEVICE = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
IMPLS = {"reference": reference_rmsnorm, "triton": triton_rmsnorm, **native_on_device()}
# (has_weight, has_residual) for the forward, (has_weight, has_dresidual) for the backward
FLAGS = [(True, True), (True, False), (False, True), (False, False)]


def _flag_id(flags):
    return f"w{int(flags[0])}r{int(flags[1])}"


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
    check_fwd(IMPLS[impl_name], rows, H, _dtype(H, rows, flags), *flags)


@sweep
def test_rmsnorm_bwd(impl_name, H, rows, flags):
    check_bwd(IMPLS[impl_name], rows, H, _dtype(H, rows, flags), *flags)


@pytest.mark.parametrize("impl_name", list(IMPLS))
def test_weight_dtype_differs_from_input(impl_name):
    # bf16 activations with an fp32 weight (mixed-precision training keeps fp32 master weights).
    check_fwd(IMPLS[impl_name], 5, 127, torch.bfloat16, True, True, weight_dtype=torch.float32)
    check_bwd(IMPLS[impl_name], 5, 127, torch.bfloat16, True, True, weight_dtype=torch.float32)


def test_empty_rows_give_zero_dw():
    for impl in IMPLS.values():
        w = weight_of(127, torch.float32, 0)
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
    s = rand(rows, H, dtype=torch.bfloat16, seed=7)
    dy = rand(rows, H, dtype=torch.bfloat16, seed=8)
    dres = rand(rows, H, dtype=torch.bfloat16, seed=9)
    w = weight_of(H, torch.bfloat16, 10)
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
    check_fwd(triton_rmsnorm, 12, H, dtype, *flags, seed=3)
    check_bwd(triton_rmsnorm, 12, H, dtype, *flags, seed=4)


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
