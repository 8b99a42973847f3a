"""Experts' rows back in token order, summed over each token's k choices -> ``turbo_inductor.moe_combine``.

Runs on the moe_permute pass's ops. Matched, w_sorted being the permute's weights_sorted:
  - transformers 5: ``(y * w_sorted.unsqueeze(-1))[inv].view(T, k, H).sum(1)``, inv the permute's positions.
  - torchtitan: ``out.scatter_add(0, (order // k).reshape(-1, 1).expand(-1, H), y_w)``, out zeros or a shared
    expert's output, y_w = ``(y.float() * w_sorted.reshape(-1, 1)).to(y.dtype)``.
  - Either without the weighting. The forms in detail: ``docs/passes.md``.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..ops.moe import MoECombineNode, MoEPermuteNode, can_combine
from ..options import Options
from . import ir, moe_indices, patterns, surgery
from .manager import Phase, RewritePass, declined

NAME = "moe_combine"


def rows_and_weights(value: fx.Node, permute: MoEPermuteNode) -> tuple[fx.Node, fx.Node | None]:
    """(y, the router weights [T, k]) where ``value`` is y times the permute's weights_sorted per row.
    Casts are read through. Else (value, None): value's rows are summed as they are."""
    weights_sorted = permute.output("weights_sorted")
    product = ir.strip_casts(value)
    c = ir.call(product)
    operands = ir.binary_operands(c) if c is not None and c.op == "mul" and weights_sorted is not None else None
    vt = ir.fake(value)
    for y, scale in (operands, operands[::-1]) if operands else ():
        y = ir.strip_casts(y)
        yt = ir.fake(y)
        rows = patterns.row_vector_of(scale, vt.shape[:-1])
        if rows is weights_sorted and yt is not None and tuple(yt.shape) == tuple(vt.shape):
            return y, permute.weights
    return value, None


def _summed_choices(gathered: fx.Node, tokens, k: int) -> fx.Node | None:
    """``gathered.view(T, k, H).sum(1)``, the gathered [T * k, H] rows' only use."""
    view = ir.only_user(gathered)
    vt = ir.fake(view)
    if not (ir.calls(view, "view") or ir.calls(view, "reshape", (torch.reshape,))) or vt is None or vt.dim() != 3:
        return None
    if not (moe_indices.same(vt.shape[0], tokens) and vt.shape[1] == k):
        return None
    total = ir.only_user(view)
    dim = ir.arg(total, 1, "dim") if ir.calls(total, "sum", (torch.sum,)) else None
    if dim not in (1, -2, [1], (1,)) or ir.arg(total, 2, "keepdim", False) or "dtype" in total.kwargs:
        return None
    return total


def _scatters_whole_rows(base, index, src, k: int) -> bool:
    return (
        len(base) == len(index) == len(src) == 2
        and moe_indices.same(base[0] * k, index[0])
        and moe_indices.same(index[0], src[0])
        and moe_indices.same(base[1], index[1])
        and moe_indices.same(index[1], src[1])
    )


def _zeros(node) -> bool:
    return ir.calls(node, "new_zeros", (torch.zeros_like, torch.zeros))


class MoECombinePass(RewritePass):
    """MoE unpermute and weighted top-k sum to `turbo_inductor.moe_combine`."""

    name = NAME
    phase = Phase.FUSE
    after = ("moe_permute",)

    def apply(self, graph: fx.Graph, options: Options) -> int:
        count = 0
        for node in list(graph.nodes):
            permute = MoEPermuteNode.of(node)
            if permute is not None:
                count += self._sums(graph, permute) + self._scatter_adds(graph, permute)
        return count

    def _combine(self, graph, before, y, weights, permute) -> fx.Node | None:
        if not can_combine(ir.fake(y), ir.fake(weights)):
            declined(self.name, before, "the op does not take these rows and weights")
            return None
        positions = permute.output("positions")
        return surgery.insert_view(graph, before, MoECombineNode, y=y, weights=weights, positions=positions).node

    def _sums(self, graph: fx.Graph, permute: MoEPermuteNode) -> int:
        """transformers: the weighted rows gathered by the inverse permutation, viewed [T, k, H] and summed."""
        positions = permute.output("positions")
        if positions is None:
            return 0
        tokens, k = ir.fake(positions).shape
        flats = [u for u in positions.users if moe_indices.flat_source(u) is positions]
        count = 0
        for gathered in [g for flat in flats for g in flat.users]:
            c = ir.call(gathered)
            total = _summed_choices(gathered, tokens, k) if c is not None and c.op == "getitem" else None
            if total is None or c.args[1] not in flats:
                continue
            y, weights = rows_and_weights(c.args[0], permute)
            dtype = ir.fake(y).dtype
            casts = [u for u in total.users if ir.is_op(u, "cast")]
            if ir.fake(total).dtype == dtype:
                replaced = [total]
            elif casts and len(casts) == len(total.users) and all(ir.call(u).kwargs["dtype"] == dtype for u in casts):
                replaced = casts
            else:
                declined(self.name, total, f"the sum is used in {ir.fake(total).dtype}, wider than the rows' {dtype}")
                continue
            combined = self._combine(graph, total, y, weights, permute)
            if combined is None:
                continue
            for value in replaced:
                value.replace_all_uses_with(combined)
            _erase(graph, [c.args[0], gathered, *gathered.users, total, *replaced], {y, permute.node})
            count += 1
        return count

    def _scatter_adds(self, graph: fx.Graph, permute: MoEPermuteNode) -> int:
        """torchtitan: the rows scatter-added onto zeros or a shared expert's output by their token index."""
        order, k = permute.output("order"), ir.fake(permute.indices).shape[1]
        token_indexes = [d for d in order.users if moe_indices.floordiv_by(d, order, k)] if order is not None else []
        count = 0
        for index in [e for d in token_indexes for e in moe_indices.expanded_rows(d)]:
            for scatter in list(index.users):
                if not ir.calls(scatter, "scatter_add", (torch.scatter_add,)) or ir.arg(scatter, 1, "dim") != 0:
                    continue
                base, src = ir.arg(scatter, 0, "input"), ir.arg(scatter, 3, "src")
                shapes = [ir.fake(v).shape for v in (base, index, src)]
                # base is [T, H]; index and src are [T * k, H]. Each row of base gets its token's k rows.
                if ir.arg(scatter, 2, "index") is not index or not _scatters_whole_rows(*shapes, k):
                    continue
                y, weights = rows_and_weights(src, permute)
                if ir.fake(y).dtype != ir.fake(scatter).dtype:
                    declined(self.name, scatter, f"rows in {ir.fake(y).dtype} added to {ir.fake(scatter).dtype}")
                    continue
                combined = self._combine(graph, scatter, y, weights, permute)
                if combined is None:
                    continue
                result = combined if _zeros(base) else surgery.insert_op(graph, scatter, operator.add, (base, combined))
                scatter.replace_all_uses_with(result)
                _erase(graph, [base, src, scatter], {y, permute.node})
                count += 1
        return count


def _erase(graph: fx.Graph, roots: list[fx.Node], stop: set) -> None:
    """Erase what the combine left dead: ``roots`` and what they were computed from, down to ``stop``."""
    position = {n: i for i, n in enumerate(graph.nodes)}  # the live nodes: an earlier site may have erased a root
    nodes = surgery.producers([r for r in roots if r in position], stop=stop)
    surgery.erase_unused(sorted(set(nodes), key=position.__getitem__))
