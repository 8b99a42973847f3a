"""The loss block: a head's logits and cross-entropy (cross_entropy)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from lowering_tests.fuzz.blocks.base import MAX_ROWS, Block, Linear, rows_of


class CrossEntropyBlock(Block):
    """A loss over the rows of x: a head's logits (upcast from bf16 first, as transformers' loss does), fixed
    targets hitting ``ignore_index`` (torch's -100 or a class), each reduction; the loss scales a gain back into
    the stream. Label smoothing, and bf16 logits read without the upcast, are near misses."""

    kind = "cross_entropy"

    def __init__(self, rng, s, fused: bool = False):
        """``fused``: a loss the cross_entropy pass rewrites."""
        super().__init__(rng, s)
        self.vocab = vocab = self.choose(rng, "vocab", s.widths)
        self.head = Linear(rng, s, s.hidden, vocab)
        self.choices["head"] = self.head.describe()
        module = self.choose(rng, "spelling", ["F.cross_entropy", "nn.CrossEntropyLoss"]) != "F.cross_entropy"
        ignore_index = self.choose(rng, "ignore_index", [-100, 3])
        self.reduction = self.choose(rng, "reduction", ["mean", "sum", "none"])
        misses = [] if fused else ["label smoothing"] + ["no upcast"] * (s.dtype == torch.bfloat16)
        self.variant = self.choose(rng, "variant", ["fused"] * 2 + misses)
        self.arguments = dict(
            ignore_index=ignore_index,
            reduction=self.reduction,
            label_smoothing=0.1 if self.variant == "label smoothing" else 0.0,
        )
        self.loss = nn.CrossEntropyLoss(**self.arguments) if module else None
        target = torch.randint(0, vocab, (MAX_ROWS,))
        target[1::3] = ignore_index
        target[0] = vocab - 1  # a class (>= 15) never ignored: a mean over one row has that row to count
        self.register_buffer("target", target, persistent=False)
        self.gain = nn.Parameter(torch.randn(s.hidden).to(s.dtype) * 0.1)

    def expect(self):
        expect = self.head.expect()
        return expect.fired(cross_entropy=1).left(cross_entropy=1) if self.variant == "fused" else expect

    def forward(self, x):
        logits = self.head(x)
        rows = (logits if self.variant == "no upcast" else logits.float()).view(-1, self.vocab)
        target = self.target[: rows_of(x)]
        loss = self.loss(rows, target) if self.loss is not None else F.cross_entropy(rows, target, **self.arguments)
        if self.reduction == "none":
            loss = loss.reshape(*x.shape[:-1], 1)
        return loss.to(x.dtype) * self.gain
