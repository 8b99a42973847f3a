"""The rotary embedding block (rotary)."""

from __future__ import annotations

import torch

from lowering_tests.fuzz.blocks.base import Block, Expect, norm_weight


class RotaryBlock(Block):
    """A rotary position embedding as transformers applies it: the rows of x as positions of heads-first heads,
    ``x * cos + rotate_half(x) * sin`` with the model's cos/sin table, either order of each product and the sum."""

    kind = "rotary"

    def __init__(self, rng, s):
        super().__init__(rng, s)
        self.heads = self.choose(rng, "heads", [h for h in (1, 2, 4) if s.hidden % (2 * h) == 0])
        self.swapped = self.choose(rng, "order", [False, True])
        self.heads_first = self.choose(rng, "layout", ["heads first", "positions first"]) == "heads first"
        self.scale = norm_weight(s.hidden, s.dtype)  # a parameter before it: the gradient reaches one
        dim = s.hidden // self.heads
        self.register_buffer("inv_freq", 1.0 / 10000.0 ** (torch.arange(0, dim, 2).float() / dim), persistent=False)

    def expect(self):
        return Expect().fired(rotary=1).left(rotary=1)

    def forward(self, x):
        # [1, positions, heads, D], heads first as attention takes it or as is (transformers' unsqueeze_dim=2)
        q = (x * self.scale).reshape(1, -1, self.heads, x.shape[-1] // self.heads)
        q = q.transpose(1, 2) if self.heads_first else q
        freqs = torch.arange(x.numel() // x.shape[-1], device=x.device).float()[:, None] * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)[None]
        at = 1 if self.heads_first else 2
        cos, sin = emb.cos().to(x.dtype).unsqueeze(at), emb.sin().to(x.dtype).unsqueeze(at)
        half = q.shape[-1] // 2
        rotated = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
        out = sin * rotated + cos * q if self.swapped else (q * cos) + (rotated * sin)
        return (out.transpose(1, 2) if self.heads_first else out).reshape(x.shape)
