"""Tensor-parallel blocks: a row-parallel linear all-reduced, a column-parallel one whose input gradient is
(gemm_allreduce, gemm_allreduce_dgrad)."""

from __future__ import annotations

import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from lowering_tests.fuzz.blocks.base import Block, Expect, Linear
from turbo_inductor.testing.distributed import SumOverRanks


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
