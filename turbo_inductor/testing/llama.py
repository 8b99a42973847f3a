"""A Llama-style decoder written as Hugging Face writes it, so the backend sees what real models give it.

RMSNorm with the fp32 upcast, GQA attention through SDPA, pre-norm residuals. The SwiGLU MLP's fused gate/up
projection is split by ``chunk``. Shapes come from the models' public configs."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    layers: int = 1
    eps: float = 1e-5


CONFIGS = {
    "llama3-8b": LlamaConfig(hidden=4096, intermediate=14336, heads=32, kv_heads=8),
    "llama2-7b": LlamaConfig(hidden=4096, intermediate=11008, heads=32, kv_heads=32, eps=1e-6),
    "qwen2.5-7b": LlamaConfig(hidden=3584, intermediate=18944, heads=28, kv_heads=4, eps=1e-6),
    "tiny": LlamaConfig(hidden=256, intermediate=512, heads=4, kv_heads=2, layers=2),
    "tiny-mha": LlamaConfig(hidden=192, intermediate=384, heads=4, kv_heads=4, layers=2, eps=1e-6),  # Llama-2's form
}


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(hidden)), eps

    def forward(self, x):
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class DecoderLayer(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.heads, c.kv_heads, c.hidden // c.heads
        self.input_norm, self.post_attention_norm = RMSNorm(c.hidden, c.eps), RMSNorm(c.hidden, c.eps)
        self.qkv = nn.Linear(c.hidden, (c.heads + 2 * c.kv_heads) * self.head_dim, bias=False)
        self.o_proj = nn.Linear(c.hidden, c.hidden, bias=False)
        self.gate_up = nn.Linear(c.hidden, 2 * c.intermediate, bias=False)
        self.down_proj = nn.Linear(c.intermediate, c.hidden, bias=False)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.input_norm(x)).split(
            [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], -1
        )
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
        x = x + self.o_proj(attn.transpose(1, 2).reshape(b, s, h))
        gate, up = self.gate_up(self.post_attention_norm(x)).chunk(2, -1)
        return x + self.down_proj(F.silu(gate) * up)


class LlamaDecoder(nn.Module):
    """``layers`` decoder layers and the final norm, on hidden states [batch, seq, hidden]."""

    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.hidden, c.eps)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)
