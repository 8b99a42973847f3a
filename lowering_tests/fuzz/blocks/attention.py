"""The attention block: a mask built in forward, causal or a near miss (causal_mask)."""

from __future__ import annotations

import torch.nn.functional as F

from lowering_tests.fuzz.blocks.base import Block, Expect, norm_weight
from turbo_inductor.testing.attention_masks import CAUSAL, MASKS


class AttentionBlock(Block):
    """Attention over each row's hidden units as 4 positions, under a mask built in forward (as transformers builds
    it under torch.compile): the causal one in one of its spellings, or a near miss. Its sizes stay static."""

    kind = "attention"
    POSITIONS = 4

    def __init__(self, rng, s, mask: str | None = None):
        super().__init__(rng, s)
        self.mask = self.choose(rng, "mask", [mask] if mask else list(MASKS))
        self.scale = norm_weight(s.hidden, s.dtype)  # a parameter before it: the gradient reaches one

    def expect(self):
        return Expect().fired(causal_mask=1) if self.mask in CAUSAL else Expect()

    def forward(self, x):
        q = (x * self.scale).reshape(-1, 1, self.POSITIONS, x.shape[-1] // self.POSITIONS)
        kv = x.reshape(q.shape)
        mask = MASKS[self.mask](self.POSITIONS, self.POSITIONS, 1, x.dtype, x.device)
        return F.scaled_dot_product_attention(q, kv, kv, attn_mask=mask).reshape(x.shape)
