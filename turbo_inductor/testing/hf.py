"""transformers' own causal LMs at published model sizes, or tiny, with random weights.

Each class brings its family's spelling: Qwen2's q/k/v biases, Phi-3's fused qkv and gate_up projections, Gemma's
``(1 + w)`` norm, tanh GeGLU and tied LM head. The published sizes are those of each model's ``config.json``."""

from __future__ import annotations

import dataclasses

import torch.nn as nn


@dataclasses.dataclass(frozen=True)
class HFModel:
    """A published model: its transformers config and model classes, and the config fields of both sizes."""

    config_class: str
    model_class: str
    published: dict
    tiny: dict


# Small shapes for CPU runs; every other field keeps the config class's default.
TINY = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)

# Sliding windows are left out: at most as long as the benchmark's sequences, they change no attention but its mask.
MODELS = {
    "llama3-8b": HFModel(  # meta-llama/Meta-Llama-3-8B
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=128256,
            rms_norm_eps=1e-5,
            rope_theta=500000.0,
        ),
        TINY,
    ),
    "qwen2.5-7b": HFModel(  # Qwen/Qwen2.5-7B
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(
            hidden_size=3584,
            intermediate_size=18944,
            num_attention_heads=28,
            num_key_value_heads=4,
            head_dim=128,
            vocab_size=152064,
            rms_norm_eps=1e-6,
            rope_theta=1000000.0,
        ),
        TINY,
    ),
    "mistral-7b": HFModel(  # mistralai/Mistral-7B-v0.3
        "MistralConfig",
        "MistralForCausalLM",
        dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=32768,
            rms_norm_eps=1e-5,
            rope_theta=1000000.0,
            sliding_window=None,
        ),
        {**TINY, "sliding_window": None},  # as published: the config class's default is a 4096 window
    ),
    "phi3-mini": HFModel(  # microsoft/Phi-3-mini-4k-instruct
        "Phi3Config",
        "Phi3ForCausalLM",
        dict(
            hidden_size=3072,
            intermediate_size=8192,
            num_attention_heads=32,
            num_key_value_heads=32,
            head_dim=96,
            vocab_size=32064,
            rms_norm_eps=1e-5,
            rope_theta=10000.0,
        ),
        {**TINY, "pad_token_id": 0},  # the default pad token is outside the tiny vocabulary
    ),
    "gemma-7b": HFModel(  # google/gemma-7b
        "GemmaConfig",
        "GemmaForCausalLM",
        dict(
            hidden_size=3072,
            intermediate_size=24576,
            num_attention_heads=16,
            num_key_value_heads=16,
            head_dim=256,
            vocab_size=256000,
            rms_norm_eps=1e-6,
            rope_theta=10000.0,
        ),
        {**TINY, "head_dim": 16},
    ),
    "qwen3-8b": HFModel(  # Qwen/Qwen3-8B: RMSNorms on each head's q and k
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(
            hidden_size=4096,
            intermediate_size=12288,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=151936,
            rms_norm_eps=1e-6,
            rope_theta=1000000.0,
        ),
        TINY,
    ),
    # MoE: transformers' experts as 3-D parameters through its grouped_mm implementation (our grouped GEMM).
    "mixtral-8x7b": HFModel(  # mistralai/Mixtral-8x7B-v0.1
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=32000,
            rms_norm_eps=1e-5,
            rope_theta=1000000.0,
            num_local_experts=8,
            num_experts_per_tok=2,
            sliding_window=None,
        ),
        {**TINY, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None},
    ),
    "qwen3-30b-a3b": HFModel(  # Qwen/Qwen3-30B-A3B
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(
            hidden_size=2048,
            intermediate_size=6144,
            moe_intermediate_size=768,
            num_attention_heads=32,
            num_key_value_heads=4,
            head_dim=128,
            vocab_size=151936,
            rms_norm_eps=1e-6,
            rope_theta=1000000.0,
            num_experts=128,
            num_experts_per_tok=8,
            norm_topk_prob=True,
        ),
        {**TINY, "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": True},
    ),
}


# The widths ``shrink`` divides; head_dim is kept, so that the heads' count divides with the hidden size.
WIDTHS = ("hidden_size", "intermediate_size", "moe_intermediate_size", "num_attention_heads", "num_key_value_heads")


def config_fields(name: str, tiny: bool = False, shrink: int = 1) -> dict:
    """The config fields ``build`` sets for model ``name``: the published sizes, or the tiny ones. ``shrink``: the
    published widths and vocabulary divided by it, each tensor's bytes by shrink^2 at as many tokens per width."""
    if name not in MODELS:
        raise ValueError(f"unknown Hugging Face model {name!r}; choose from {sorted(MODELS)}")
    fields = dict(MODELS[name].tiny if tiny else MODELS[name].published)
    if shrink == 1:
        return fields
    uneven = {key: value for key, value in fields.items() if key in WIDTHS and value % shrink}
    if tiny or uneven:
        raise ValueError(f"{name}: shrink {shrink} divides the published widths evenly; these do not: {uneven}")
    shrunk = {key: value // shrink for key, value in fields.items() if key in WIDTHS}
    return {**fields, **shrunk, "vocab_size": -(-fields["vocab_size"] // shrink)}


def build(name: str, layers: int, tiny: bool = False, shrink: int = 1) -> nn.Module:
    """Model ``name`` as its transformers causal LM class, with ``layers`` decoder layers and random weights.

    Attention runs through SDPA. ``tiny``: small shapes for CPU runs; ``shrink``: see :func:`config_fields`."""
    import transformers

    fields = config_fields(name, tiny, shrink)
    model = MODELS[name]
    config = getattr(transformers, model.config_class)(**fields, num_hidden_layers=layers, attn_implementation="sdpa")
    return getattr(transformers, model.model_class)(config)


class CausalLMLoss(nn.Module):
    """A causal LM's training loss on input ids, with the input ids as labels (the model shifts them)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, labels=input_ids).loss


class CausalLMLogits(nn.Module):
    """A causal LM's logits on input ids, at every position: a prefill's forward."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).logits


def matrix_parameters(model: nn.Module) -> int:
    """Weights each token is multiplied by: the 2-D parameters but an input embedding apart from the LM head (a
    lookup)."""
    lookup = model.get_input_embeddings().weight
    shared = lookup is model.get_output_embeddings().weight
    return sum(p.numel() for p in model.parameters() if p.dim() == 2 and (shared or p is not lookup))
