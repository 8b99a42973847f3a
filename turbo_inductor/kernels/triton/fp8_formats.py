"""FP8 formats in Triton kernels, shared by the quantization and the GEMM.

A format enters a kernel as a number (FORMAT), not a Triton dtype. Inductor prints constexprs as Python literals.
FP8 tensors travel as raw bytes (uint8 views). Every backend and the interpreter handle those alike.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import interpreting

FORMAT_IDS = {torch.float8_e4m3fn: 0, torch.float8_e5m2: 1, torch.float8_e4m3fnuz: 2, torch.float8_e5m2fnuz: 3}
FNUZ = (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)


def format_id(fp8_dtype: torch.dtype, device: torch.device) -> int:
    """The kernels' FORMAT for ``fp8_dtype`` where this build can convert it, else NotImplementedError."""
    if fp8_dtype in FNUZ:
        if device.type == "cpu" or interpreting():
            raise NotImplementedError(
                f"turbo_inductor: Triton's interpreter cannot cast to {fp8_dtype}; use impl='reference' on CPU"
            )
        if torch.version.hip is None:
            raise NotImplementedError(
                f"turbo_inductor: Triton cannot cast to {fp8_dtype} on NVIDIA GPUs (the fnuz formats are AMD "
                f"MI300's); use float8_e4m3fn / float8_e5m2 there"
            )
    return FORMAT_IDS[fp8_dtype]


@triton.jit
def to_fp8_bits(y, FORMAT: tl.constexpr):
    """y cast to the FP8 format numbered FORMAT, as raw bytes."""
    if FORMAT == 0:
        q = y.to(tl.float8e4nv)
    elif FORMAT == 1:
        q = y.to(tl.float8e5)
    elif FORMAT == 2:
        q = y.to(tl.float8e4b8)
    else:
        q = y.to(tl.float8e5b16)
    return q.to(tl.uint8, bitcast=True)


@triton.jit
def fp8_pointer(bytes_pointer, FORMAT: tl.constexpr):
    """A pointer to raw bytes as one to FP8 values of the format numbered FORMAT. A GEMM loads its operands through
    it: a tile bitcast after its load would go from shared memory through registers and back before each MMA."""
    if FORMAT == 0:
        p = bytes_pointer.to(tl.pointer_type(tl.float8e4nv), bitcast=True)
    elif FORMAT == 1:
        p = bytes_pointer.to(tl.pointer_type(tl.float8e5), bitcast=True)
    elif FORMAT == 2:
        p = bytes_pointer.to(tl.pointer_type(tl.float8e4b8), bitcast=True)
    else:
        p = bytes_pointer.to(tl.pointer_type(tl.float8e5b16), bitcast=True)
    return p
