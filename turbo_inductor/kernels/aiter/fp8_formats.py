"""FP8 formats for aiter: which e4m3 its kernels read and write on a GPU, and exact conversions into it.

aiter's FP8 kernels take one e4m3 format per GPU: e4m3fnuz on gfx94x (MI300), e4m3fn elsewhere (MI350, gfx950), as
aiter decides it (``get_torch_fp8`` in its csrc/include/py_itfs_common.h, ``aiter/utility/dtypes.py``). A scaled
operand ``(q, scale)`` in the other e4m3 format is converted without changing the values it dequantizes to:

* e4m3fn -> e4m3fnuz: the same bits mean half the value in fnuz (exponent bias 8, not 7), so the bits are kept and
  the scale doubled. Every finite e4m3fn value, 448 included, is then exact: nothing saturates (converting by value
  would clamp 256..448 to fnuz's 240). fnuz has no negative zero and one NaN (0x80): -0 becomes +0, NaN stays NaN.
* e4m3fnuz -> e4m3fn: by value, the scale unchanged: fnuz's range lies within e4m3fn's, so nothing saturates. Below
  2^-6 e4m3fn steps by 2^-9, so fnuz's odd multiples of 2^-10 there (16 of its 256 codes, under 1/16000 of a
  block's amax) round to nearest even; NaN stays NaN. Keeping the bits would not do here: fnuz's largest values
  (+-240, where every block's amax lands) would become e4m3fn's NaN.
"""

from __future__ import annotations

import functools

import torch

E4M3 = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
# e4m3fn's NaN encodings are 0x7F and 0xFF; its negative zero is 0x80, which is e4m3fnuz's only NaN.
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
    """e4m3fn ``q`` with ``scale`` as e4m3fnuz with the doubled scale: the same values, exactly."""
    bits = q.view(torch.uint8)
    nan = (bits & _NAN_MAGNITUDE) == _NAN_MAGNITUDE
    bits = bits.masked_fill(bits == _FNUZ_NAN, 0).masked_fill_(nan, _FNUZ_NAN)
    return bits.view(torch.float8_e4m3fnuz), scale * 2


def fnuz_to_fn(q: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3fnuz ``q`` as e4m3fn values, the scale unchanged (rounding only fnuz's odd multiples of 2^-10 below
    2^-6)."""
    return q.float().to(torch.float8_e4m3fn), scale


def to_format(q: torch.Tensor, scale: torch.Tensor, fp8_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scale)`` as an operand in ``fp8_dtype`` dequantizing to the same values (both e4m3 formats)."""
    if q.dtype == fp8_dtype:
        return q, scale
    if (q.dtype, fp8_dtype) == (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        return fn_to_fnuz(q, scale)
    if (q.dtype, fp8_dtype) == (torch.float8_e4m3fnuz, torch.float8_e4m3fn):
        return fnuz_to_fn(q, scale)
    raise ValueError(f"turbo_inductor: no exact conversion of {q.dtype} into {fp8_dtype}")
