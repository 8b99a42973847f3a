"""Gated linear units (SwiGLU, GeGLU) in Triton. Semantics: ``..reference.glu``.
One elementwise tile per program. With probs, the backward walks each row block in one program, for dprobs.
See docs/kernels.md, GLU.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import triton
import triton.language as tl

from ..registry import FP8_IN_ITS_PASS, implementation
from . import launch, on_device, traceable, unavailable_reason
from .access_analysis import writes
from .fp8_quant import NO_FP8_OUTPUT, format_constexprs, fp8_quantize, store_fp8_row_blocks

# --------------------------------------------------------------------------------------------------------------
# Launch heuristics: module constants, so that tests can shrink them.
# --------------------------------------------------------------------------------------------------------------
# Elements per program tile: 8 warps at 8 per thread, one 16-byte vector per bf16 input.
# The only setting at Inductor's time on the H200 at F = 14336 (docs/kernels.md, GLU).
TILE_ELEMENTS = 2048
TILE_ELEMENTS_PER_THREAD = 8
MAX_NUM_WARPS = 8
# Column chunk bounds. Rows wider than MAX_BLOCK_F are cut into chunks.
# The chunk halves while the tail would idle over MAX_TAIL_WASTE of the row.
# F = 14336 -> 2048; F = 11008 -> 1024; F = 4097 -> 256.
MAX_BLOCK_F = 2048
MIN_BLOCK_F = 256
MAX_TAIL_WASTE = 1.0 / 16

# Activation ids are constexprs: one compiled variant per activation, no runtime branch.
SILU = 0
GELU = 1
GELU_TANH = 2
ACTIVATION_IDS = {"silu": SILU, "gelu": GELU, "gelu_tanh": GELU_TANH}

# The activations' constants, as constexprs the kernels can read.
_SQRT_1_2 = tl.constexpr(math.sqrt(0.5))
_INV_SQRT_2PI = tl.constexpr(1.0 / math.sqrt(2.0 * math.pi))
_TANH_K = tl.constexpr(math.sqrt(2.0 / math.pi))
_TANH_C = tl.constexpr(0.044715)


@dataclasses.dataclass(frozen=True)
class GluTiling:
    block_rows: int  # rows per tile (> 1 only when a row is narrower than the tile)
    block_f: int  # columns per tile (next_pow2(F) when the row fits, the chunk width otherwise)
    num_warps: int


def block_f_for(F: int) -> int:
    """Column chunk width: the padded row when it fits MAX_BLOCK_F. Else the widest chunk, at least
    MIN_BLOCK_F, whose tail wastes at most MAX_TAIL_WASTE of the row."""
    padded = triton.next_power_of_2(max(F, 1))
    if padded <= MAX_BLOCK_F:
        return padded
    block_f = MAX_BLOCK_F
    while block_f > MIN_BLOCK_F and (triton.cdiv(F, block_f) * block_f - F) > MAX_TAIL_WASTE * F:
        block_f //= 2
    return block_f


def num_warps_for(tile_elements: int) -> int:
    """TILE_ELEMENTS_PER_THREAD elements per thread, 1..MAX_NUM_WARPS warps."""
    return min(MAX_NUM_WARPS, max(1, tile_elements // (32 * TILE_ELEMENTS_PER_THREAD)))


def glu_tiling(F: int) -> GluTiling:
    """Both kernels' tile: a chunk of one row, or several short rows. About TILE_ELEMENTS elements."""
    block_f = block_f_for(F)
    block_rows = max(1, TILE_ELEMENTS // block_f)
    return GluTiling(block_rows, block_f, num_warps_for(block_rows * block_f))


def _activation_id(activation: str) -> int:
    try:
        return ACTIVATION_IDS[activation]
    except KeyError:
        raise ValueError(
            f"turbo_inductor: unknown GLU activation {activation!r}; choose from {tuple(ACTIVATION_IDS)}"
        ) from None


# --------------------------------------------------------------------------------------------------------------
# Activations (fp32 in, fp32 out)
# --------------------------------------------------------------------------------------------------------------
@triton.jit
def _activation(x, ACTIVATION: tl.constexpr):
    """act(x). gelu_tanh uses ``0.5 * (1 + tanh(u)) == sigmoid(2u)``.
    The interpreter runs no tl tanh, and sigmoid avoids cancellation near tanh(u) = -1."""
    if ACTIVATION == 0:  # silu
        y = x * tl.sigmoid(x)
    elif ACTIVATION == 1:  # gelu (exact)
        y = x * (0.5 * (1.0 + tl.math.erf(x * _SQRT_1_2)))
    else:  # gelu_tanh
        u = _TANH_K * (x + _TANH_C * x * x * x)
        y = x * tl.sigmoid(2.0 * u)
    return y


@triton.jit
def _activation_and_grad(x, ACTIVATION: tl.constexpr):
    """(act(x), act'(x)), sharing the sigmoid / erf between the two."""
    if ACTIVATION == 0:  # silu' = s * (1 + x * (1 - s))
        s = tl.sigmoid(x)
        y = x * s
        dy = s * (1.0 + x * (1.0 - s))
    elif ACTIVATION == 1:  # gelu' = Phi(x) + x * phi(x)
        cdf = 0.5 * (1.0 + tl.math.erf(x * _SQRT_1_2))
        y = x * cdf
        dy = cdf + x * (_INV_SQRT_2PI * tl.exp(-0.5 * x * x))
    else:  # gelu_tanh' = s + 2 x s (1 - s) u', with s = sigmoid(2u) (0.5 * (1 - tanh(u)^2) == 2 s (1 - s))
        u = _TANH_K * (x + _TANH_C * x * x * x)
        s = tl.sigmoid(2.0 * u)
        y = x * s
        dy = s + 2.0 * x * s * (1.0 - s) * (_TANH_K * (1.0 + 3.0 * _TANH_C * x * x))
    return y, dy


# --------------------------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------------------------
@triton.jit
def _kept_rows(MASK, rows, n_rows, HAS_MASK: tl.constexpr):
    """The tile's rows that exist and are not dropped: the only rows read.
    Skipping dropped rows saves bandwidth, and their contents (even NaN) reach no output."""
    row_in = rows < n_rows
    if HAS_MASK:
        row_in = row_in & (tl.load(MASK + rows, mask=row_in, other=0) != 0)
    return row_in


@triton.jit
def _glu_tile(
    GATE,
    UP,
    PROBS,
    MASK,
    rows,
    cols,
    n_rows,
    F,
    stride_gate,
    stride_up,
    ACTIVATION: tl.constexpr,
    HAS_PROBS: tl.constexpr,
    HAS_MASK: tl.constexpr,
):
    """act(GATE) * UP * PROBS[row] on a tile (fp32), zero outside it and on dropped rows."""
    col_in = cols < F
    load_rows = _kept_rows(MASK, rows, n_rows, HAS_MASK)
    load_mask = load_rows[:, None] & col_in[None, :]
    # int64 offsets: rows * row_stride overflows int32 beyond 2^31 elements.
    rows64 = rows.to(tl.int64)
    g = tl.load(GATE + rows64[:, None] * stride_gate + cols[None, :], mask=load_mask, other=0.0).to(tl.float32)
    u = tl.load(UP + rows64[:, None] * stride_up + cols[None, :], mask=load_mask, other=0.0).to(tl.float32)
    y = _activation(g, ACTIVATION) * u
    if HAS_PROBS:
        p = tl.load(PROBS + rows, mask=load_rows, other=0.0).to(tl.float32)
        y = y * p[:, None]
    if HAS_MASK:
        # A select, not a multiply by 0: the zeros are exact whatever y is.
        y = tl.where(load_rows[:, None], y, 0.0)
    return y


@writes("OUT", Q=lambda a: a["QUANT_BLOCK"] > 0, Q_SCALE=lambda a: a["QUANT_BLOCK"] > 0)
@triton.jit
def _glu_fwd_kernel(
    GATE,
    UP,
    PROBS,
    MASK,
    OUT,
    Q,
    Q_SCALE,
    n_rows,
    F,
    stride_gate,
    stride_up,
    n_col_blocks,
    n_scale_cols,
    ACTIVATION: tl.constexpr,
    HAS_PROBS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_F: tl.constexpr,
    QUANT_BLOCK: tl.constexpr,
    FORMAT: tl.constexpr,
    FMAX: tl.constexpr,
    POW2: tl.constexpr,
    FIX_NAN: tl.constexpr,
    NAN_BITS: tl.constexpr,
):
    """``OUT = act(GATE) * UP * PROBS[row]``, one tile per program, numbered row-major.
    With QUANT_BLOCK > 0, the rounded OUT is also written in FP8 (see ``store_fp8_row_blocks``)."""
    pid = tl.program_id(0)
    pid_r = pid // n_col_blocks
    pid_c = pid % n_col_blocks
    rows = pid_r * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = pid_c * BLOCK_F + tl.arange(0, BLOCK_F)
    row_in = rows < n_rows
    col_in = cols < F
    y = _glu_tile(
        GATE, UP, PROBS, MASK, rows, cols, n_rows, F, stride_gate, stride_up, ACTIVATION, HAS_PROBS, HAS_MASK
    ).to(OUT.dtype.element_ty)
    # Store every in-bounds element: dropped rows must be written as zeros.
    tl.store(OUT + rows.to(tl.int64)[:, None] * F + cols[None, :], y, mask=row_in[:, None] & col_in[None, :])
    if QUANT_BLOCK > 0:
        store_fp8_row_blocks(
            y.to(tl.float32),
            Q,
            Q_SCALE,
            rows,
            cols,
            row_in,
            col_in,
            F,
            n_scale_cols,
            pid_c * (BLOCK_F // QUANT_BLOCK),
            BLOCK_ROWS,
            BLOCK_F,
            QUANT_BLOCK,
            FORMAT,
            FMAX,
            POW2,
            FIX_NAN,
            NAN_BITS,
        )


@writes("DGATE", DUP=lambda a: not a["DUP_IN_DGATE"], DPROBS=lambda a: a["HAS_PROBS"])
@triton.jit
def _glu_bwd_kernel(
    DOUT,
    GATE,
    UP,
    PROBS,
    MASK,
    DGATE,
    DUP,
    DPROBS,
    n_rows,
    F,
    stride_dout,
    stride_gate,
    stride_up,
    stride_dgate,
    stride_dup,
    n_col_blocks,
    ACTIVATION: tl.constexpr,
    HAS_PROBS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    DUP_IN_DGATE: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_F: tl.constexpr,
):
    """``dgate = dout * up * p * act'(gate)``, ``dup = dout * act(gate) * p``; dprobs sums ``dout * act * up``.
    A program takes chunks pid_c, pid_c + n_col_blocks, ... of its row block: all of them when n_col_blocks == 1.
    DUP_IN_DGATE: dup goes into DGATE at column F, one tensor; see docs/kernels.md, GLU."""
    pid = tl.program_id(0)
    pid_r = pid // n_col_blocks
    pid_c = pid % n_col_blocks
    rows = pid_r * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_in = rows < n_rows
    load_rows = _kept_rows(MASK, rows, n_rows, HAS_MASK)
    if HAS_PROBS:
        p = tl.load(PROBS + rows, mask=load_rows, other=0.0).to(tl.float32)
    rows64 = rows.to(tl.int64)
    cols0 = tl.arange(0, BLOCK_F)
    # Per-element partial sums of dout * act * up, reduced once after the loop.
    acc = tl.zeros([BLOCK_ROWS, BLOCK_F], dtype=tl.float32)
    for start in range(pid_c * BLOCK_F, F, n_col_blocks * BLOCK_F):
        cols = start + cols0
        col_in = cols < F
        store_mask = row_in[:, None] & col_in[None, :]
        # Dropped rows load 0, so their dprobs terms are exact zeros.
        load_mask = load_rows[:, None] & col_in[None, :]
        do = tl.load(DOUT + rows64[:, None] * stride_dout + cols[None, :], mask=load_mask, other=0.0).to(tl.float32)
        g = tl.load(GATE + rows64[:, None] * stride_gate + cols[None, :], mask=load_mask, other=0.0).to(tl.float32)
        u = tl.load(UP + rows64[:, None] * stride_up + cols[None, :], mask=load_mask, other=0.0).to(tl.float32)
        a, da = _activation_and_grad(g, ACTIVATION)
        if HAS_PROBS:
            acc += do * a * u
            do = do * p[:, None]
        dg = do * u * da
        du = do * a
        if HAS_MASK:
            dg = tl.where(load_rows[:, None], dg, 0.0)
            du = tl.where(load_rows[:, None], du, 0.0)
        dgate_offsets = rows64[:, None] * stride_dgate + cols[None, :]
        tl.store(DGATE + dgate_offsets, dg.to(DGATE.dtype.element_ty), mask=store_mask)
        if DUP_IN_DGATE:
            tl.store(DGATE + F + dgate_offsets, du.to(DGATE.dtype.element_ty), mask=store_mask)
        else:
            tl.store(DUP + rows64[:, None] * stride_dup + cols[None, :], du.to(DUP.dtype.element_ty), mask=store_mask)
    if HAS_PROBS:
        dp = tl.sum(acc, axis=1)
        if HAS_MASK:
            dp = tl.where(load_rows, dp, 0.0)
        tl.store(DPROBS + rows, dp, mask=row_in)


# --------------------------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------------------------
def _unit_column_stride(t: torch.Tensor) -> bool:
    # One column needs only the row stride: its column stride never matters.
    return t.size(1) <= 1 or t.stride(1) == 1


def _readable(t: torch.Tensor) -> torch.Tensor:
    """An input the kernels can address as base + row * stride(0) + col."""
    return t if _unit_column_stride(t) else t.contiguous()


def _check_shapes(gate: torch.Tensor, up: torch.Tensor, probs, mask) -> None:
    if gate.dim() != 2 or up.shape != gate.shape or up.dtype != gate.dtype:
        raise ValueError(
            f"turbo_inductor: glu expects 2-D gate/up of one shape and dtype, got "
            f"{tuple(gate.shape)} {gate.dtype} and {tuple(up.shape)} {up.dtype}"
        )
    rows = gate.size(0)
    for name, t in (("probs", probs), ("mask", mask)):
        if t is not None and t.shape != (rows,):
            raise ValueError(f"turbo_inductor: glu {name} must have shape ({rows},), got {tuple(t.shape)}")


def _row_args(probs: torch.Tensor | None, mask: torch.Tensor | None, fallback: torch.Tensor):
    """Kernel arguments for probs and mask. The mask goes in as uint8, which every backend loads alike.
    Absent ones get ``fallback``; the HAS_* constexprs compile their accesses away."""
    probs_arg = probs.contiguous() if probs is not None else fallback
    mask_arg = mask.to(torch.bool).contiguous().view(torch.uint8) if mask is not None else fallback
    return probs_arg, mask_arg


@implementation("glu_fwd", "triton", priority=20, unavailable_reason=unavailable_reason, traceable=traceable)
def glu_fwd(
    gate: torch.Tensor, up: torch.Tensor, probs: torch.Tensor | None, mask: torch.Tensor | None, activation: str
) -> torch.Tensor:
    """``out`` [rows, F] contiguous; see ``..reference.glu.glu_fwd``."""
    return _fwd(gate, up, probs, mask, activation)[0]


def quantizes_in_its_pass(F: int, block_cols: int) -> bool:
    """Whether the forward quantizes its output in blocks of 1 x ``block_cols`` in its own pass.
    True for power-of-two blocks that a tile holds, and for row-wide blocks of one tile."""
    block, block_f = min(block_cols, F), glu_tiling(F).block_f
    return block <= block_f and (block == F or block & (block - 1) == 0)


@implementation(
    "glu_fwd_fp8",
    "triton",
    priority=20,
    unavailable_reason=unavailable_reason,
    traceable=traceable,
    capabilities={FP8_IN_ITS_PASS: lambda width, element_size, block_cols: quantizes_in_its_pass(width, block_cols)},
)
def glu_fwd_fp8(
    gate: torch.Tensor,
    up: torch.Tensor,
    probs: torch.Tensor | None,
    mask: torch.Tensor | None,
    activation: str,
    fp8_dtype: torch.dtype,
    block_cols: int,
    power_of_two: bool = False,
):
    """``(out, q, scale)``; see ``..reference.glu.glu_fwd_fp8``.
    Quantized in the GLU's pass where :func:`quantizes_in_its_pass`, else by the quantization kernel."""
    F = int(gate.shape[1])
    if not quantizes_in_its_pass(F, block_cols):
        out = _fwd(gate, up, probs, mask, activation)[0]
        return out, *fp8_quantize(out, fp8_dtype, 1, block_cols, False, power_of_two=power_of_two)
    return _fwd(gate, up, probs, mask, activation, (fp8_dtype, min(block_cols, F), power_of_two))


def _fwd(
    gate: torch.Tensor,
    up: torch.Tensor,
    probs: torch.Tensor | None,
    mask: torch.Tensor | None,
    activation: str,
    quantize: tuple[torch.dtype, int, bool] | None = None,
):
    """``(out, q, scale)``. q and scale are None unless ``quantize`` = (fp8 dtype, block, power of two)."""
    act_id = _activation_id(activation)
    _check_shapes(gate, up, probs, mask)
    n_rows, F = gate.shape
    F = int(F)  # sets the launch configuration: a compiled graph specializes on it (rows stay symbolic)
    out = torch.empty((n_rows, F), dtype=gate.dtype, device=gate.device)
    q = scale = None
    if quantize is not None:
        fp8_dtype, block, power_of_two = quantize
        q = torch.empty((n_rows, F), dtype=fp8_dtype, device=gate.device)
        scale = torch.empty((n_rows, triton.cdiv(F, block) if F else 0), dtype=torch.float32, device=gate.device)
    if n_rows == 0 or F == 0:
        return out, q, scale
    gate = _readable(gate)
    up = _readable(up)
    probs_arg, mask_arg = _row_args(probs, mask, out)
    tiling = glu_tiling(F)
    n_col_blocks = triton.cdiv(F, tiling.block_f)
    args = dict(
        ACTIVATION=act_id,
        HAS_PROBS=probs is not None,
        HAS_MASK=mask is not None,
        BLOCK_ROWS=tiling.block_rows,
        BLOCK_F=tiling.block_f,
        num_warps=tiling.num_warps,
    )
    if quantize is None:
        # Unwritten FP8 outputs get gate, which the kernel only reads (see fp8_quant.py).
        q_args, quant = (gate, gate, 1), dict(NO_FP8_OUTPUT)
    else:
        q_args = (q.view(torch.uint8), scale, scale.shape[1])
        # Whole blocks per tile: the block, or the padded row when one block spans it.
        quant = dict(
            QUANT_BLOCK=tiling.block_f if block == F else block,
            **format_constexprs(fp8_dtype, gate.device, power_of_two),
        )
    with on_device(gate.device):
        launch(_glu_fwd_kernel)[(triton.cdiv(n_rows, tiling.block_rows) * n_col_blocks,)](
            gate,
            up,
            probs_arg,
            mask_arg,
            out,
            *q_args[:2],
            n_rows,
            F,
            gate.stride(0),
            up.stride(0),
            n_col_blocks,
            q_args[2],
            **args,
            **quant,
        )
    return out, q, scale


@implementation("glu_bwd", "triton", priority=20, unavailable_reason=unavailable_reason, traceable=traceable)
def glu_bwd(
    dout: torch.Tensor,
    gate: torch.Tensor,
    up: torch.Tensor,
    probs: torch.Tensor | None,
    mask: torch.Tensor | None,
    activation: str,
    fused: bool,
):
    """``(dgate, dup, dprobs)``; see ``..reference.glu.glu_bwd``."""
    act_id = _activation_id(activation)
    _check_shapes(gate, up, probs, mask)
    n_rows, F = gate.shape
    F = int(F)  # sets the launch configuration: a compiled graph specializes on it (rows stay symbolic)
    if dout.shape != gate.shape:
        raise ValueError(f"turbo_inductor: glu_bwd dout must have shape {tuple(gate.shape)}, got {tuple(dout.shape)}")
    dgate = torch.empty((n_rows, 2 * F if fused else F), dtype=gate.dtype, device=gate.device)
    dup = None if fused else torch.empty_like(dgate)
    dprobs = torch.empty(n_rows, dtype=torch.float32, device=gate.device) if probs is not None else None
    if n_rows == 0 or F == 0:
        # An empty row sums to zero.
        dprobs = dprobs.zero_() if dprobs is not None else None
    else:
        dout = _readable(dout)
        gate = _readable(gate)
        up = _readable(up)
        # Unused arguments get dout: only read, never an output passed twice.
        probs_arg, mask_arg = _row_args(probs, mask, dout)
        tiling = glu_tiling(F)
        # With probs, one program per row block walks the whole row for dprobs.
        n_col_blocks = 1 if probs is not None else triton.cdiv(F, tiling.block_f)
        grid = (triton.cdiv(n_rows, tiling.block_rows) * n_col_blocks,)
        with on_device(gate.device):
            launch(_glu_bwd_kernel)[grid](
                dout,
                gate,
                up,
                probs_arg,
                mask_arg,
                dgate,
                dout if fused else dup,
                dprobs if dprobs is not None else dout,
                n_rows,
                F,
                dout.stride(0),
                gate.stride(0),
                up.stride(0),
                dgate.stride(0),
                dgate.stride(0) if fused else dup.stride(0),
                n_col_blocks,
                ACTIVATION=act_id,
                HAS_PROBS=probs is not None,
                HAS_MASK=mask is not None,
                DUP_IN_DGATE=fused,
                BLOCK_ROWS=tiling.block_rows,
                BLOCK_F=tiling.block_f,
                num_warps=tiling.num_warps,
            )
    return dgate, dup, dprobs


__all__ = [
    "glu_fwd",
    "glu_fwd_fp8",
    "quantizes_in_its_pass",
    "glu_bwd",
    "glu_tiling",
    "block_f_for",
    "num_warps_for",
    "GluTiling",
    "ACTIVATION_IDS",
]
