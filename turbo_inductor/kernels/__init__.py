"""Kernel implementations: one module per op family in each implementation folder. Importing registers them."""

from . import registry  # noqa: F401  (turbo_inductor.kernels.registry)
from .aiter import fp8_gemm as _aiter_fp8_gemm  # noqa: F401
from .aiter import fp8_quant as _aiter_fp8_quant  # noqa: F401
from .aiter import rmsnorm as _aiter_rmsnorm  # noqa: F401
from .collective import gemm_allreduce as _collective_gemm_allreduce  # noqa: F401
from .native import fp8_quant as _native_fp8_quant  # noqa: F401
from .native import rmsnorm as _native_rmsnorm  # noqa: F401
from .reference import cross_entropy as _reference_cross_entropy  # noqa: F401
from .reference import embedding as _reference_embedding  # noqa: F401
from .reference import fp8_gemm as _reference_fp8_gemm  # noqa: F401
from .reference import fp8_quant as _reference_fp8_quant  # noqa: F401
from .reference import fp8_quant_grouped as _reference_fp8_quant_grouped  # noqa: F401
from .reference import fp8_transpose as _reference_fp8_transpose  # noqa: F401
from .reference import gemm_allreduce as _reference_gemm_allreduce  # noqa: F401
from .reference import glu as _reference_glu  # noqa: F401
from .reference import grouped_mm as _reference_grouped_mm  # noqa: F401
from .reference import moe as _reference_moe  # noqa: F401
from .reference import rmsnorm as _reference_rmsnorm  # noqa: F401
from .reference import rotary as _reference_rotary  # noqa: F401
from .symm_mem import gemm_allreduce as _symm_mem_gemm_allreduce  # noqa: F401
from .symm_mem import gemm_push as _symm_mem_gemm_push  # noqa: F401
from .triton import cross_entropy as _triton_cross_entropy  # noqa: F401
from .triton import embedding as _triton_embedding  # noqa: F401
from .triton import fp8_gemm as _triton_fp8_gemm  # noqa: F401
from .triton import fp8_quant as _triton_fp8_quant  # noqa: F401
from .triton import fp8_quant_grouped as _triton_fp8_quant_grouped  # noqa: F401
from .triton import fp8_transpose as _triton_fp8_transpose  # noqa: F401
from .triton import glu as _triton_glu  # noqa: F401
from .triton import grouped_mm as _triton_grouped_mm  # noqa: F401
from .triton import moe as _triton_moe  # noqa: F401
from .triton import rmsnorm as _triton_rmsnorm  # noqa: F401
from .triton import rotary as _triton_rotary  # noqa: F401
from .vendor import fp8_gemm as _vendor_fp8_gemm  # noqa: F401
from .vendor import grouped_mm as _vendor_grouped_mm  # noqa: F401
