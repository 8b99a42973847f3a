"""Attention masks as a model builds them in forward: SDPA's causal mask in the spellings models use, and near
misses, each another mask or one not known at compile time. Each is ``MASKS[name](q_len, kv_len, batch, dtype,
device)``."""

import math

import torch


def causal_by_index(q_len, kv_len, batch, device):
    """transformers' spelling (``sdpa_mask`` when it cannot skip the mask): ``kv_idx <= q_idx``, expanded."""
    q_idx = (torch.arange(q_len, device=device) + 0)[None, None, :, None]
    kv_idx = (torch.arange(kv_len, device=device) + 0)[None, None, None, :]
    return (kv_idx <= q_idx).expand(batch, -1, q_len, kv_len)


def additive(q_len, kv_len, dtype, device, masked):
    return torch.full((q_len, kv_len), masked, dtype=dtype, device=device).triu(1)


def lower_triangle(q_len, kv_len, device, diagonal=0):
    return torch.ones(q_len, kv_len, dtype=torch.bool, device=device).tril(diagonal)


def sliding_window(q_len, kv_len, batch, device, window=3):
    q_idx, kv_idx = torch.arange(q_len, device=device)[:, None], torch.arange(kv_len, device=device)[None, :]
    return causal_by_index(q_len, kv_len, batch, device) & (kv_idx > q_idx - window)


MASKS = {
    "bool, by index": lambda q_len, kv_len, batch, dtype, device: causal_by_index(q_len, kv_len, batch, device),
    "bool, tril": lambda q_len, kv_len, batch, dtype, device: lower_triangle(q_len, kv_len, device),
    "additive, -inf": lambda q_len, kv_len, batch, dtype, device: additive(q_len, kv_len, dtype, device, -math.inf),
    "additive, lowest": lambda q_len, kv_len, batch, dtype, device: additive(
        q_len, kv_len, dtype, device, torch.finfo(dtype).min
    ),
    "sliding window": lambda q_len, kv_len, batch, dtype, device: sliding_window(q_len, kv_len, batch, device),
    "one step ahead": lambda q_len, kv_len, batch, dtype, device: lower_triangle(q_len, kv_len, device, 1),
    "random": lambda q_len, kv_len, batch, dtype, device: torch.rand(q_len, kv_len, device=device) < 2,
    "additive, large finite": lambda q_len, kv_len, batch, dtype, device: additive(q_len, kv_len, dtype, device, -1e4),
}
CAUSAL = ["bool, by index", "bool, tril", "additive, -inf", "additive, lowest"]
