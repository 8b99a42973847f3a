"""MoE layers as users' code writes them, for the tests and the benchmarks.

transformers' own sparse MoE blocks and decoders: experts as 3-D parameters, run by ``grouped_mm``.
A torchtitan-style MoE: router, token reorder, ``torch._grouped_mm`` experts, a shared expert."""

from __future__ import annotations

import dataclasses
import functools

import torch
import torch.nn as nn
import torch.nn.functional as F


class SwiGLU(nn.Module):
    """torchtitan's FeedForward: ``w2(silu(w1(x)) * w3(x))``, the shared expert."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1, self.w3 = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TitanMoE(nn.Module):
    """torchtitan's MoE layer: a top-k router, tokens reordered by expert, SwiGLU experts, a shared expert.

    Scores are softmax or sigmoid in fp32, applied before or after the experts. The reorder: ``histc`` counts,
    a stable ``argsort``, ``torch.gather``. The experts run ``torch._grouped_mm`` in ``expert_dtype``.
    The router runs in its weight's dtype; in fp32 it routes as the model's fp32 copy does."""

    def __init__(
        self,
        dim: int,
        hidden: int,
        experts: int,
        top_k: int,
        score_func: str = "softmax",
        score_before_experts: bool = False,
        shared_expert: bool = True,
        expert_dtype: torch.dtype = torch.bfloat16,
    ):
        super().__init__()
        self.experts, self.top_k, self.score_func = experts, top_k, score_func
        self.score_before_experts, self.expert_dtype = score_before_experts, expert_dtype
        self.router = nn.Linear(dim, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, hidden, dim) / dim**0.5)
        self.w2 = nn.Parameter(torch.randn(experts, dim, hidden) / hidden**0.5)
        self.w3 = nn.Parameter(torch.randn(experts, hidden, dim) / dim**0.5)
        self.shared = SwiGLU(dim, hidden) if shared_expert else None

    def forward(self, x):
        bs, slen, dim = x.shape
        x = x.view(-1, dim)
        scores = self.router(x.to(self.router.weight.dtype)).float()
        scores = torch.sigmoid(scores) if self.score_func == "sigmoid" else F.softmax(scores, dim=1)
        top_scores, indices = torch.topk(scores, k=self.top_k, dim=1)
        # histc takes no integers on CPU
        counts = torch.histc(indices.view(-1).float(), bins=self.experts, min=0, max=self.experts)
        order = torch.argsort(indices.view(-1), stable=True)
        scores_sorted = top_scores.view(-1)[order]
        token_index = (order // self.top_k).reshape(-1, 1).expand(-1, dim)
        routed = torch.gather(x, dim=0, index=token_index)
        if self.score_before_experts:
            routed = (routed.to(torch.float32) * scores_sorted.reshape(-1, 1)).to(x.dtype)
        offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
        dtype = self.expert_dtype
        h = F.silu(torch._grouped_mm(routed.to(dtype), self.w1.to(dtype).transpose(-2, -1), offs=offs))
        h = h * torch._grouped_mm(routed.to(dtype), self.w3.to(dtype).transpose(-2, -1), offs=offs)
        routed = torch._grouped_mm(h, self.w2.to(dtype).transpose(-2, -1), offs=offs).type_as(x)
        out = self.shared(x) if self.shared is not None else torch.zeros_like(x)
        if not self.score_before_experts:
            routed = (routed.to(torch.float32) * scores_sorted.reshape(-1, 1)).to(x.dtype)
        return out.scatter_add(dim=0, index=token_index, src=routed).reshape(bs, slen, dim)


def hf_sparse_moe(
    family: str,
    hidden: int = 64,
    intermediate: int = 32,
    experts: int = 4,
    top_k: int = 2,
    expert_parallel_masks: bool = False,
):
    """transformers' own sparse MoE block (``mixtral`` or ``qwen3_moe``) from a tiny config.

    Its experts run ``grouped_mm``; its weights are random. ``expert_parallel_masks``: they mask the rows of sentinel
    choices, as under expert parallelism (5.17 always does)."""
    if family == "mixtral":
        from transformers import MixtralConfig
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock as Block

        config = MixtralConfig(
            hidden_size=hidden, intermediate_size=intermediate, num_local_experts=experts, num_experts_per_tok=top_k
        )
    elif family == "qwen3_moe":
        from transformers import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock as Block

        config = Qwen3MoeConfig(
            hidden_size=hidden,
            moe_intermediate_size=intermediate,
            num_experts=experts,
            num_experts_per_tok=top_k,
            norm_topk_prob=True,
        )
    else:
        raise ValueError(f"unknown MoE family {family!r}; choose from mixtral, qwen3_moe")
    config._experts_implementation = "grouped_mm"
    block = Block(config)
    if expert_parallel_masks:
        block.experts._is_expert_parallel = True
    with torch.no_grad():
        for parameter in block.parameters():  # a bare block is not initialized
            parameter.normal_(0, parameter.shape[-1] ** -0.5)
    return block


@functools.cache
def transformers_masks_sentinel_rows() -> bool:
    """Whether transformers' grouped_mm experts mask the rows of sentinel choices (expert ids >= E) outside expert
    parallelism, the moe_sentinel_mask pass's sites: 5.17 does always, 5.25 only under it. Read from the graph
    Dynamo captures of a tiny block (nothing compiled)."""
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(hf_sparse_moe("mixtral"), backend=capture)(torch.randn(1, 4, 64))
    torch._dynamo.reset()
    return any(n.op == "call_method" and n.target == "masked_fill_" for gm in graphs for n in gm.graph.nodes)


@dataclasses.dataclass(frozen=True)
class MoEConfig:
    """A decoder with MoE layers at a published model's shapes. It uses transformers' own classes."""

    family: str  # "mixtral" or "qwen3_moe"
    hidden: int
    intermediate: int  # each expert's
    experts: int
    top_k: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int = 1
    eps: float = 1e-5

    @property
    def active_expert_parameters(self) -> int:
        """Expert weights each token multiplies by, over all layers: gate, up, down of its top-k experts."""
        return self.layers * self.top_k * 3 * self.hidden * self.intermediate

    def build(self) -> nn.Module:
        """The decoder, with random weights, on hidden states [batch, seq, hidden]. Its 8-token vocabulary is unused."""
        common = dict(
            hidden_size=self.hidden,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            head_dim=self.head_dim,
            num_hidden_layers=self.layers,
            num_experts_per_tok=self.top_k,
            rms_norm_eps=self.eps,
            vocab_size=8,
            attn_implementation="sdpa",
        )
        if self.family == "mixtral":
            from transformers import MixtralConfig, MixtralModel

            model = MixtralModel(
                MixtralConfig(intermediate_size=self.intermediate, num_local_experts=self.experts, **common)
            )
        else:
            from transformers import Qwen3MoeConfig, Qwen3MoeModel

            config = Qwen3MoeConfig(
                moe_intermediate_size=self.intermediate, num_experts=self.experts, norm_topk_prob=True, **common
            )
            model = Qwen3MoeModel(config)
        return HiddenStates(model)


class HiddenStates(nn.Module):
    """A transformers base model run on hidden states (``inputs_embeds``). It returns the last hidden state."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(inputs_embeds=x).last_hidden_state


MOE_CONFIGS = {
    "mixtral-8x7b": MoEConfig("mixtral", 4096, 14336, experts=8, top_k=2, heads=32, kv_heads=8, head_dim=128),
    "qwen3-30b-a3b": MoEConfig(
        "qwen3_moe", 2048, 768, experts=128, top_k=8, heads=32, kv_heads=4, head_dim=128, eps=1e-6
    ),
}
