"""The Python API: differentiable functions over the ``torch.ops.turbo_inductor`` ops.

``impl`` forces a kernel implementation: "triton", "reference", ..., or "kernel=name,...".
"auto" picks the best one available on the tensors' device (``turbo_inductor.kernels.registry``).
"""

from __future__ import annotations

import importlib
from typing import Optional

import torch
from torch import Tensor

from .embedding import padding_row

# Importing a family's module defines its ops in torch.ops.turbo_inductor; the functions below call them.
for _family in (
    "cross_entropy",
    "embedding",
    "fp8",
    "fp8_grouped_mm",
    "fp8_linear",
    "fp8_shared_input",
    "gemm_allreduce",
    "glu",
    "glu_fp8",
    "grouped_mm",
    "host_copy",
    "moe",
    "rmsnorm",
    "rmsnorm_fp8",
    "rotary",
):
    importlib.import_module(f"{__name__}.{_family}")
del _family


def rmsnorm(
    x: Tensor,
    weight: Optional[Tensor] = None,
    eps: float = 1e-6,
    *,
    impl: str = "auto",
    out_dtype: Optional[torch.dtype] = None,
) -> Tensor:
    """RMSNorm over the last dimension, in fp32, returned in ``x.dtype`` or ``out_dtype`` (rounded once)."""
    return torch.ops.turbo_inductor.rmsnorm(x, weight, eps, impl, out_dtype=out_dtype)


def rmsnorm_residual(
    x: Tensor,
    residual: Tensor,
    weight: Optional[Tensor] = None,
    eps: float = 1e-6,
    *,
    impl: str = "auto",
    out_dtype: Optional[torch.dtype] = None,
) -> tuple[Tensor, Tensor]:
    """``(rmsnorm(x + residual), x + residual)`` in one pass, as a pre-norm transformer block needs; y in
    ``out_dtype`` where given."""
    return torch.ops.turbo_inductor.rmsnorm_residual(x, residual, weight, eps, impl, out_dtype=out_dtype)


def rmsnorm_fp8(
    x: Tensor,
    residual: Optional[Tensor] = None,
    weight: Optional[Tensor] = None,
    eps: float = 1e-6,
    recipe: str = "rowwise",
    *,
    impl: str = "auto",
    **arguments,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(y, x + residual, q, scale)``: RMSNorm of ``x + residual``, or of x with an empty sum.

    q, scale: y quantized as ``recipe`` quantizes an FP8 linear's input, for :func:`fp8_linear`'s ``x_q``,
    ``x_scale``. Recipes whose blocks lie within a row: all but tensorwise. ``arguments``: the op's others by name,
    ``out_dtype`` (y's dtype, autocast)."""
    return torch.ops.turbo_inductor.rmsnorm_fp8(x, residual, weight, eps, recipe, impl, **arguments)


def swiglu(gate: Tensor, up: Tensor, *, impl: str = "auto") -> Tensor:
    """``silu(gate) * up``."""
    return torch.ops.turbo_inductor.glu(gate, up, None, None, "silu", impl)


def geglu(gate: Tensor, up: Tensor, approximate: str = "none", *, impl: str = "auto") -> Tensor:
    """``gelu(gate, approximate=approximate) * up``."""
    return torch.ops.turbo_inductor.glu(gate, up, None, None, _gelu(approximate), impl)


def glu_fused(
    x: Tensor,
    probs: Optional[Tensor] = None,
    mask: Optional[Tensor] = None,
    activation: str = "silu",
    *,
    impl: str = "auto",
) -> Tensor:
    """``act(x[..., :F]) * x[..., F:]`` for a fused gate/up projection ``x`` [..., 2F].

    Times ``probs[..., None]``; rows where ``mask`` is False are zero. activation: "silu", "gelu" or "gelu_tanh"."""
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
    """``(out, q, scale)``: ``act(x) * up``, or :func:`glu_fused` of x without ``up``.

    q, scale: out quantized as ``recipe`` quantizes an FP8 linear's input, for :func:`fp8_linear`'s ``x_q``,
    ``x_scale``."""
    return torch.ops.turbo_inductor.glu_fp8(x, up, probs, mask, activation, recipe, impl)


def _gelu(approximate: str) -> str:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"turbo_inductor.geglu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return "gelu" if approximate == "none" else "gelu_tanh"


def cross_entropy(
    logits: Tensor, target: Tensor, ignore_index: int = -100, reduction: str = "mean", *, impl: str = "auto"
) -> Tensor:
    """``F.cross_entropy(logits.float(), target, ignore_index=ignore_index, reduction=reduction)`` for logits
    [N, V] and class indices [N], in fp32 without an fp32 copy of the logits. The gradient is in logits' dtype."""
    return torch.ops.turbo_inductor.cross_entropy(logits, target, ignore_index, reduction, impl)


def embedding(weight: Tensor, indices: Tensor, padding_idx: Optional[int] = None, *, impl: str = "auto") -> Tensor:
    """``F.embedding(indices, weight, padding_idx)``; the weight gradient is summed in fp32 and written in one pass."""
    padding = padding_row(padding_idx, weight.shape[0])
    return torch.ops.turbo_inductor.embedding(weight, indices, padding, impl)


def rotary(x: Tensor, cos: Tensor, sin: Tensor, *, impl: str = "auto") -> Tensor:
    """``x * cos + rotate_half(x) * sin`` (Hugging Face's ``apply_rotary_pos_emb`` of one tensor) for a 4-D x (e.g.
    [B, H, S, D]) and cos, sin of one shape broadcasting to it (e.g. [B or 1, 1, S, D]), in fp32, returned in x's
    dtype and layout."""
    return torch.ops.turbo_inductor.rotary(x, cos, sin, False, impl)


def fp8_linear(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    recipe: str = "tensorwise",
    *,
    impl: str = "auto",
    **arguments,
) -> Tensor:
    """``F.linear`` with x and weight quantized to FP8 by ``recipe`` (``turbo_inductor.recipes.RECIPES``).

    ``arguments``: the op's others by name. ``x_q``, ``x_scale``: x already quantized for the forward, as
    :func:`rmsnorm_fp8` gives them; ``x_t``, ``x_t_scale``: x^T for the wgrad too, as :func:`fp8_shared_input` gives
    them. ``save_weight_t=False``: the backward quantizes W^T again (by the forward's scales where they are W^T's:
    tensorwise, blockwise); less memory, one or two more reads of W."""
    return torch.ops.turbo_inductor.fp8_linear(x, weight, bias, recipe, impl, **arguments)


def fp8_shared_input(
    x: Tensor, weights: list[Tensor], recipe: str = "tensorwise", *, impl: str = "auto"
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(q, scale, q_t, scale_t)``: x quantized once for the FP8 linears of ``weights`` that read it.

    x^T (q_t, scale_t) where one of those weights wants a gradient, else empty. Each :func:`fp8_linear` takes them
    as ``x_q``, ``x_scale``, ``x_t``, ``x_t_scale``."""
    return torch.ops.turbo_inductor.fp8_shared_input(x, weights, recipe, impl)


def grouped_mm(
    x: Tensor, weight: Tensor, offs: Tensor, *, impl: str = "auto", host_offs: Optional[Tensor] = None
) -> Tensor:
    """``torch._grouped_mm(x, weight, offs=offs)`` for MoE experts: group g of x [S, K] times weight[g].

    weight [E, K, N], any strides; offs [E] int32, each group's cumulative end row. Rows past offs[-1] give zeros.
    ``host_offs``: :func:`copy_to_host` of offs, made early, for an implementation reading offs on the host (one
    GEMM per group): it then waits for that copy only, forward and backward."""
    return torch.ops.turbo_inductor.grouped_mm(x, weight, offs, impl, host_offs)


def copy_to_host(t: Tensor) -> Tensor:
    """``t``'s values on the host. From a GPU the copy is queued without a sync; pass the result to the ops that take
    it (:func:`grouped_mm`'s ``host_offs``), which wait for the copy alone."""
    return torch.ops.turbo_inductor.copy_to_host(t)


def fp8_grouped_mm(
    x: Tensor, weight: Tensor, offs: Tensor, recipe: str = "rowwise", *, impl: str = "auto", **arguments
) -> Tensor:
    """:func:`grouped_mm` with x and each expert's weight quantized to FP8 by ``recipe``.

    Tensorwise scales W per expert. ``arguments``: the op's others by name. ``x_q``, ``x_scale``: x already
    quantized, as :func:`glu_fp8` gives them. With ``positions`` (:func:`moe_permute_fp8`'s), x [T, K] is the tokens
    and x_q, x_scale their rows in expert order: dx is then per token."""
    return torch.ops.turbo_inductor.fp8_grouped_mm(x, weight, offs, recipe, impl, **arguments)


def moe_permute(
    x: Tensor, indices: Tensor, weights: Optional[Tensor], num_experts: int, *, impl: str = "auto"
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(x_sorted, weights_sorted, offs, order, positions)``: the router's choices ``indices`` [T, k] by expert.

    x's rows and ``weights`` (or None) in that stable order; indices outside [0, num_experts) go last. offs is for
    :func:`grouped_mm`; order gives each row's choice, positions each choice's row."""
    return torch.ops.turbo_inductor.moe_permute(x, indices, weights, num_experts, impl)


def moe_permute_fp8(
    x: Tensor,
    indices: Tensor,
    weights: Optional[Tensor],
    num_experts: int,
    recipe: str = "rowwise",
    *,
    impl: str = "auto",
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(q, scale, weights_sorted, offs, order, positions)``: :func:`moe_permute` for FP8 experts, x's rows moved in
    FP8, each token quantized once as ``recipe`` quantizes a grouped GEMM's x (blocks within a row: all but
    tensorwise).

    q and scale get no gradient: :func:`fp8_grouped_mm` takes x itself with ``x_q=q, x_scale=scale,
    positions=positions``, and x's gradient flows through it."""
    return torch.ops.turbo_inductor.moe_permute_fp8(x, indices, weights, num_experts, recipe, impl)


def moe_combine(y: Tensor, weights: Optional[Tensor], positions: Tensor, *, impl: str = "auto") -> Tensor:
    """``out[t] = sum_j weights[t, j] * y[positions[t, j]]``, in fp32, returned in y's dtype.

    The experts' rows [T * k, H] back in token order, summed over each token's k choices; unweighted where
    ``weights`` is None."""
    return torch.ops.turbo_inductor.moe_combine(y, weights, positions, impl)


def gemm_allreduce(
    x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, group=None, *, impl: str = "auto"
) -> Tensor:
    """A row-parallel linear: ``F.linear(x, weight, bias)`` summed over the ranks of ``group``.

    ``group``: a ProcessGroup or its name; default the world.
    Some implementations overlap the reduction with the GEMM."""
    return torch.ops.turbo_inductor.gemm_allreduce(x, weight, bias, _group_name(group), impl)


def linear_dgrad_allreduce(
    x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, group=None, *, impl: str = "auto"
) -> Tensor:
    """A column-parallel linear: ``F.linear(x, weight, bias)``, its input gradient summed over ``group``'s ranks.

    The backward runs that GEMM and all-reduce as one op."""
    return torch.ops.turbo_inductor.linear_dgrad_allreduce(x, weight, bias, _group_name(group), impl)


def _group_name(group) -> str:
    """The group's name, as the ops take it. "" where torch.distributed has no group; the op then raises."""
    if isinstance(group, str):
        return group
    import torch.distributed as dist

    group = dist.group.WORLD if group is None else group
    return "" if group is None else group.group_name
