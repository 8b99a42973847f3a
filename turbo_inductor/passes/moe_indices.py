"""The index arithmetic of MoE routing, which ``moe_permute`` and ``moe_combine`` both read: flattened top-k
choices, a permutation's token index ``perm // k``, and the ``[S, H]`` indexes torchtitan gathers and scatters with."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from . import ir, patterns


def same(a, b) -> bool:
    """Sizes equal without a guard (symbolic sizes included)."""
    return statically_known_true(a == b)


def flat_source(node) -> fx.Node | None:
    """t for a flattening ``t.reshape(-1)`` / ``t.view(-1)`` / ``t.flatten()`` of a 2-D t."""
    if not (
        ir.calls(node, "reshape", (torch.reshape,))
        or ir.calls(node, "view")
        or ir.calls(node, "flatten", (torch.flatten,))
    ):
        return None
    source, nt = node.args[0], ir.fake(node)
    st = ir.fake(source)
    return source if st is not None and nt is not None and st.dim() == 2 and nt.dim() == 1 else None


def floordiv_by(node, value, k: int) -> bool:
    """Whether ``node`` is ``value // k`` (``operator.floordiv``, ``torch.floor_divide`` or the method)."""
    return (
        node.op == "call_function"
        and node.target in (operator.floordiv, torch.floor_divide)
        and node.args[:2] == (value, k)
    ) or (ir.calls(node, "floor_divide") and node.args[:2] == (value, k))


def expanded_rows(index) -> list[fx.Node]:
    """The [S, H] indexes ``index.reshape(-1, 1).expand(-1, H)`` made from a 1-D ``index``.
    torchtitan gathers and scatters with them."""
    out = []
    for column in index.users:
        ct = ir.fake(column)
        if not (patterns.adds_a_unit_dim(column) and column.args[0] is index and ct is not None and ct.dim() == 2):
            continue
        out += [e for e in column.users if ir.calls(e, "expand") and ir.fake(e) is not None and ir.fake(e).dim() == 2]
    return out
