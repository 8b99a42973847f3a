"""RMSNorm blocks: a norm in its spellings, a pre-norm residual, a norm read by linears (rmsnorm,
rmsnorm_residual, rmsnorm_fp8, fp8_concat, fp8_shared_input)."""

from __future__ import annotations

import random

import torch
import torch.nn as nn
import torch.nn.functional as F

from lowering_tests.fuzz.blocks.base import (
    DIRECT,
    SPELLINGS,
    Block,
    Expect,
    Linear,
    Setting,
    column_major,
    concatenations,
    norm_weight,
)


class Norm(nn.Module):
    """An RMSNorm over the last dimension, in one of its spellings."""

    FORMS = ("hf", "titan", "sqrt", "no upcast", "F.rms_norm", "nn.RMSNorm", "fp32 weight")

    def __init__(self, block: Block, rng: random.Random, s: Setting, weighting: str | None = None, plain=False):
        """``plain``: contiguous rows, no promoting weight: the norm's op writes its output, from x itself."""
        super().__init__()
        # A promoting fp32 weight is a bf16 model's; bf16 sums of squares without the upcast round beyond its gate.
        fp32 = s.dtype == torch.float32
        forms = [f for f in self.FORMS if not (f == "fp32 weight" and (plain or fp32) or f == "no upcast" and not fp32)]
        self.form = block.choose(rng, "norm", forms)
        self.eps = block.choose(rng, "eps", [1e-6, 1e-5, 1e-3, 1e-2] + ([None] if self.form == "F.rms_norm" else []))
        self.square = block.choose(rng, "square", ["pow", "**", "x*x", "torch.square"])
        self.weighting = block.choose(rng, "weight", [weighting] if weighting else ["after", "before", "none"])
        self.strided = block.choose(rng, "rows", ["contiguous"] + ["strided"] * (not plain)) == "strided"
        dtype = torch.float32 if self.form == "fp32 weight" else s.dtype
        self.weight = norm_weight(s.hidden, dtype) if self.weighting != "none" else None
        if self.form == "nn.RMSNorm":
            self.module = nn.RMSNorm(s.hidden, self.eps, elementwise_affine=self.weight is not None, dtype=s.dtype)
            if self.weight is not None:
                self.module.weight = self.weight
            self.weight = None

    @property
    def fused_whole(self) -> bool:
        """Whether the norm's op writes the output: not so where a promoting weight multiplies it after."""
        return not (self.form == "fp32 weight" and self.weighting != "none")

    def squared(self, h):
        return {"pow": lambda: h.pow(2), "**": lambda: h**2, "x*x": lambda: h * h, "torch.square": lambda: h.square()}[
            self.square
        ]()

    def forward(self, x):
        if self.strided:
            x = column_major(x)
        if self.form == "nn.RMSNorm":
            return self.module(x)
        if self.form == "F.rms_norm":
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        h = x if self.form == "no upcast" else x.float()
        if self.form == "sqrt":
            n = h / torch.sqrt(self.squared(h).mean(-1, keepdim=True) + self.eps)
        else:
            n = h * torch.rsqrt(self.squared(h).mean(-1, keepdim=True) + self.eps)
        n = n.type_as(x) if self.form == "titan" else n.to(x.dtype)
        if self.weight is None:
            return n
        y = self.weight * n if self.weighting == "before" else n * self.weight
        return y.to(x.dtype)  # the fp32 weight promotes: that multiply stays outside the norm


class NormBlock(Block):
    """An RMSNorm."""

    kind = "norm"

    def __init__(self, rng, s, weighting: str | None = None):
        super().__init__(rng, s)
        self.norm = Norm(self, rng, s, weighting)

    def expect(self):
        return Expect().fired(rmsnorm=1).left(rmsnorm=1)

    def forward(self, x):
        return self.norm(x)


class ResidualNormBlock(Block):
    """A pre-norm residual: ``total = x + branch``, its norm, optionally a projection of the norm. A branch that
    broadcasts (a bias) is no residual, nor is a sum the norm reads through a relayout: the norm alone is fused."""

    kind = "residual_norm"

    def __init__(self, rng, s, residual: bool = False):
        """``residual``: a residual the norm fuses."""
        super().__init__(rng, s)
        self.gain = norm_weight(s.hidden, s.dtype)
        self.order = self.choose(rng, "add", ["x + branch", "branch + x"])
        branches = ["tanh(x) * gain"] + ["gain (broadcast)"] * (not residual)
        self.broadcast = self.choose(rng, "branch", branches) != "tanh(x) * gain"
        self.norm = Norm(self, rng, s, plain=residual)
        self.proj = Linear(rng, s, s.hidden, s.hidden) if self.choose(rng, "proj", [True, False]) else None
        if self.proj is not None:
            self.choices["proj"] = self.proj.describe()
        self.setting = s

    def expect(self):
        residual = int(not (self.broadcast or self.norm.strided))  # the norm reads the add itself
        norm = {"rmsnorm_residual" if residual else "rmsnorm": 1}
        expect = Expect().fired(rmsnorm=1, rmsnorm_residual=residual)
        if self.proj is None:
            return expect.left(**norm)
        expect.add(self.proj.expect())
        if self.setting.fp8_producers and self.proj.direct and self.norm.fused_whole:
            return expect.fired(rmsnorm_fp8=1).left(rmsnorm_fp8=1)
        return expect.left(**norm)

    def forward(self, x):
        branch = self.gain if self.broadcast else torch.tanh(x) * self.gain
        total = x + branch if self.order == "x + branch" else branch + x
        y = self.norm(total)
        return (self.proj(y) if self.proj is not None else y) + total


class NormLinearsBlock(Block):
    """An RMSNorm read by one to three linears (attention's q, k, v), their outputs summed."""

    kind = "norm_linears"

    def __init__(self, rng, s, plain: bool = False, concatenated: bool = False):
        """``concatenated``: two or three linears spelled without a bias on the norm's output (fp8_concat fires)."""
        super().__init__(rng, s)
        self.norm = Norm(self, rng, s, plain=plain)
        if concatenated:
            spellings = [rng.choice(DIRECT[2:]) for _ in range(rng.randint(2, 3))]
        else:
            count = rng.randint(1, 3)
            spellings = [rng.choice(DIRECT)] + [rng.choice(SPELLINGS) for _ in range(count - 1)]
        self.linears = nn.ModuleList(Linear(rng, s, s.hidden, s.hidden, sp) for sp in spellings)
        self.choices["linears"] = [lin.describe() for lin in self.linears]
        self.setting = s

    def expect(self):
        expect = Expect().fired(rmsnorm=1)
        for linear in self.linears:
            expect.add(linear.expect())
        producer = self.setting.fp8_producers and self.norm.fused_whole
        expect.add(concatenations(self.setting, list(self.linears), producer))
        if producer:
            return expect.fired(rmsnorm_fp8=1).left(rmsnorm_fp8=1)
        return expect.left(rmsnorm=1)

    def forward(self, x):
        h = self.norm(x)
        return sum(linear(h) for linear in self.linears)
