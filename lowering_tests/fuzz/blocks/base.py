"""What every block shares: the example's ``Setting``, what a block ``Expect``s of the passes, the ``Block`` base
class, a linear in each of its spellings, and the rewrites of FP8 linears reading one x."""

from __future__ import annotations

import collections
import dataclasses
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

from turbo_inductor.recipes import RECIPES, ROW_RECIPES

E4M3_MAX = 448.0


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


def linear_weight(*shape: int, fan_in: int, dtype: torch.dtype) -> nn.Parameter:
    """A linear's random weight: its output at its input's scale."""
    return nn.Parameter((torch.randn(*shape) * fan_in**-0.5).to(dtype))


def norm_weight(hidden: int, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter((torch.randn(hidden) * 0.5 + 1).to(dtype))


def column_major(x: torch.Tensor) -> torch.Tensor:
    """``x``'s values with its last two dimensions laid out column-major: rows whose elements are strided."""
    return x.transpose(-1, -2).contiguous().transpose(-1, -2)


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
            self.v = linear_weight(k, n, fan_in=k, dtype=s.dtype)
        else:
            self.w = linear_weight(n, k, fan_in=k, dtype=s.dtype)
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


# The most rows of x that :func:`generate` draws (3 x 8, or 24): blocks reading token ids take a row's from a table
# this long.
MAX_ROWS = 24


def rows_of(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1]
