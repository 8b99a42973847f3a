"""Rewrite passes, in the order they run. A new fusion is a new module here and one line in PASSES."""

from .fp8_linear import FP8LinearPass
from .fp8_scaled_mm import FP8ScaledMMPass
from .gemm_allreduce import GemmAllReducePass
from .gemm_allreduce_dgrad import GemmAllReduceDgradPass
from .glu import GLUPass
from .glu_fp8 import GLUFP8Pass
from .manager import (
    CompileRecord,
    PassManager,
    PassOrderError,
    Phase,
    RewritePass,
    check_order,
    compile_records,
    phase_table,
    reset_records,
    rewrite_counts,
)
from .rmsnorm import RMSNormPass
from .rmsnorm_fp8 import RMSNormFP8Pass
from .rmsnorm_residual import RMSNormResidualPass
from .torchao_float8 import TorchaoFloat8Pass

# Checked at import: each pass in its phase's turn and after the passes it names (its input is their output).
PASSES: list[RewritePass] = check_order(
    [
        # claim: linears taken whole. Who takes one is decided by passes/claims.py, whatever the order here.
        GemmAllReducePass(),  # row-parallel linear + sum all-reduce
        GemmAllReduceDgradPass(),  # column-parallel linear whose input gradient is all-reduced
        FP8ScaledMMPass(),  # hand-written FP8 quantization + torch._scaled_mm
        TorchaoFloat8Pass(),  # torchao's float8 linears
        FP8LinearPass(),  # options={"fp8": ...}: every other linear
        # fuse: element-wise building blocks onto our ops
        RMSNormPass(),
        RMSNormResidualPass(),  # on the norms RMSNormPass made
        GLUPass(),
        # producers: norms and GLUs write their FP8 linears' input in FP8
        RMSNormFP8Pass(),
        GLUFP8Pass(),
    ]
)

__all__ = [
    "PASSES",
    "CompileRecord",
    "PassManager",
    "PassOrderError",
    "Phase",
    "RewritePass",
    "check_order",
    "compile_records",
    "phase_table",
    "reset_records",
    "rewrite_counts",
]
