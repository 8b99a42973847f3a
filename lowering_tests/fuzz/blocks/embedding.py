"""The token embedding block (embedding)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from lowering_tests.fuzz.blocks.base import MAX_ROWS, Block, Expect, rows_of


class EmbeddingBlock(Block):
    """Token embeddings, one token per row of x from a fixed table (both graphs look up the same ids), scaling x.
    ``scale_grad_by_freq`` is a near miss."""

    kind = "embedding"

    def __init__(self, rng, s, fused: bool = False):
        """``fused``: a lookup the embedding pass rewrites."""
        super().__init__(rng, s)
        vocab = self.choose(rng, "vocab", [5, 16, 37])
        self.spelling = self.choose(rng, "spelling", ["F.embedding", "nn.Embedding"])
        by_frequency = self.choose(rng, "scale_grad_by_freq", [False] + [True] * (not fused))
        padding = self.choose(rng, "padding_idx", [None, 0, -1])
        ids = torch.randint(0, vocab, (MAX_ROWS,), dtype=self.choose(rng, "ids", [torch.int64, torch.int32]))
        self.register_buffer("ids", ids, persistent=False)
        self.table = nn.Embedding(vocab, s.hidden, padding, scale_grad_by_freq=by_frequency, dtype=s.dtype)

    def expect(self):
        return Expect() if self.table.scale_grad_by_freq else Expect().fired(embedding=1).left(embedding=1)

    def forward(self, x):
        ids = self.ids[: rows_of(x)]
        if self.spelling == "nn.Embedding":
            e = self.table(ids)
        else:
            t = self.table
            e = F.embedding(ids, t.weight, t.padding_idx, scale_grad_by_freq=t.scale_grad_by_freq)
        return x * e.reshape(x.shape)
