"""Grouped GEMMs whose implementation reads offs on the host -> one early ``copy_to_host`` of offs, read by them all.

One GEMM per group (``vendor_per_group``) reads the group bounds on the host. Read there from the device, each call
drains the GPU's queue, forward and backward: six times per MoE layer. The copy, queued as soon as offs exist, lets
the calls wait for it alone while the permute queued after it runs; the backward reads the same host tensor, saved.
Why: ``docs/kernels.md``, "Offsets on the host".
"""

from __future__ import annotations

import torch.fx as fx
from torch._inductor import config as inductor_config

from ..kernels import registry
from ..ops.grouped_mm import GroupedMMNode
from ..ops.host_copy import CopyToHostNode
from ..options import Options
from . import ir
from .manager import Phase, RewritePass
from .surgery import insert_view

KERNELS = GroupedMMNode.kernels  # forward and dgrad (grouped_gemm), wgrad


def reads_offs_on_host(gemm: GroupedMMNode) -> bool:
    """Whether an implementation the GEMM's ``impl`` prefers, forward or backward, waits on offs' values."""
    device = ir.fake(gemm.x).device
    return not all(registry.has_capability(k, device, gemm.impl, registry.LAUNCHES_AHEAD) for k in KERNELS)


def first_after(node: fx.Node) -> fx.Node:
    """The node a new call reading ``node`` goes before: the next one, past the graph's placeholders."""
    after = node.next
    while after.op == "placeholder":
        after = after.next
    return after


class GroupedMMHostOffsPass(RewritePass):
    """GEMMs reading offs on the host: one early copy."""

    name = "grouped_mm_host_offs"
    phase = Phase.FUSE
    after = ("grouped_mm_impl", "moe_permute")  # the implementations chosen; offs from the permute that makes them

    def apply(self, graph: fx.Graph, options: Options) -> int:
        if inductor_config.triton.cudagraphs:
            # A capture declines the implementations reading offs on the host; a host tensor would keep it off.
            return 0
        readers: dict[fx.Node, list[GroupedMMNode]] = {}
        for node in graph.nodes:
            gemm = GroupedMMNode.of(node)
            if gemm is not None and gemm.host_offs is None and reads_offs_on_host(gemm):
                readers.setdefault(gemm.offs, []).append(gemm)
        for offs, gemms in readers.items():
            host = insert_view(graph, first_after(offs), CopyToHostNode, t=offs).node
            for gemm in gemms:
                gemm.set(host_offs=host)
        return len(readers)
