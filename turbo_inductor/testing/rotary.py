"""The rotary position embedding as transformers' Llama applies it: its table, ``rotate_half``, and an attention
that rotates q and k."""

import torch
import torch.nn as nn

from turbo_inductor.testing import DEVICE


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def tables(batch, positions, dim, dtype, base=10000.0, device=DEVICE):
    """cos and sin [batch, positions, dim] as transformers' rotary embedding computes them."""
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, device=device).float() / dim)
    steps = torch.arange(positions, device=device).float() + torch.arange(batch, device=device)[:, None]
    freqs = steps[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


class Attention(nn.Module):
    """q and k projected, split in heads and rotated as transformers' Llama attention does; the rotation's output
    goes on through one more product (attention would read it)."""

    def __init__(self, dtype=torch.bfloat16, hidden=48, heads=4, swapped=False, table_dtype=None):
        super().__init__()
        self.heads, self.dim = heads, hidden // heads
        self.q = nn.Linear(hidden, hidden, bias=False, dtype=dtype)
        self.k = nn.Linear(hidden, hidden, bias=False, dtype=dtype)
        self.swapped, self.table_dtype = swapped, table_dtype or dtype

    def rotate(self, x, cos, sin):
        if self.swapped:  # the other order of every product and of the sum
            return sin * rotate_half(x) + cos * x
        return (x * cos) + (rotate_half(x) * sin)

    def forward(self, hidden):
        batch, positions, _ = hidden.shape
        cos, sin = tables(batch, positions, self.dim, self.table_dtype, device=hidden.device)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = self.q(hidden).view(batch, positions, self.heads, self.dim).transpose(1, 2)
        k = self.k(hidden).view(batch, positions, self.heads, self.dim).transpose(1, 2)
        return self.attend(self.rotate(q, cos, sin), self.rotate(k, cos, sin))

    def attend(self, q, k):
        return q @ k.transpose(-1, -2)
