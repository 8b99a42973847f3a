"""bf16 grouped GEMMs -> the implementation the device's cost table measured fastest at their shape.

``turbo_inductor.costs.grouped_implementation`` reads the table; the op's ``impl`` becomes ``prefer:NAME``, so a call
NAME declines (a CUDA graph capture) runs the registry's own choice. An ``impl`` the user gave is left alone, and so
are other dtypes, which the table does not time.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from .. import costs
from ..kernels import registry
from ..ops.grouped_mm import GroupedMMNode
from ..options import Options
from . import ir
from .manager import Phase, RewritePass, decided

KERNELS = GroupedMMNode.kernels  # forward and dgrad (grouped_gemm), wgrad


class GroupedMMImplPass(RewritePass):
    """bf16 grouped GEMMs to the implementation measured fastest for the shape."""

    name = "grouped_mm_impl"
    phase = Phase.CLAIM
    after = ("fp8_experts",)  # the grouped GEMMs FP8 did not take

    def apply(self, graph: fx.Graph, options: Options) -> int:
        count = 0
        for node in graph.nodes:
            gemm = GroupedMMNode.of(node)
            if gemm is None or gemm.impl != registry.AUTO:
                continue
            xt, wt = ir.fake(gemm.x), ir.fake(gemm.weight)
            if xt.dtype != torch.bfloat16:
                continue
            groups, k, n = wt.shape
            name, reason = costs.grouped_implementation(xt.device, xt.shape[0], k, n, groups)
            if name is not None and not all(name in registry.implementations(kernel) for kernel in KERNELS):
                name, reason = None, reason + f" (no implementation {name!r} here: the table is stale)"
            # Timed apart from the ranking's choice, the ranking's own first differs only by the timings' spread.
            ranked_first = name is not None and all(
                registry.candidates(kernel, xt.device)[:1] == [name] for kernel in KERNELS
            )
            if reason:
                decided(self.name, "experts", reason + (", the ranking's first already" if ranked_first else ""))
            if name is not None and not ranked_first:
                gemm.set(impl=registry.PREFER + name)
                count += 1
        return count
