"""Rewrite passes, in the order they run. A new fusion is a new module here and one line in PASSES."""

from .fp8_linear import FP8LinearPass
from .fp8_scaled_mm import FP8ScaledMMPass
from .gemm_allreduce import GemmAllReducePass
from .gemm_allreduce_dgrad import GemmAllReduceDgradPass
from .glu import GLUPass
from .glu_fp8 import GLUFP8Pass
from .manager import CompileRecord, PassManager, RewritePass, compile_records, reset_records, rewrite_counts
from .rmsnorm import RMSNormPass
from .rmsnorm_fp8 import RMSNormFP8Pass
from .rmsnorm_residual import RMSNormResidualPass
from .torchao_float8 import TorchaoFloat8Pass

PASSES: list[RewritePass] = [
    RMSNormPass(),
    RMSNormResidualPass(),
    GLUPass(),
    GemmAllReducePass(),
    GemmAllReduceDgradPass(),
    FP8ScaledMMPass(),
    TorchaoFloat8Pass(),
    FP8LinearPass(),
    RMSNormFP8Pass(),
    GLUFP8Pass(),
]

__all__ = [
    "PASSES",
    "CompileRecord",
    "PassManager",
    "RewritePass",
    "compile_records",
    "reset_records",
    "rewrite_counts",
]
