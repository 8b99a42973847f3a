"""Rewrite passes, in the order they run. A new fusion is a new module here and one line in PASSES."""

from .causal_mask import CausalMaskPass
from .cross_entropy import CrossEntropyPass
from .embedding import EmbeddingPass
from .fp8_concat import FP8ConcatPass
from .fp8_experts import FP8ExpertsPass
from .fp8_linear import FP8LinearPass
from .fp8_scaled_mm import FP8ScaledMMPass
from .fp8_shared_input import FP8SharedInputPass
from .gemm_allreduce import GemmAllReducePass
from .gemm_allreduce_dgrad import GemmAllReduceDgradPass
from .glu import GLUPass
from .glu_fp8 import GLUFP8Pass
from .grouped_mm import GroupedMMPass
from .grouped_mm_host_offs import GroupedMMHostOffsPass
from .grouped_mm_impl import GroupedMMImplPass
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
from .mm_fp32_output import MMFP32OutputPass
from .moe_combine import MoECombinePass
from .moe_permute import MoEPermutePass
from .moe_permute_fp8 import MoEPermuteFP8Pass
from .moe_sentinel_mask import MoESentinelMaskPass
from .rmsnorm import RMSNormPass
from .rmsnorm_autocast import RMSNormAutocastPass
from .rmsnorm_fp8 import RMSNormFP8Pass
from .rmsnorm_residual import RMSNormResidualPass
from .rotary import RotaryPass
from .torchao_float8 import TorchaoFloat8Pass

# check_order runs at import: each pass in its phase's turn, after the passes whose output it reads.
PASSES: list[RewritePass] = check_order(
    [
        # canonicalize: one spelling per operation
        GroupedMMPass(),  # torch._grouped_mm, transformers' fallback: our grouped_mm
        CausalMaskPass(),  # attention under a causal mask built in the graph: SDPA's is_causal
        # claim: linears taken whole. passes/claims.py decides who takes one, whatever the order here.
        GemmAllReducePass(),  # row-parallel linear + sum all-reduce
        GemmAllReduceDgradPass(),  # column-parallel linear whose input gradient is all-reduced
        FP8ScaledMMPass(),  # hand-written FP8 quantization + torch._scaled_mm
        TorchaoFloat8Pass(),  # torchao's float8 linears
        FP8LinearPass(),  # options={"fp8": ...}: every other linear
        FP8ConcatPass(),  # FP8 linears reading one x (q/k/v, gate/up): one GEMM. Before the producers hand them x.
        FP8ExpertsPass(),  # options={"fp8": ...}: the MoE experts' grouped GEMMs
        GroupedMMImplPass(),  # the other grouped GEMMs: the implementation the cost table measured fastest
        # fuse: element-wise building blocks onto our ops
        RMSNormPass(),
        RMSNormResidualPass(),  # on the norms RMSNormPass made
        MoEPermutePass(),  # MoE routing: sort by expert, gathers, offsets
        MoESentinelMaskPass(),  # transformers' masks of sentinel rows, which the permute and GEMMs keep apart
        MoECombinePass(),  # on the permutes MoEPermutePass made: unpermute and top-k sum
        GroupedMMHostOffsPass(),  # GEMMs reading offs on the host: one copy, queued early, read without a sync
        GLUPass(),  # also the experts' GLU on the grouped GEMM's output
        CrossEntropyPass(),  # the loss over the LM head's logits, read in their own dtype
        EmbeddingPass(),  # the token embedding: its weight gradient in one pass
        RotaryPass(),  # rotary position embedding: the cos/sin table read per row, not recomputed per element
        # producers: norms and GLUs write the FP8 input of the linears and grouped GEMMs they feed
        RMSNormFP8Pass(),
        GLUFP8Pass(),
        MoEPermuteFP8Pass(),  # a permute feeding FP8 experts moves x's FP8 rows and scales, not its bf16 rows
        FP8SharedInputPass(),  # FP8 linears reading one x no producer quantized: x and x^T quantized once for all
        RMSNormAutocastPass(),  # norms whose every use autocast casts to bf16 write bf16 (the linears' input)
        # post-grad: on AOTAutograd's graphs
        MMFP32OutputPass(),  # a bf16 mm cast to fp32 (a gradient under autocast): the GEMM writes fp32
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
