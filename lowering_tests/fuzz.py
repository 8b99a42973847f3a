"""The rewrite fuzzer: random models chained from blocks, each block knowing which rewrites it must get.

An example is determined by its seed: settings, blocks, weights and inputs, all on CPU. :func:`check` captures the
model's Dynamo graph, runs the passes on it in strict mode, and runs the graph before and after eagerly. It asserts
the rewrite counts, our ops left in the graph, the kernels run forward and backward, and the outputs and gradients
of the graph before: at the dtype's gate, or at the FP8 gates where anything computes in FP8.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import random

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
import torch.nn.functional as F
from attention_masks import CAUSAL, MASKS
from conftest import TOLERANCE

import turbo_inductor
from turbo_inductor.options import Options
from turbo_inductor.passes import PASSES, PassManager
from turbo_inductor.recipes import RECIPES, ROW_RECIPES
from turbo_inductor.testing import scaled_mm_takes_row_scales
from turbo_inductor.testing.moe import TitanMoE, hf_sparse_moe

OUTPUT_GATE_DB, GRADIENT_GATE_DB = 25.0, 20.0  # FP8 gates (shared/targets.md)
# The same GEMMs' FP8 noise on inputs rounded elsewhere is another draw of it. Over the few values of a small
# gradient (a router's or an expert's, from 3 tokens) draws differ by up to 4.2 dB; on six other inputs, the same
# model puts the fused and the FP8-GEMMs-alone runs within 1.1 dB either way.
IDEAL_MARGIN_DB = 4.5
# The FP8 gate is lowered no further, however ill-conditioned the result: a rewrite computing something else falls
# below it (a dropped norm weight of N(1, 0.5): 7 dB). The least result accepted over 1,262 FP8 examples, 312 of them
# 2-expert MoEs on 1-3 tokens, was 17.4 dB: torchao's FP8 against ours, a linear's weight gradient from 3 tokens.
GATE_FLOOR_DB = 12.0
# The passes that make the FP8 GEMMs of the ``fp8`` option, and what they read (grouped_mm's canonical op).
FP8_GEMM_PASSES = ("grouped_mm", "fp8", "fp8_concat", "fp8_experts")
# The recipes that concatenate the weights of FP8 linears reading one x at every width drawn (fp8_concat).
CONCAT_RECIPES = tuple(name for name, recipe in RECIPES.items() if recipe.concatenates_exactly([16]))
E4M3_MAX = 448.0
# The scales hand-written and torchao FP8 may take: the examples run on the CPU, whose _scaled_mm may lack row scales.
SCALED_MM_SCALES = ("tensorwise", "rowwise") if scaled_mm_takes_row_scales("cpu") else ("tensorwise",)

# The kernels each of our ops runs (forward, backward), by kernel name.
OP_KERNELS = {
    "rmsnorm": ({"rmsnorm_fwd"}, {"rmsnorm_bwd"}),
    "rmsnorm_residual": ({"rmsnorm_fwd"}, {"rmsnorm_bwd"}),
    "rmsnorm_fp8": ({"rmsnorm_fwd_fp8"}, {"rmsnorm_bwd"}),
    "glu": ({"glu_fwd"}, {"glu_bwd"}),
    "glu_fused": ({"glu_fwd"}, {"glu_bwd"}),
    "glu_fp8": ({"glu_fwd_fp8"}, {"glu_bwd"}),
    "fp8_linear": ({"fp8_quantize", "fp8_gemm"}, {"fp8_quantize", "fp8_gemm"}),
    "fp8_shared_input": ({"fp8_quantize"}, set()),
    "gemm_allreduce": ({"gemm_allreduce_fwd"}, {"gemm_allreduce_bwd"}),
    "linear_dgrad_allreduce": (set(), {"gemm_allreduce_fwd"}),  # the forward is a plain GEMM
    "grouped_mm": ({"grouped_gemm"}, {"grouped_gemm", "grouped_gemm_wgrad"}),
    "fp8_grouped_mm": ({"fp8_quantize", "fp8_grouped_gemm"}, {"fp8_grouped_gemm"}),  # dW's kernel: by recipe
    "moe_permute": ({"moe_route", "moe_dispatch"}, {"moe_gather_sum"}),
    "moe_combine": ({"moe_gather_sum"}, {"moe_dispatch"}),
    "rotary": ({"rotary"}, {"rotary"}),
    "embedding": ({"embedding_fwd"}, {"embedding_bwd"}),
    "cross_entropy": ({"cross_entropy_fwd"}, {"cross_entropy_bwd"}),
}


@dataclasses.dataclass
class Expect:
    """What the passes must do to a block: rewrites per pass and our ops left in the graph, by op name."""

    counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    ops: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def add(self, other: Expect) -> Expect:
        self.counts.update(other.counts)
        self.ops.update(other.ops)
        return self

    def fired(self, **counts: int) -> Expect:
        self.counts.update(counts)
        return self

    def left(self, **ops: int) -> Expect:
        self.ops.update(ops)
        return self


@dataclasses.dataclass(frozen=True)
class Setting:
    """What every block of one example shares."""

    dtype: torch.dtype
    hidden: int
    fp8: str | None  # the ``fp8`` option's recipe
    train: bool
    impl: str
    dynamic: bool  # the first dimension's size symbolic in the graph (where it is not 1)

    @property
    def widths(self) -> list[int]:
        """Inner widths to draw from: multiples of 16 (FP8's GEMMs), and without FP8 one that is not."""
        return [16, 32, 48] + ([24] if self.fp8 is None else [])

    @property
    def fp8_producers(self) -> bool:
        """Whether norms and GLUs feeding FP8 GEMMs write their FP8 input."""
        return self.fp8 in ROW_RECIPES


def _weight(*shape: int, fan_in: int, dtype: torch.dtype) -> nn.Parameter:
    """A linear's random weight: its output at its input's scale."""
    return nn.Parameter((torch.randn(*shape) * fan_in**-0.5).to(dtype))


def _norm_weight(hidden: int, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter((torch.randn(hidden) * 0.5 + 1).to(dtype))


def column_major(x: torch.Tensor) -> torch.Tensor:
    """``x``'s values with its last two dimensions laid out column-major: rows whose elements are strided."""
    return x.transpose(-1, -2).contiguous().transpose(-1, -2)


# ---- linears, every spelling -------------------------------------------------------------------------------------

SPELLINGS = ("nn.Linear", "F.linear", "x @ W.t()", "x @ W.T", "matmul transpose", "x @ V", "torch.mm", "addmm")
# torch.mm and addmm take 2-D operands: the block flattens x first, so a producer does not feed them directly.
DIRECT = SPELLINGS[:6]


class Linear(nn.Module):
    """A linear [..., K] -> [..., N] in one of its spellings."""

    def __init__(self, rng: random.Random, s: Setting, k: int, n: int, spelling: str | None = None):
        super().__init__()
        self.spelling = spelling or rng.choice(SPELLINGS)
        self.k, self.n = k, n
        if self.spelling == "nn.Linear":
            self.linear = nn.Linear(k, n, bias=rng.random() < 0.5, dtype=s.dtype)
        elif self.spelling == "x @ V":
            self.v = _weight(k, n, fan_in=k, dtype=s.dtype)
        else:
            self.w = _weight(n, k, fan_in=k, dtype=s.dtype)
        bias = self.spelling == "addmm" or (self.spelling == "F.linear" and rng.random() < 0.5)
        self.b = nn.Parameter(torch.randn(n).to(s.dtype)) if bias else None
        self.fp8 = s.fp8 is not None

    @property
    def direct(self) -> bool:
        return self.spelling in DIRECT

    @property
    def has_bias(self) -> bool:
        return (self.b if self.spelling != "nn.Linear" else self.linear.bias) is not None

    def describe(self) -> str:
        return self.spelling + (" + bias" * self.has_bias)

    def expect(self) -> Expect:
        return Expect().fired(fp8=1).left(fp8_linear=1) if self.fp8 else Expect()

    def forward(self, x):
        sp = self.spelling
        if sp == "nn.Linear":
            return self.linear(x)
        if sp == "F.linear":
            return F.linear(x, self.w, self.b)
        if sp == "x @ W.t()":
            return x @ self.w.t()
        if sp == "x @ W.T":
            return x @ self.w.T
        if sp == "matmul transpose":
            return torch.matmul(x, self.w.transpose(0, 1))
        if sp == "x @ V":
            return x @ self.v
        return self.rows(x.reshape(-1, self.k)).reshape(*x.shape[:-1], self.n)

    def rows(self, rows):
        """torch.mm or addmm of 2-D ``rows``."""
        return torch.mm(rows, self.w.t()) if self.spelling == "torch.mm" else torch.addmm(self.b, rows, self.w.t())


def concatenations(s: Setting, linears: list[Linear], producer: bool = False) -> Expect:
    """What fp8_concat and fp8_shared_input do to ``linears``, all reading one x: those spelled on x directly, grouped
    by bias, become one FP8 linear per group of two or more, where the recipe concatenates their weights exactly.
    Two or more FP8 linears then left on x share one quantization of it, unless its ``producer`` writes x in FP8.
    (torch.mm and addmm each read their own reshape of x.)"""
    expect = Expect()
    direct = [linear for linear in linears if linear.direct]
    for bias in (False, True):
        group = [linear for linear in direct if linear.has_bias == bias]
        if s.fp8 is not None and len(group) > 1 and RECIPES[s.fp8].concatenates_exactly([lin.n for lin in group]):
            expect.fired(fp8_concat=1).left(fp8_linear=1 - len(group))
    shared = int(s.fp8 is not None and not producer and len(direct) + expect.ops["fp8_linear"] > 1)
    return expect.fired(fp8_shared_input=shared).left(fp8_shared_input=shared)


# ---- blocks ------------------------------------------------------------------------------------------------------


class Block(nn.Module):
    """A block maps [..., hidden] to [..., hidden] and says what the passes must do to it (``expect``)."""

    kind = ""
    moe = False  # routes tokens: comes first, on the model's own input, so that both graphs route alike
    precision: torch.dtype | None = None  # a dtype it computes in below the model's

    def __init__(self, rng: random.Random, s: Setting):
        super().__init__()
        self.choices: dict = {}

    def choose(self, rng: random.Random, name: str, options):
        self.choices[name] = value = rng.choice(options)
        return value

    def describe(self) -> str:
        return f"{self.kind}({', '.join(f'{k}={v}' for k, v in self.choices.items())})"

    def expect(self) -> Expect:
        raise NotImplementedError


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
        self.weight = _norm_weight(s.hidden, dtype) if self.weighting != "none" else None
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
        self.gain = _norm_weight(s.hidden, s.dtype)
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
        self.w = _weight(s.hidden, s.hidden, fan_in=s.hidden, dtype=s.dtype)

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


class SumOverRanks(torch.autograd.Function):
    """Megatron's copy to the tensor-parallel region: the identity forward, the gradient summed over the ranks."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return funcol.all_reduce(grad, "sum", dist.group.WORLD)


class AllReduceBlock(Block):
    """A row-parallel linear: its result sum all-reduced, functionally or in place."""

    kind = "allreduce"

    def __init__(self, rng, s):
        super().__init__(rng, s)
        self.in_place = self.choose(rng, "all_reduce", ["funcol", "in place"]) == "in place"
        self.linear = Linear(rng, s, s.hidden, s.hidden)
        self.choices["linear"] = self.linear.describe()

    def expect(self):
        # FP8 claims the linear first (passes/claims.py): the all-reduce then stays
        return self.linear.expect() if self.linear.fp8 else Expect().fired(gemm_allreduce=1).left(gemm_allreduce=1)

    def forward(self, x):
        if self.linear.direct:
            return self.reduced(self.linear(x))
        # torch.mm and addmm: the 2-D result itself is reduced
        return self.reduced(self.linear.rows(x.reshape(-1, x.shape[-1]))).reshape(x.shape)

    def reduced(self, y):
        if self.in_place:
            dist.all_reduce(y)
            return y
        return funcol.all_reduce(y, "sum", dist.group.WORLD)


class DgradBlock(Block):
    """A column-parallel linear: its input gradient all-reduced (in training; inference inlines the function)."""

    kind = "dgrad"

    def __init__(self, rng, s):
        super().__init__(rng, s)
        self.linear = Linear(rng, s, s.hidden, s.hidden)
        self.choices["linear"] = self.linear.describe()
        self.train = s.train

    def expect(self):
        if self.linear.fp8 or not self.train:
            return self.linear.expect()
        return Expect().fired(gemm_allreduce_dgrad=1).left(linear_dgrad_allreduce=1)

    def forward(self, x):
        if self.linear.direct:
            return self.linear(SumOverRanks.apply(x))
        # torch.mm and addmm read the function's output itself
        return self.linear.rows(SumOverRanks.apply(x.reshape(-1, x.shape[-1]))).reshape(x.shape)


class TitanMoEBlock(Block):
    """torchtitan's MoE layer (testing/moe.py): its experts run in bf16 whatever the model's dtype."""

    kind = "titan_moe"
    moe = True
    precision = torch.bfloat16

    def __init__(self, rng, s):
        super().__init__(rng, s)
        experts = self.choose(rng, "experts", [2, 3, 4, 8])
        top_k = self.choose(rng, "top_k", [k for k in (1, 2, 3) if k <= experts])
        self.shared = self.choose(rng, "shared_expert", [True, False])
        self.scores_first = self.choose(rng, "scores before experts", [True, False])
        self.layer = TitanMoE(
            s.hidden,
            self.choose(rng, "expert width", s.widths),
            experts,
            top_k,
            score_func=self.choose(rng, "scores", ["softmax", "sigmoid"]),
            score_before_experts=self.scores_first,
            shared_expert=self.shared,
        ).to(s.dtype)
        self.setting = s

    def expect(self):
        s, shared = self.setting, int(self.shared)
        # Weighted in fp32 after the experts, rows in bf16 added to an fp32 model's stream: the combine would sum
        # in bf16, so it is left alone.
        combine = int(self.scores_first or s.dtype == torch.bfloat16)
        expect = Expect().fired(grouped_mm=3, moe_permute=1, moe_combine=combine, glu=1 + shared)
        expect.left(moe_permute=1, moe_combine=combine)
        if s.fp8 is None:
            return expect.left(grouped_mm=3, glu=1 + shared)
        expect.fired(fp8=3 * shared, fp8_experts=3).left(fp8_linear=3 * shared, fp8_grouped_mm=3)
        # the shared expert's w1 and w3 read one x: concatenated, their outputs are the halves of one
        width = self.layer.shared.w1.out_features if self.shared else 0
        concatenated = int(self.shared and RECIPES[s.fp8].concatenates_exactly([width, width]))
        expect.fired(fp8_concat=concatenated).left(fp8_linear=-concatenated)
        shared_x = int(self.shared and not concatenated)  # w1 and w3 share x's quantization
        expect.fired(fp8_shared_input=shared_x).left(fp8_shared_input=shared_x)
        if s.fp8_producers:
            return expect.fired(glu_fp8=1 + shared).left(glu_fp8=1 + shared)
        return expect.left(glu=1 + shared - concatenated, glu_fused=concatenated)

    def forward(self, x):
        return self.layer(x)


class HFMoEBlock(Block):
    """transformers' own sparse MoE block (Mixtral's or Qwen3-MoE's), its experts run by ``grouped_mm``."""

    kind = "hf_moe"
    moe = True

    def __init__(self, rng, s):
        super().__init__(rng, s)
        experts = self.choose(rng, "experts", [2, 3, 4, 8])
        self.layer = hf_sparse_moe(
            self.choose(rng, "family", ["mixtral", "qwen3_moe"]),
            s.hidden,
            self.choose(rng, "expert width", s.widths),
            experts,
            # top-1: the weights, normalized over the choices, are 1: the router's gradient is rounding noise only
            self.choose(rng, "top_k", [k for k in (2, 3) if k <= experts]),
        ).to(s.dtype)
        self.setting = s

    def expect(self):
        expect = Expect().fired(grouped_mm=2, moe_permute=1, moe_combine=1, glu=1).left(moe_permute=1, moe_combine=1)
        if self.setting.fp8 is None:
            return expect.left(grouped_mm=2, glu_fused=1)
        expect.fired(fp8_experts=2).left(fp8_grouped_mm=2)
        if self.setting.fp8_producers:
            return expect.fired(glu_fp8=1).left(glu_fp8=1)
        return expect.left(glu_fused=1)

    def forward(self, x):
        out = self.layer(x)
        return out[0] if isinstance(out, tuple) else out


class RotaryBlock(Block):
    """A rotary position embedding as transformers applies it: the rows of x as positions of heads-first heads,
    ``x * cos + rotate_half(x) * sin`` with the model's cos/sin table, either order of each product and the sum."""

    kind = "rotary"

    def __init__(self, rng, s):
        super().__init__(rng, s)
        self.heads = self.choose(rng, "heads", [h for h in (1, 2, 4) if s.hidden % (2 * h) == 0])
        self.swapped = self.choose(rng, "order", [False, True])
        self.heads_first = self.choose(rng, "layout", ["heads first", "positions first"]) == "heads first"
        self.scale = _norm_weight(s.hidden, s.dtype)  # a parameter before it: the gradient reaches one
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


class AttentionBlock(Block):
    """Attention over each row's hidden units as 4 positions, under a mask built in forward (as transformers builds
    it under torch.compile): the causal one in one of its spellings, or a near miss. Its sizes stay static."""

    kind = "attention"
    POSITIONS = 4

    def __init__(self, rng, s, mask: str | None = None):
        super().__init__(rng, s)
        self.mask = self.choose(rng, "mask", [mask] if mask else list(MASKS))
        self.scale = _norm_weight(s.hidden, s.dtype)  # a parameter before it: the gradient reaches one

    def expect(self):
        return Expect().fired(causal_mask=1) if self.mask in CAUSAL else Expect()

    def forward(self, x):
        q = (x * self.scale).reshape(-1, 1, self.POSITIONS, x.shape[-1] // self.POSITIONS)
        kv = x.reshape(q.shape)
        mask = MASKS[self.mask](self.POSITIONS, self.POSITIONS, 1, x.dtype, x.device)
        return F.scaled_dot_product_attention(q, kv, kv, attn_mask=mask).reshape(x.shape)


# The most rows of x that :func:`generate` draws (3 x 8, or 24): blocks reading token ids take a row's from a table
# this long.
MAX_ROWS = 24


def _rows(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1]


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
        ids = self.ids[: _rows(x)]
        if self.spelling == "nn.Embedding":
            e = self.table(ids)
        else:
            t = self.table
            e = F.embedding(ids, t.weight, t.padding_idx, scale_grad_by_freq=t.scale_grad_by_freq)
        return x * e.reshape(x.shape)


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
        target = self.target[: _rows(x)]
        loss = self.loss(rows, target) if self.loss is not None else F.cross_entropy(rows, target, **self.arguments)
        if self.reduction == "none":
            loss = loss.reshape(*x.shape[:-1], 1)
        return loss.to(x.dtype) * self.gain


class NearMissBlock(Block):
    """A pattern like a fused one that computes something else: nothing may be rewritten."""

    kind = "near_miss"
    VARIANTS = ("sigmoid gate", "activation read twice", "broadcast up", "norm over dim -2", "cube norm")

    def __init__(self, rng, s):
        super().__init__(rng, s)
        self.variant = self.choose(rng, "variant", self.VARIANTS)
        self.a, self.b = _norm_weight(s.hidden, s.dtype), _norm_weight(s.hidden, s.dtype)

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


KINDS: dict[str, type[Block]] = {
    b.kind: b
    for b in (
        NormBlock,
        ResidualNormBlock,
        NormLinearsBlock,
        GLUBlock,
        LinearsBlock,
        ScaledMMBlock,
        TorchaoBlock,
        AllReduceBlock,
        DgradBlock,
        TitanMoEBlock,
        HFMoEBlock,
        RotaryBlock,
        AttentionBlock,
        EmbeddingBlock,
        CrossEntropyBlock,
        NearMissBlock,
    )
}
# Example i leads with LEADS[i % len(LEADS)]: (block kind, the fp8 option, its arguments). The fp8 option: "row"
# a recipe whose producers fuse, "concat" one that also concatenates linears reading one x, "shared" one whose
# linears on one x stay separate (they share its quantization), "any" any recipe, "off" none, None drawn. Any
# len(LEADS) consecutive seeds take every block kind and fire every pass.
LEADS = (
    ("norm", None, {}),
    ("residual_norm", None, {"residual": True}),
    ("glu", None, {}),
    ("glu", "row", {"down": "direct"}),  # glu_fp8
    ("norm_linears", "concat", {"plain": True, "concatenated": True}),  # rmsnorm_fp8, fp8_concat
    ("norm_linears", "shared", {"concatenated": True}),  # fp8_shared_input
    ("linears", "any", {}),
    ("scaled_mm", None, {}),
    ("torchao", None, {}),
    ("allreduce", "off", {}),
    ("dgrad", "off", {}),
    ("titan_moe", None, {}),
    ("hf_moe", "off", {}),
    ("hf_moe", "row", {}),  # fp8_experts
    ("rotary", None, {}),
    ("attention", None, {"mask": "bool, by index"}),  # causal_mask
    ("embedding", None, {"fused": True}),
    ("cross_entropy", None, {"fused": True}),
    ("near_miss", None, {}),
)


class Chain(nn.Module):
    """Blocks adding to a residual stream, as transformer layers do.
    The scalar multiply after each add keeps blocks apart: no pattern spans two blocks."""

    def __init__(self, blocks: list[Block]):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x):
        for block in self.blocks:
            x = (x + block(x) * 0.5) * 0.75
        return x


@dataclasses.dataclass
class Example:
    """A random model and its input, from its seed."""

    seed: int
    setting: Setting
    model: Chain
    x: torch.Tensor

    @property
    def blocks(self) -> list[Block]:
        return list(self.model.blocks)

    @property
    def fp8(self) -> bool:
        """Whether it computes anything in FP8: then the SNR gates apply."""
        return self.setting.fp8 is not None or any(b.kind in ("scaled_mm", "torchao") for b in self.blocks)

    @property
    def precision(self) -> torch.dtype:
        dtypes = [self.setting.dtype] + [b.precision for b in self.blocks if b.precision is not None]
        return min(dtypes, key=lambda d: torch.finfo(d).bits)

    def options(self) -> dict:
        return {"impl": self.setting.impl, **({"fp8": self.setting.fp8} if self.setting.fp8 else {})}

    def expect(self) -> Expect:
        expect = Expect()
        for block in self.blocks:
            expect.add(block.expect())
        return expect

    def __str__(self) -> str:
        s = self.setting
        head = (
            f"fuzz example seed={self.seed}: {str(s.dtype).removeprefix('torch.')} x{list(self.x.shape)} "
            f"fp8={s.fp8} impl={s.impl} {'training' if s.train else 'inference'}{' dynamic' * s.dynamic}"
        )
        rerun = f"rerun: TURBO_FUZZ_SEED={self.seed} pytest lowering_tests/test_fuzz_rewrites.py -k seed{self.seed}"
        return "\n  ".join([head, *(b.describe() for b in self.blocks), rerun])


def generate(seed: int, lead: tuple | None = None, kinds=None, count: int | None = None, **fixed) -> Example:
    """The example of ``seed``: a block ``lead`` (default: LEADS by seed), then ``count`` (default 0 to 3) random
    blocks of ``kinds`` (default: any). ``fixed``: Setting fields given instead of drawn."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    kind, fp8, arguments = lead or LEADS[seed % len(LEADS)]
    count = rng.randint(0, 3) if count is None else count
    plan = [(kind, arguments)] + [(rng.choice(sorted(kinds or KINDS)), {}) for _ in range(count)]
    # One MoE, first: routing is discontinuous, so it reads the model's own input in both graphs.
    moe = next((p for p in plan if KINDS[p[0]].moe), None)
    plan = [moe] * (moe is not None) + [p for p in plan if not KINDS[p[0]].moe]
    # torch._scaled_mm has no backward, and dgrad wants one: the lead's kind stays
    dropped = {"scaled_mm", "dgrad"} - {kind} if {"scaled_mm", "dgrad"} <= {k for k, _ in plan} else set()
    plan = [p for p in plan if p[0] not in dropped]
    kinds = {k for k, _ in plan}
    if fp8 == "row":
        recipe = rng.choice(ROW_RECIPES)
    elif fp8 == "concat":
        recipe = rng.choice(CONCAT_RECIPES)
    elif fp8 == "shared":
        recipe = "tensorwise"
    elif fp8 == "any" or (fp8 is None and rng.random() < 0.4):
        recipe = rng.choice(sorted(RECIPES))
    else:
        recipe = None
    hands_fp8 = recipe is not None or bool(kinds & {"scaled_mm", "torchao"})
    drawn = dict(
        dtype=rng.choice([torch.float32, torch.bfloat16]),
        hidden=rng.choice([16, 32, 48, 64] + ([40] if not hands_fp8 else [])),
        fp8=recipe,
        train="scaled_mm" not in kinds and ("dgrad" in kinds or rng.random() < 0.8),
        # Triton's CPU interpreter rounds ~2% of fp8 stores wrongly: FP8 runs the reference kernels on CPU
        impl="reference" if hands_fp8 else rng.choice(["reference", "auto"]),
        dynamic=rng.random() < 0.3,
    )
    setting = Setting(**{**drawn, **fixed})
    blocks = [KINDS[k](rng, setting, **kwargs) for k, kwargs in plan]
    if moe is not None or rng.random() < 0.5:
        shape = (rng.randint(1, 3), rng.randint(1, 8), setting.hidden)
    else:
        shape = (rng.randint(1, MAX_ROWS), setting.hidden)
    return Example(seed, setting, Chain(blocks), torch.randn(shape).to(setting.dtype))


# ---- running an example ------------------------------------------------------------------------------------------


def capture(model: nn.Module, x: torch.Tensor, s: Setting) -> tuple[torch.fx.GraphModule, list]:
    """The one graph Dynamo captures of ``model(x)`` and its inputs (sizes, x, parameters); nothing is compiled."""
    graphs = []

    def backend(gm, example_inputs):
        # a symbolic size's example is a SymInt: its value runs the graph
        graphs.append((gm, [int(v.node.hint) if isinstance(v, torch.SymInt) else v for v in example_inputs]))
        return gm.forward

    torch._dynamo.reset()
    # x requires grad in training: Dynamo inlines an autograd.Function none of whose inputs do.
    x = x.detach().requires_grad_(s.train)
    if s.dynamic and x.shape[0] > 1:
        torch._dynamo.mark_dynamic(x, 0)
    with torch.set_grad_enabled(s.train):
        torch.compile(model, backend=backend, fullgraph=True)(x)
    assert len(graphs) == 1
    return graphs[0]


def evaluate(gm: torch.fx.GraphModule, inputs: list, train: bool) -> tuple[list, list, collections.Counter]:
    """(outputs, gradients of every input, kernels run by the backward) of ``gm`` run eagerly. The output
    cotangents are fixed random values."""
    inputs = [
        t.detach().clone().requires_grad_(train and t.is_floating_point()) if isinstance(t, torch.Tensor) else t
        for t in inputs
    ]
    with torch.set_grad_enabled(train):
        outs = list(gm(*inputs))
    if not train:
        return [o.detach() for o in outs], [], collections.Counter()
    generator = torch.Generator().manual_seed(1)
    cotangents = [torch.randn(o.shape, generator=generator).to(o.device, o.dtype) for o in outs]
    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    before = collections.Counter(turbo_inductor.kernel_calls())
    grads = torch.autograd.grad(outs, leaves, cotangents, allow_unused=True)
    backward = collections.Counter(turbo_inductor.kernel_calls())
    backward.subtract(before)
    return [o.detach() for o in outs], list(grads), +backward


def snr_db(got: torch.Tensor, want: torch.Tensor) -> float:
    """10 log10(|want|^2 / |got - want|^2) in float64: inf when equal, -inf when want is zero and got is not."""
    signal, noise = want.double().pow(2).sum().item(), (got.double() - want.double()).pow(2).sum().item()
    if noise == 0:
        return math.inf
    return 10 * math.log10(signal / noise) if signal > 0 else -math.inf


def assert_agree(example: Example, what: str, got, want, ideal=None, conditioning=None) -> None:
    """``got`` equals ``want`` at the gate: the SNR gates where FP8 computes, else the dtype's tolerance.
    ``ideal()``: the same result with only the ``fp8`` option's GEMMs rewritten, for an example whose own FP8 noise
    is above the gates. ``conditioning()``: how many dB more the result moves than its inputs when they are rounded
    to FP8 (see :func:`inputs_in_fp8`)."""
    if want is None or got is None:
        assert got is None and want is None, f"{example}\n{what}: one graph has none"
        return
    assert got.shape == want.shape and got.dtype == want.dtype, f"{example}\n{what}: {got.shape} {got.dtype}"
    if example.fp8:
        gate = OUTPUT_GATE_DB if what.startswith("output") else GRADIENT_GATE_DB
        db = snr_db(got, want)
        if db >= gate:
            return
        # Several FP8 GEMMs in a row add their noise. Then the result may be no worse than with those GEMMs alone
        # (test_hf_models.py's rule): the fusions around them add none. Over few values that noise is itself noisy:
        # the result may instead lie within it of the FP8 GEMMs' alone (a router's gradient from 8 tokens: 9.6 dB
        # against the graph before, 15.8 for the GEMMs alone, 15.7 between the two).
        assert ideal is not None, f"{example}\n{what}: {db:.1f} dB against the graph before the passes (gate {gate} dB)"
        alone = ideal()
        alone_db, apart = snr_db(alone, want), snr_db(got, alone)
        floor = max(alone_db - IDEAL_MARGIN_DB, GATE_FLOOR_DB)
        if db >= floor or apart >= floor:
            return
        # A result that cancels (a 2-expert router's gradient from 2 tokens: differences of near-equal scores)
        # magnifies any FP8 rounding: the gate is lowered by how much more it moves than its inputs do.
        excess = conditioning() if conditioning is not None else 0.0
        lowered = max(gate - excess, GATE_FLOOR_DB)
        assert db >= lowered, (
            f"{example}\n{what}: {db:.1f} dB against the graph before the passes (gate {gate} dB, lowered to "
            f"{lowered:.1f}: {excess:.1f} dB more sensitive than its inputs, floor {GATE_FLOOR_DB} dB; "
            f"{alone_db:.1f} dB with the FP8 GEMMs alone, {apart:.1f} dB from them)"
        )
        return
    # Two low-precision results, each within the gate of the truth, are within twice the gate of each other.
    dtype = example.precision
    tol = TOLERANCE[dtype] * (2 if dtype in (torch.bfloat16, torch.float16) else 1)
    # At the scale of the tensor: a weight's gradient sums rows, and the stream's values are differences of
    # larger ones (cancellation); both carry errors of the largest values' size.
    atol = tol * max(1.0, want.abs().max().item())
    torch.testing.assert_close(
        got.double(), want.double(), rtol=tol, atol=atol, equal_nan=True, msg=lambda m: f"{example}\n{what}: {m}"
    )


def rewrite(gm: torch.fx.GraphModule, options: dict):
    """Runs every pass on ``gm`` in strict mode (a failing pass raises); returns the compile record."""
    manager = PassManager(PASSES, Options.parse({**options, "strict": True}, PASSES))
    manager(gm.graph)
    gm.recompile()
    return manager.record


def check(example: Example) -> None:
    """Capture, rewrite and run ``example``; assert what its blocks expect. Raises on the first difference,
    noting the example (its seed) on any error."""
    try:
        _check(example)
    except Exception as error:
        if not str(error).startswith("fuzz example"):
            error.add_note(str(example))
        raise


def _check(example: Example) -> None:
    s = example.setting
    gm, inputs = capture(example.model, example.x, s)
    # Dynamo's placeholders: sizes, x, parameters, buffers. Gradients are of the floating tensors.
    names = [
        n.target
        for n, t in zip(gm.graph.find_nodes(op="placeholder"), inputs)
        if isinstance(t, torch.Tensor) and t.is_floating_point()
    ]
    want_outs, want_grads, _ = evaluate(gm, inputs, s.train)
    record = rewrite(gm, example.options())
    expect = example.expect()
    counts = {p.name: record.replaced[p.name] for p in PASSES}  # what each pass did, rewritten again or not
    assert counts == {p.name: expect.counts[p.name] for p in PASSES}, f"{example}\nrewrites: {counts}"
    ours = {op.removeprefix("turbo_inductor."): n for op, n in record.ops_after.items() if op.startswith("turbo_")}
    assert ours == dict(+expect.ops), f"{example}\nour ops after the passes: {ours}, expected {dict(+expect.ops)}"

    turbo_inductor.reset_kernel_calls()
    got_outs, got_grads, backward = evaluate(gm, inputs, s.train)
    forward = collections.Counter(turbo_inductor.kernel_calls()) - backward
    for phase, calls, index in (("forward", forward, 0), ("backward", backward, 1)):
        if phase == "backward" and not s.train:
            continue
        ran = {kernel for kernel, _ in calls}
        wanted = set().union(*(OP_KERNELS[op][index] for op in +expect.ops))
        assert wanted <= ran, f"{example}\n{phase}: kernels {sorted(wanted - ran)} did not run ({dict(calls)})"
        if s.impl == "reference":
            assert {impl for _, impl in calls} <= {"reference"}, f"{example}\n{phase}: {dict(calls)}"

    assert len(got_outs) == len(want_outs) and len(got_grads) == len(want_grads), f"{example}\nresult count"
    ideal = functools.cache(lambda: fp8_gemms_alone(example))
    rounded = functools.cache(lambda: inputs_in_fp8(example))

    def conditioning(kind: int, i: int, want) -> float:
        inputs_db, results = rounded()
        return max(0.0, inputs_db - snr_db(results[kind][i], want))

    for i, (got, want) in enumerate(zip(got_outs, want_outs)):
        assert_agree(
            example, f"output {i}", got, want, lambda i=i: ideal()[0][i], lambda i=i, w=want: conditioning(0, i, w)
        )
    for i, (got, want) in enumerate(zip(got_grads, want_grads)):
        assert_agree(
            example,
            f"gradient of {names[i]}",
            got,
            want,
            lambda i=i: ideal()[1][i],
            lambda i=i, w=want: conditioning(1, i, w),
        )


def inputs_in_fp8(example: Example) -> tuple[float, tuple[list, list]]:
    """The graph before the passes on its floating inputs (x, parameters) rounded to e4m3 with one scale each:
    (the lowest SNR of a rounded input against itself, (outputs, gradients)). A result as well conditioned as its
    inputs moves as much as they do."""
    gm, inputs = capture(example.model, example.x, example.setting)
    rounded, inputs_db = [], math.inf
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            scale = E4M3_MAX / t.detach().abs().amax().float().clamp(min=1e-12)
            r = ((t.detach().float() * scale).to(torch.float8_e4m3fn).float() / scale).to(t.dtype)
            inputs_db = min(inputs_db, snr_db(r, t.detach()))
            t = r
        rounded.append(t)
    return inputs_db, evaluate(gm, rounded, example.setting.train)[:2]


def fp8_gemms_alone(example: Example) -> tuple[list, list]:
    """(outputs, gradients) of ``example`` with only the ``fp8`` option's GEMMs rewritten, every fusion off."""
    gm, inputs = capture(example.model, example.x, example.setting)
    rewrite(gm, {**example.options(), **{p.name: False for p in PASSES if p.name not in FP8_GEMM_PASSES}})
    return evaluate(gm, inputs, example.setting.train)[:2]
