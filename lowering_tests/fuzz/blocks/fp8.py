"""FP8 blocks: linears under the ``fp8`` option, FP8 inference written by hand with ``torch._scaled_mm``, and
torchao's float8 training (fp8, fp8_scaled_mm, torchao_float8)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from lowering_tests.fuzz.blocks.base import E4M3_MAX, Block, Expect, Linear, linear_weight
from turbo_inductor.testing import scaled_mm_takes_row_scales

# The scales hand-written and torchao FP8 may take: the examples run on the CPU, whose _scaled_mm may lack row scales.
SCALED_MM_SCALES = ("tensorwise", "rowwise") if scaled_mm_takes_row_scales("cpu") else ("tensorwise",)


class LinearsBlock(Block):
    """Two linears with a SiLU between: FP8 linears under the ``fp8`` option, else left alone.
    Smooth: a ReLU's mask flips where FP8 noise moves a value across 0, its gradient with it."""

    kind = "linears"

    def __init__(self, rng, s):
        super().__init__(rng, s)
        width = rng.choice([16, 32, 64])
        self.first = Linear(rng, s, s.hidden, width)
        self.second = Linear(rng, s, width, s.hidden)
        self.choices["linears"] = [self.first.describe(), self.second.describe()]

    def expect(self):
        return self.first.expect().add(self.second.expect())

    def forward(self, x):
        return self.second(F.silu(self.first(x)))


class ScaledMMBlock(Block):
    """FP8 inference written by hand: dynamic tensorwise or rowwise scales, then ``torch._scaled_mm``."""

    kind = "scaled_mm"

    def __init__(self, rng, s):
        super().__init__(rng, s)
        self.rowwise = self.choose(rng, "scales", SCALED_MM_SCALES) == "rowwise"
        self.w = linear_weight(s.hidden, s.hidden, fan_in=s.hidden, dtype=s.dtype)

    def expect(self):
        return Expect().fired(fp8_scaled_mm=1).left(fp8_linear=1)

    def scale(self, t):
        amax = t.abs().amax(dim=-1, keepdim=True) if self.rowwise else t.abs().amax()
        return amax.float().clamp(min=1e-12) / E4M3_MAX

    def forward(self, x):
        rows = x.reshape(-1, x.shape[-1])
        sx, sw = self.scale(rows), self.scale(self.w)
        x8 = (rows.float() / sx).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        w8 = (self.w.float() / sw).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        scale_b = sw.t() if self.rowwise else sw
        y = torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=scale_b, out_dtype=x.dtype, use_fast_accum=True)
        return y.reshape(x.shape)


class TorchaoBlock(Block):
    """An MLP whose linears torchao converted to float8 training, in a recipe that is one of ours."""

    kind = "torchao"

    def __init__(self, rng, s):
        super().__init__(rng, s)
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        width = self.choose(rng, "width", [16, 32, 64])
        recipe = self.choose(rng, "recipe", SCALED_MM_SCALES)
        bias = self.choose(rng, "bias", [True, False])
        self.mlp = nn.Sequential(
            nn.Linear(s.hidden, width, bias=bias, dtype=s.dtype), nn.SiLU(), nn.Linear(width, s.hidden, dtype=s.dtype)
        )
        convert_to_float8_training(self.mlp, config=Float8LinearConfig.from_recipe_name(recipe))

    def expect(self):
        return Expect().fired(torchao_float8=2).left(fp8_linear=2)

    def forward(self, x):
        return self.mlp(x)
