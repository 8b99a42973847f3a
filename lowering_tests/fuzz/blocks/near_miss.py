"""Near misses of several passes: patterns like fused ones that compute something else."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lowering_tests.fuzz.blocks.base import Block, Expect, norm_weight


class NearMissBlock(Block):
    """A pattern like a fused one that computes something else: nothing may be rewritten."""

    kind = "near_miss"
    VARIANTS = ("sigmoid gate", "activation read twice", "broadcast up", "norm over dim -2", "cube norm")

    def __init__(self, rng, s):
        super().__init__(rng, s)
        self.variant = self.choose(rng, "variant", self.VARIANTS)
        self.a, self.b = norm_weight(s.hidden, s.dtype), norm_weight(s.hidden, s.dtype)

    def expect(self):
        return Expect()

    def forward(self, x):
        v, gate, up = self.variant, x * self.a, x * self.b
        if v == "sigmoid gate":
            return torch.sigmoid(gate) * up
        if v == "activation read twice":
            act = F.silu(gate)
            return act * up + act
        if v == "broadcast up":
            return F.silu(gate) * up.mean(-1, keepdim=True)
        h = x.float()
        if v == "norm over dim -2":
            # Dim -2 may hold one row: then this is h / sqrt(h^2 + eps), whose slope near 0 (up to eps^-1/2) moves
            # with each rounding of h, and both graphs' gradients with it. At eps = 1 the slopes are at most 1.
            return (h * torch.rsqrt(h.pow(2).mean(-2, keepdim=True) + 1.0)).to(x.dtype) * self.a
        return (h * torch.rsqrt(h.abs().pow(3).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * self.a
