"""A compiled graph that all-reduces checks, at its first call, that the ranks agree on the shapes it reduces.

Ranks that disagree would hang in the collective, or sum mismatched buffers. The eager GEMM + all-reduce ops check
at every call (``ops/gemm_allreduce.py``); compiled code checks once per graph, without a host round trip per call.
The check is a collective: every rank must compile the same graphs, as torch's compiled collectives require.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.fx as fx

from .ops.library import OpInputError

_ALL_REDUCES = (torch.ops._c10d_functional.all_reduce, torch.ops._c10d_functional.all_reduce.default)


def all_reduced(gm: fx.GraphModule) -> list[tuple[str, tuple]]:
    """(group name, shape) of each functional all-reduce in ``gm`` and its subgraphs (a backward's, say).
    Sizes may be symbolic. The fused GEMM + all-reduce sites are among them: the passes have not run yet."""
    sites = []
    for module in gm.modules():
        if not isinstance(module, fx.GraphModule):
            continue
        for node in module.graph.nodes:
            if node.op != "call_function" or node.target not in _ALL_REDUCES:
                continue
            value = node.args[0].meta.get("example_value") if isinstance(node.args[0], fx.Node) else None
            group_name = node.args[2] if len(node.args) > 2 else node.kwargs.get("group_name")
            if isinstance(value, torch.Tensor) and isinstance(group_name, str):
                sites.append((group_name, tuple(_expression(size) for size in value.shape)))
    return sites


def _expression(size) -> Any:
    """A size as an int, or its sympy expression where it is symbolic."""
    return size.node.expr if isinstance(size, torch.SymInt) else int(size)


def first_call_check(gm: fx.GraphModule) -> Callable[[Callable], Callable] | None:
    """None where ``gm`` all-reduces nothing. Else a wrapper of its compiled function: at the first call, it
    checks that the ranks agree on the shapes ``gm`` all-reduces. Where they do not, every rank raises, naming each
    rank's shapes. Read ``gm`` before the passes fuse its all-reduces."""
    sites = all_reduced(gm)
    inputs = [_input_sizes(node.meta.get("example_value")) for node in gm.graph.nodes if node.op == "placeholder"]
    return functools.partial(_checked_on_first_call, sites=sites, inputs=inputs) if sites else None


def _input_sizes(value) -> list | None:
    """A graph input's sizes (a tensor's, or a symbolic int itself) as ints or sympy expressions; None for others."""
    if isinstance(value, torch.SymInt):
        return [_expression(value)]
    return [_expression(size) for size in value.shape] if isinstance(value, torch.Tensor) else None


def _checked_on_first_call(compiled: Callable, sites: list[tuple[str, tuple]], inputs: list) -> Callable:
    pending = [True]

    @functools.wraps(compiled)
    def run(*args):  # Dynamo calls a backend's function with the graph's inputs
        if pending:
            _agree(sites, _symbol_values(inputs, args))  # where it raises, so does the next call's check
            pending.clear()
        return compiled(*args)

    return run


def _symbol_values(inputs: list, args) -> dict:
    """The value of each size symbol of the graph's inputs in this call: symbol -> int."""
    values = {}
    if len(inputs) != len(args):
        return values
    for sizes, arg in zip(inputs, args):
        given = [arg] if isinstance(arg, (int, torch.SymInt)) else arg.shape if isinstance(arg, torch.Tensor) else ()
        for size, value in zip(sizes or (), given):
            if not isinstance(size, int) and size.is_Symbol:
                values[size] = int(value)
    return values


def _evaluate(shape: tuple, values: dict) -> list[Any]:
    """``shape`` in this call: ints, or "?" for a size the inputs do not give (data-dependent)."""
    sizes = []
    for size in shape:
        try:
            sizes.append(size if isinstance(size, int) else int(size.xreplace(values)))
        except TypeError:
            sizes.append("?")
    return sizes


def _agree(sites: list[tuple[str, tuple]], values: dict) -> None:
    by_group: dict[str, list] = {}
    for group_name, shape in sites:
        by_group.setdefault(group_name, []).append(_evaluate(shape, values))
    for group_name in sorted(by_group):  # every rank in the same order
        group = dist.distributed_c10d._resolve_process_group(group_name)
        if dist.get_backend(group) == "fake":  # no peer to ask
            continue
        shapes = by_group[group_name]
        everyone = [None] * dist.get_world_size(group)
        dist.all_gather_object(everyone, shapes, group=group)
        if any(other != shapes for other in everyone):
            ranks = "; ".join(f"rank {rank} has {other}" for rank, other in enumerate(everyone))
            raise OpInputError(
                f"turbo_inductor: the ranks of group {group_name!r} disagree on the shapes this compiled graph "
                f"all-reduces: {ranks}. Every rank must run it with the same shapes (this is rank "
                f"{dist.get_rank(group)})"
            )
