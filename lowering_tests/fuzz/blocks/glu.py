"""The GLU block: ``act(gate) * up`` then a down projection (glu, glu_fp8)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from lowering_tests.fuzz.blocks.base import DIRECT, Block, Expect, Linear, column_major, concatenations

ACTIVATIONS = {
    "F.silu": lambda g: F.silu(g),
    "nn.SiLU": nn.SiLU(),
    "F.gelu": lambda g: F.gelu(g),
    "nn.GELU": nn.GELU(),
    "gelu tanh": lambda g: F.gelu(g, approximate="tanh"),
}
HALVES = ("chunk", "torch.chunk", "split", "split sections", "slices")


class GLUBlock(Block):
    """``act(gate) * up`` then a down projection: gate and up separate or the halves of one projection, optionally
    weighted per row (MoE router weights)."""

    kind = "glu"

    def __init__(self, rng, s, down: str | None = None):
        super().__init__(rng, s)
        self.width = width = self.choose(rng, "width", s.widths)
        self.activation = self.choose(rng, "activation", sorted(ACTIVATIONS))
        self.act_first = self.choose(rng, "order", [True, False])
        self.halves = self.choose(rng, "gate/up", ["separate", *HALVES])
        self.weighted = self.choose(rng, "row weights", [False, False, True])
        self.strided = self.choose(rng, "rows", ["contiguous", "strided"]) == "strided"
        if self.halves == "separate":
            self.gate, self.up = Linear(rng, s, s.hidden, width), Linear(rng, s, s.hidden, width)
            self.choices["gate/up"] = [self.gate.describe(), self.up.describe()]
        else:
            self.gate_up = Linear(rng, s, s.hidden, 2 * width)
            self.choices["gate/up"] += f" of {self.gate_up.describe()}"
        self.down = Linear(rng, s, width, s.hidden, down if down != "direct" else rng.choice(DIRECT))
        self.choices["down"] = self.down.describe()
        self.setting = s

    def expect(self):
        projections = [self.gate, self.up] if self.halves == "separate" else [self.gate_up]
        expect = Expect().fired(glu=1)
        for linear in [*projections, self.down]:
            expect.add(linear.expect())
        concatenated = concatenations(self.setting, projections)
        expect.add(concatenated)
        if self.setting.fp8_producers and self.down.direct:
            return expect.fired(glu_fp8=1).left(glu_fp8=1)
        # gate and up concatenated are the halves of one output; relaid out, no longer halves of one tensor
        halves = self.halves != "separate" or concatenated.counts["fp8_concat"]
        return expect.left(**{"glu_fused" if halves and not self.strided else "glu": 1})

    def split(self, x):
        h, width = self.gate_up(x), self.width
        if self.halves == "chunk":
            return h.chunk(2, dim=-1)
        if self.halves == "torch.chunk":
            return torch.chunk(h, 2, -1)
        if self.halves == "split":
            return h.split(width, dim=-1)
        if self.halves == "split sections":
            return torch.split(h, [width, width], dim=-1)
        return h[..., :width], h[..., width:]

    def forward(self, x):
        gate, up = (self.gate(x), self.up(x)) if self.halves == "separate" else self.split(x)
        if self.strided:
            gate, up = column_major(gate), column_major(up)
        act = ACTIVATIONS[self.activation](gate)
        h = act * up if self.act_first else up * act
        if self.weighted:
            probs = torch.sigmoid(x.float().sum(-1))  # one fp32 weight per row, as a router gives
            h = h * probs[..., None].to(h.dtype)
        return self.down(h)
