"""The Python API: differentiable functions over the ``torch.ops.turbo_inductor`` ops.

``impl`` forces a kernel implementation ("triton", "reference", ... or "kernel=name,..."); "auto" picks the best
available on the tensors' device (see ``turbo_inductor.kernels.registry``).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import fp8 as _fp8  # noqa: F401  (defines the ops)
from . import fp8_linear as _fp8_linear  # noqa: F401
from . import gemm_allreduce as _gemm_allreduce  # noqa: F401
from . import glu as _glu  # noqa: F401
from . import glu_fp8 as _glu_fp8  # noqa: F401
from . import grouped_mm as _grouped_mm  # noqa: F401
from . import moe as _moe  # noqa: F401
from . import rmsnorm as _rmsnorm  # noqa: F401
from . import rmsnorm_fp8 as _rmsnorm_fp8  # noqa: F401


def rmsnorm(x: Tensor, weight: Optional[Tensor] = None, eps: float = 1e-6, *, impl: str = "auto") -> Tensor:
    """RMSNorm over the last dimension, in fp32, returned in ``x.dtype``."""
    return torch.ops.turbo_inductor.rmsnorm(x, weight, eps, impl)


def rmsnorm_residual(
    x: Tensor, residual: Tensor, weight: Optional[Tensor] = None, eps: float = 1e-6, *, impl: str = "auto"
) -> tuple[Tensor, Tensor]:
    """``(rmsnorm(x + residual), x + residual)`` in one pass, as a pre-norm transformer block needs."""
    return torch.ops.turbo_inductor.rmsnorm_residual(x, residual, weight, eps, impl)


def rmsnorm_fp8(
    x: Tensor,
    residual: Optional[Tensor] = None,
    weight: Optional[Tensor] = None,
    eps: float = 1e-6,
    recipe: str = "rowwise",
    *,
    impl: str = "auto",
    out_dtype: Optional[torch.dtype] = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(y, x + residual, q, scale)``: RMSNorm (of ``x + residual`` where given; the sum is empty otherwise) with y
    also quantized as ``recipe`` quantizes an FP8 linear's input, to pass to :func:`fp8_linear` as ``x_q``,
    ``x_scale``. For recipes that quantize x in blocks within a row (rowwise, blockwise, mxfp8). ``out_dtype``: y
    as the norm's output cast to it (an fp32 norm feeding bf16 linears under autocast)."""
    return torch.ops.turbo_inductor.rmsnorm_fp8(x, residual, weight, eps, recipe, impl, out_dtype)


def swiglu(gate: Tensor, up: Tensor, *, impl: str = "auto") -> Tensor:
    """``silu(gate) * up``."""
    return torch.ops.turbo_inductor.glu(gate, up, None, None, "silu", impl)


def geglu(gate: Tensor, up: Tensor, approximate: str = "none", *, impl: str = "auto") -> Tensor:
    """``gelu(gate, approximate=approximate) * up``."""
    return torch.ops.turbo_inductor.glu(gate, up, None, None, _gelu(approximate), impl)


def glu_fused(
    x: Tensor,
    activation: str = "silu",
    probs: Optional[Tensor] = None,
    mask: Optional[Tensor] = None,
    *,
    impl: str = "auto",
) -> Tensor:
    """``act(x[..., :F]) * x[..., F:]`` (times ``probs[..., None]``, rows where ``mask`` is False zeroed), for a
    fused gate/up projection ``x`` of last dimension 2F. activation: "silu", "gelu" or "gelu_tanh"."""
    return torch.ops.turbo_inductor.glu_fused(x, probs, mask, activation, impl)


def glu_fp8(
    x: Tensor,
    up: Optional[Tensor] = None,
    probs: Optional[Tensor] = None,
    mask: Optional[Tensor] = None,
    activation: str = "silu",
    recipe: str = "rowwise",
    *,
    impl: str = "auto",
) -> tuple[Tensor, Tensor, Tensor]:
    """``(out, q, scale)``: ``act(x) * up`` (or, without ``up``, :func:`glu_fused` of x) with out also quantized as
    ``recipe`` quantizes an FP8 linear's input, to pass to :func:`fp8_linear` as ``x_q``, ``x_scale``."""
    return torch.ops.turbo_inductor.glu_fp8(x, up, probs, mask, activation, recipe, impl)


def _gelu(approximate: str) -> str:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"turbo_inductor.geglu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return "gelu" if approximate == "none" else "gelu_tanh"


def fp8_linear(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    recipe: str = "tensorwise",
    *,
    impl: str = "auto",
    x_q: Optional[Tensor] = None,
    x_scale: Optional[Tensor] = None,
    save_weight_t: bool = True,
) -> Tensor:
    """``F.linear`` with x and weight quantized to FP8 by ``recipe`` ("tensorwise", "rowwise", "rowwise_pow2",
    "blockwise", "mxfp8", "rowwise_with_gw_hp"), forward and backward (see ``turbo_inductor/ops/fp8_linear.py``).
    ``x_q``, ``x_scale``: x already quantized for the forward (:func:`rmsnorm_fp8`'s q and scale).
    ``save_weight_t=False``: the backward quantizes W^T again instead of keeping it from the forward (less memory
    between the two, one more read of W)."""
    return torch.ops.turbo_inductor.fp8_linear(x, weight, bias, recipe, impl, x_q, x_scale, save_weight_t)


def grouped_mm(x: Tensor, weight: Tensor, offs: Tensor, *, impl: str = "auto") -> Tensor:
    """``torch._grouped_mm(x, weight, offs=offs)`` for MoE experts: the rows of x [S, K] in group g (offs [E] int32:
    each group's cumulative end row) times weight[g] ([E, K, N], any strides); rows past offs[-1] give zeros."""
    return torch.ops.turbo_inductor.grouped_mm(x, weight, offs, impl)


def fp8_grouped_mm(
    x: Tensor,
    weight: Tensor,
    offs: Tensor,
    recipe: str = "rowwise",
    *,
    impl: str = "auto",
    x_q: Optional[Tensor] = None,
    x_scale: Optional[Tensor] = None,
) -> Tensor:
    """:func:`grouped_mm` with x and each expert's weight quantized to FP8 by ``recipe`` ("rowwise", "rowwise_pow2",
    "blockwise", "mxfp8", "tensorwise" per expert, "rowwise_with_gw_hp"), forward and backward (see
    ``turbo_inductor/ops/grouped_mm.py``). ``x_q``, ``x_scale``: x already quantized for the forward (:func:`glu_fp8`'s
    q and scale)."""
    return torch.ops.turbo_inductor.fp8_grouped_mm(x, weight, offs, recipe, impl, x_q, x_scale)


def moe_permute(
    x: Tensor, indices: Tensor, num_experts: int, weights: Optional[Tensor] = None, *, impl: str = "auto"
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(x_sorted, weights_sorted, offs, order, positions)``: the router's choices ``indices`` [T, k] ordered by
    expert (stably; indices outside [0, num_experts) last), x's rows and the router ``weights`` in that order, offs
    for :func:`grouped_mm`, each row's choice and each choice's row (see ``turbo_inductor/ops/moe.py``)."""
    return torch.ops.turbo_inductor.moe_permute(x, indices, weights, num_experts, impl)


def moe_combine(y: Tensor, positions: Tensor, weights: Optional[Tensor] = None, *, impl: str = "auto") -> Tensor:
    """``out[t] = sum_j weights[t, j] * y[positions[t, j]]`` in fp32, returned in y's dtype: the experts' rows
    [T * k, H] back in token order, summed over each token's k choices."""
    return torch.ops.turbo_inductor.moe_combine(y, weights, positions, impl)


def gemm_allreduce(
    x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, group=None, *, impl: str = "auto"
) -> Tensor:
    """A row-parallel linear: ``F.linear(x, weight, bias)`` summed over the ranks of ``group`` (a ProcessGroup or
    its name; default: the world), the reduction overlapped with the GEMM where an implementation does."""
    return torch.ops.turbo_inductor.gemm_allreduce(x, weight, bias, _group_name(group), impl)


def linear_dgrad_allreduce(
    x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, group=None, *, impl: str = "auto"
) -> Tensor:
    """A column-parallel linear: ``F.linear(x, weight, bias)`` whose input gradient is summed over the ranks of
    ``group`` (the backward's GEMM and all-reduce as one GEMM + all-reduce)."""
    return torch.ops.turbo_inductor.linear_dgrad_allreduce(x, weight, bias, _group_name(group), impl)


def _group_name(group) -> str:
    """The name the ops take; "" where there is no group (the op then says torch.distributed is not initialized)."""
    if isinstance(group, str):
        return group
    import torch.distributed as dist

    group = dist.group.WORLD if group is None else group
    return "" if group is None else group.group_name
