"""FP8 formats for aiter: the e4m3 its kernels use, and exact conversions into it.
aiter uses e4m3fnuz on gfx94x (MI300) and e4m3fn elsewhere. See docs/kernels.md, FP8 formats.
"""

from __future__ import annotations

import functools

import torch

E4M3 = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
# e4m3fn's NaNs are 0x7F and 0xFF. Its negative zero, 0x80, is e4m3fnuz's only NaN.
_NAN_MAGNITUDE, _FNUZ_NAN = 0x7F, 0x80


def gcn_arch(device: torch.device) -> str:
    """The GPU's architecture name as ROCm gives it (``gfx942:sramecc+:xnack-``)."""
    return torch.cuda.get_device_properties(device).gcnArchName


@functools.cache
def _e4m3_of_arch(arch: str) -> torch.dtype:
    return torch.float8_e4m3fnuz if arch.startswith("gfx94") else torch.float8_e4m3fn


def aiter_e4m3(device: torch.device) -> torch.dtype:
    """The e4m3 format aiter's kernels read and write on ``device`` (a ROCm GPU)."""
    return _e4m3_of_arch(gcn_arch(device))


def fn_to_fnuz(q: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3fn ``q`` as e4m3fnuz bits with the scale doubled. Every value stays exact; -0 becomes +0."""
    bits = q.view(torch.uint8)
    nan = (bits & _NAN_MAGNITUDE) == _NAN_MAGNITUDE
    bits = bits.masked_fill(bits == _FNUZ_NAN, 0).masked_fill_(nan, _FNUZ_NAN)
    return bits.view(torch.float8_e4m3fnuz), scale * 2


def fnuz_to_fn(q: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3fnuz ``q`` as e4m3fn values, the scale unchanged. Only odd multiples of 2^-10 below 2^-6 round."""
    return q.float().to(torch.float8_e4m3fn), scale


def to_format(q: torch.Tensor, scale: torch.Tensor, fp8_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scale)`` in ``fp8_dtype``, dequantizing to the same values. Both must be e4m3 formats."""
    if q.dtype == fp8_dtype:
        return q, scale
    if (q.dtype, fp8_dtype) == (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        return fn_to_fnuz(q, scale)
    if (q.dtype, fp8_dtype) == (torch.float8_e4m3fnuz, torch.float8_e4m3fn):
        return fnuz_to_fn(q, scale)
    raise ValueError(f"turbo_inductor: no exact conversion of {q.dtype} into {fp8_dtype}")
