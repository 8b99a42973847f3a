"""Which claim-phase pass takes a linear. Each pass registers what it wants, with a priority.
A pass takes a linear only when ``owner`` names it: passes agree without asking each other (``docs/passes.md``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch.fx as fx

from ..options import Options
from . import linears

Wants = Callable[[linears.Linear, Options], bool]
_CLAIMANTS: dict[str, tuple[int, Wants]] = {}


def claimant(name: str, priority: int) -> Callable[[Wants], Wants]:
    """Decorator: pass ``name`` wants the linears for which the function is true.
    The function also reads the options, which say whether the pass is on. The highest priority wins."""

    def register(wants: Wants) -> Wants:
        _CLAIMANTS[name] = (priority, wants)
        return wants

    return register


def owner(linear: linears.Linear, options: Options) -> str | None:
    """The name of the pass that takes ``linear``, or None."""
    wanting = [(priority, name) for name, (priority, wants) in _CLAIMANTS.items() if wants(linear, options)]
    return max(wanting)[1] if wanting else None


def claimed(graph: fx.Graph, name: str, options: Options) -> Iterator[tuple[fx.Node, linears.Linear]]:
    """The linears of ``graph`` that pass ``name`` takes, with their nodes; safe to rewrite while iterating."""
    for node in list(graph.nodes):
        linear = linears.linear_of(node)
        if linear is not None and owner(linear, options) == name:
            yield node, linear
