"""FP8 quantization with dynamic (current) scaling in plain PyTorch. It defines the semantics.
Per block: ``scale = max(amax, 1e-12) / fmax`` and ``q = sat(x * (1 / scale))``, rounded to nearest even.
See docs/kernels.md, FP8 quantization, for blocks, layouts and non-finite inputs.
"""

from __future__ import annotations

import functools

import torch

from ..registry import implementation
from . import traced_off_cpu, unavailable_reason

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
AMAX_FLOOR = 1e-12


@functools.cache
def device_formats(device: torch.device) -> tuple[torch.dtype, torch.dtype]:
    """The (e4m3, e5m2) dtypes of ``device``: fnuz on gfx942 (MI300), OCP elsewhere."""
    if device.type == "cuda" and torch.version.hip is not None:
        if "gfx942" in torch.cuda.get_device_properties(device).gcnArchName:
            return torch.float8_e4m3fnuz, torch.float8_e5m2fnuz
    return torch.float8_e4m3fn, torch.float8_e5m2


def check_args(
    x: torch.Tensor,
    fp8_dtype: torch.dtype,
    block_rows: int,
    block_cols: int,
    transpose: bool = False,
    both_layouts: bool = False,
    block_cols_t: int = 0,
    scale: torch.Tensor | None = None,
) -> None:
    """The argument checks every implementation makes; raises ValueError."""
    if transpose and both_layouts:
        raise ValueError("turbo_inductor: fp8_quantize writes both layouts only with transpose=False")
    if int(block_cols_t) < 0 or (block_cols_t and not both_layouts):
        raise ValueError(
            f"turbo_inductor: fp8_quantize block_cols_t must be >= 0 and set only with both_layouts, got {block_cols_t}"
        )
    if x.dim() != 2 or x.dtype not in INPUT_DTYPES:
        raise ValueError(
            f"turbo_inductor: fp8_quantize expects a 2-D fp32/bf16/fp16 tensor, got {tuple(x.shape)} {x.dtype}"
        )
    if fp8_dtype not in FP8_DTYPES:
        raise ValueError(f"turbo_inductor: fp8_quantize fp8_dtype must be one of {FP8_DTYPES}, got {fp8_dtype}")
    if int(block_rows) < 1 or int(block_cols) < 1:
        raise ValueError(f"turbo_inductor: fp8_quantize blocks must be >= 1, got {block_rows} x {block_cols}")
    if scale is not None:
        want = scale_shape(*x.shape, block_rows, block_cols)
        if both_layouts or tuple(scale.shape) != want or scale.dtype != torch.float32 or scale.device != x.device:
            raise ValueError(
                f"turbo_inductor: fp8_quantize's given scale must be float32 {list(want)} on {x.device}, one per "
                f"block of x, and without both_layouts; got {scale.dtype} {list(scale.shape)} on {scale.device}"
            )


def layouts_share_blocks(M: int, K: int, block_rows: int, block_cols: int, block_cols_t: int = 0) -> bool:
    """Whether x's blocks and x^T's blocks (block_rows x (block_cols_t or block_cols) over x^T) cut the same
    elements. Then ``both_layouts``'s ``q_t`` is ``q`` transposed: the whole tensor, or square blocks."""
    return min(block_rows, K) == min(block_cols, K) and min(block_rows, M) == min(block_cols_t or block_cols, M)


def scale_shape(M: int, K: int, block_rows: int, block_cols: int) -> tuple[int, int]:
    return -(-M // block_rows), -(-K // block_cols)


def power_of_two_ceil(r: torch.Tensor) -> torch.Tensor:
    """The smallest power of two >= each element of a positive fp32 tensor. NaN and inf pass through.
    Exact by frexp. An fp32 log2 rounds values just above a power of two down."""
    mantissa, exponent = torch.frexp(r)  # r = mantissa * 2**exponent, mantissa in [0.5, 1)
    exponent = torch.where(mantissa == 0.5, exponent - 1, exponent)
    p2 = torch.ldexp(torch.ones_like(r), exponent)
    return torch.where(torch.isfinite(r), p2, r)


def saturating_cast(y: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """``y`` (fp32) clamped to +-fmax, then rounded to nearest even into ``fp8_dtype``.
    Out-of-range values and inf saturate; NaN stays NaN. A plain ``.to`` would give inf for e5m2."""
    fmax = torch.finfo(fp8_dtype).max
    return y.clamp(-fmax, fmax).to(fp8_dtype)


@implementation(
    "fp8_quantize", "reference", priority=0, unavailable_reason=unavailable_reason, traceable=traced_off_cpu
)
def fp8_quantize(
    x: torch.Tensor,
    fp8_dtype: torch.dtype,
    block_rows: int,
    block_cols: int,
    transpose: bool,
    power_of_two: bool = False,
    both_layouts: bool = False,
    block_cols_t: int = 0,
    scale: torch.Tensor | None = None,
):
    """``(q, scale)``, or ``(q, scale, q_t, scale_t)`` with ``both_layouts``: x^T [K, M] in blocks of block_rows x
    ``block_cols_t`` (0: block_cols), as an MoE weight's per-expert transposed operand takes them.
    ``power_of_two``: E8M0 scales, as MXFP8 uses. ``scale``: x's blocks' scales, given (an earlier call's on the same
    x): no maxima are taken and ``q`` alone is returned.
    See docs/kernels.md, FP8 quantization."""
    check_args(x, fp8_dtype, block_rows, block_cols, transpose, both_layouts, block_cols_t, scale)
    if both_layouts:
        return both_layouts_by_two_calls(fp8_quantize, x, fp8_dtype, block_rows, block_cols, power_of_two, block_cols_t)
    M, K = x.shape
    n_br, n_bc = scale_shape(M, K, block_rows, block_cols)
    given = scale is not None
    if M == 0 or K == 0:
        q = torch.empty((K, M) if transpose else (M, K), dtype=fp8_dtype, device=x.device)
        return q if given else (q, torch.ones((n_br, n_bc), dtype=torch.float32, device=x.device))
    br, bc = min(block_rows, M), min(block_cols, K)  # a block larger than the tensor is the tensor
    x32 = x.float()
    # Zero-pad to whole blocks: |0| never raises an amax. The padding is cut off below.
    padded = torch.nn.functional.pad(x32, (0, n_bc * bc - K, 0, n_br * br - M))
    blocks = padded.view(n_br, br, n_bc, bc)
    if not given:
        amax = blocks.abs().amax(dim=(1, 3))  # NaN propagates
        # A tensor divisor: CUDA turns division by a Python scalar into a reciprocal multiply.
        scale = amax.clamp_min(AMAX_FLOOR) / torch.full_like(amax, torch.finfo(fp8_dtype).max)
        if power_of_two:
            scale = power_of_two_ceil(scale)
    q = saturating_cast(blocks * (torch.ones_like(scale) / scale)[:, None, :, None], fp8_dtype).view(
        n_br * br, n_bc * bc
    )[:M, :K]
    q = (q.t() if transpose else q).contiguous()
    return q if given else (q, scale.contiguous())


def both_layouts_by_two_calls(
    quantize,
    x: torch.Tensor,
    fp8_dtype: torch.dtype,
    block_rows: int,
    block_cols: int,
    power_of_two: bool,
    block_cols_t: int = 0,
):
    """``both_layouts``'s four outputs from two calls of ``quantize``.
    x^T's blocks are block_rows x (block_cols_t or block_cols) over x^T, stored in x^T's layout."""
    q, scale = quantize(x, fp8_dtype, block_rows, block_cols, False, power_of_two=power_of_two)
    q_t, scale_t = quantize(x, fp8_dtype, block_cols_t or block_cols, block_rows, True, power_of_two=power_of_two)
    return q, scale, q_t, transposed_scale(scale_t)


def transposed_scale(scale: torch.Tensor, copy: bool = False) -> torch.Tensor:
    """``scale`` transposed, in row-major strides. ``contiguous()`` would keep a size-1 dimension's stride; the
    native kernels write fresh ones, and every implementation and fake must agree on them. A contiguous vector's
    transpose is a view in those strides, so no copy runs for rowwise scales, unless ``copy`` (``scale`` is returned
    beside it, and a custom op's outputs must not alias)."""
    if 1 in scale.shape and scale.is_contiguous() and not copy:
        return scale.view(scale.shape[1], scale.shape[0])
    return scale.t().clone(memory_format=torch.contiguous_format)


__all__ = [
    "fp8_quantize",
    "saturating_cast",
    "check_args",
    "scale_shape",
    "power_of_two_ceil",
    "device_formats",
    "layouts_share_blocks",
    "both_layouts_by_two_calls",
    "transposed_scale",
    "FP8_DTYPES",
    "AMAX_FLOOR",
]
