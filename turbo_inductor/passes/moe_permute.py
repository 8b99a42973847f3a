"""The router's choices ordered by expert -> ``turbo_inductor.moe_permute``: sort, gathers, offsets, inverse.

Anchored at ``torch.sort(ids)`` (transformers 5) or ``torch.argsort(ids, stable=True)`` (torchtitan), where
ids = ``torch.topk(scores, k)[1].reshape(-1)`` over E experts. Readers of the permutation perm become outputs:
  - ``x[perm // k]`` or ``torch.gather(x, 0, (perm // k).reshape(-1, 1).expand(-1, H))``: x_sorted.
  - ``weights.reshape(-1)[perm]``: weights_sorted.
  - ``inv[perm] = torch.arange(T * k)`` on ``inv = torch.empty_like(perm)``, or ``perm.argsort()``: positions.
  - Any other reader: order.
  - ``torch.cumsum(torch.histc(ids, bins=E, min=0, max=E - 1 or E), 0, dtype=torch.int32)``: offs.
Why these forms are equivalent: ``docs/passes.md``.
"""

from __future__ import annotations

import dataclasses
import operator

import torch
import torch.fx as fx

from ..ops.moe import MoEPermuteNode, can_permute
from ..options import Options
from . import ir, moe_indices, surgery
from .manager import Phase, RewritePass, declined

NAME = "moe_permute"


def _topk_indices(ids) -> tuple[fx.Node, int] | None:
    """(indices [T, k], E) when ``ids`` flattens a top-k's indices over the last dim (E) of a 2-D tensor."""
    indices = moe_indices.flat_source(ids)
    c = ir.call(indices)
    if c is None or c.op != "getitem" or c.args[1] != 1 or not ir.calls(c.args[0], "topk", (torch.topk,)):
        return None
    topk = c.args[0]
    scores = ir.fake(topk.args[0])
    dim = ir.arg(topk, 2, "dim", -1)
    if scores is None or scores.dim() != 2 or dim not in (-1, 1) or not isinstance(scores.shape[1], int):
        return None
    return indices, scores.shape[1]


def _sort_of(node: fx.Node) -> tuple[fx.Node, fx.Node | None, fx.Node] | None:
    """(perm, sorted values or None, ids) for an ascending sort / argsort of 1-D ids."""
    if ir.calls(node, "argsort", (torch.argsort,)):
        perm, values = node, None
    elif ir.calls(node, "sort", (torch.sort,)):
        items = {u.args[1]: u for u in node.users if ir.is_op(u, "getitem")}
        if 1 not in items or len(items) != len(node.users):
            return None
        perm, values = items[1], items.get(0)
    else:
        return None
    ids = ir.fake(node.args[0]) if node.args else None
    if (
        ids is None
        or ids.dim() != 1
        or ir.arg(node, 1, "dim", -1) not in (-1, 0)
        or ir.arg(node, 2, "descending", False)
    ):
        return None
    return perm, values, node.args[0]


def _gather_source(node, index) -> fx.Node | None:
    """x for ``x[index]`` or ``torch.gather(x, 0, index)`` with x 2-D."""
    c = ir.call(node)
    if c is not None and c.op == "getitem" and c.args[1] is index:
        source = c.args[0]
    elif (
        ir.calls(node, "gather", (torch.gather,)) and ir.arg(node, 1, "dim") == 0 and ir.arg(node, 2, "index") is index
    ):
        source = node.args[0]
    else:
        return None
    st = ir.fake(source)
    return source if st is not None and st.dim() == 2 and st.dtype.is_floating_point else None


@dataclasses.dataclass
class Site:
    """A routing site: the values the permute replaces, and the nodes that may go dead with them."""

    perm: fx.Node
    indices: fx.Node
    experts: int
    x: fx.Node | None = None
    x_gathers: list = dataclasses.field(default_factory=list)
    weights: fx.Node | None = None
    weights_gather: fx.Node | None = None
    # (a node holding the inverse permutation, the setitem that built it or None)
    inverse: list = dataclasses.field(default_factory=list)
    offs: list = dataclasses.field(default_factory=list)  # the cumsums
    matched: list = dataclasses.field(default_factory=list)  # everything that may go dead

    def find_gathers(self) -> None:
        k, tokens = ir.fake(self.indices).shape[1], ir.fake(self.indices).shape[0]
        for token_index in [d for d in self.perm.users if moe_indices.floordiv_by(d, self.perm, k)]:
            candidates = [(u, token_index) for u in token_index.users]
            candidates += [(g, e) for e in moe_indices.expanded_rows(token_index) for g in e.users]
            for gather, index in candidates:
                source = _gather_source(gather, index)
                if source is None or not moe_indices.same(ir.fake(source).shape[0], tokens):
                    continue
                if self.x is not None and source is not self.x:  # another tensor's rows: it keeps reading perm
                    continue
                self.x = source
                self.x_gathers.append(gather)
                self.matched += [token_index, *([index.args[0], index] if index is not token_index else []), gather]

    def find_weights(self) -> None:
        shape = ir.fake(self.indices).shape
        for gather in self.perm.users:
            c = ir.call(gather)
            if c is None or c.op != "getitem" or c.args[1] is not self.perm:
                continue
            weights = moe_indices.flat_source(c.args[0])
            wt = ir.fake(weights)
            if wt is not None and wt.dtype.is_floating_point and all(map(moe_indices.same, wt.shape, shape)):
                self.weights, self.weights_gather = weights, gather
                self.matched += [c.args[0], gather]
                return

    def find_inverse(self) -> None:
        for user in self.perm.users:
            if ir.calls(user, "argsort", (torch.argsort,)) and user.args == (self.perm,) and not user.kwargs:
                self.inverse.append((user, None))
                self.matched.append(user)
                continue
            if user.target is not operator.setitem or user.args[1] is not self.perm:
                continue
            inverse, values = user.args[0], user.args[2]
            writes = [u for u in inverse.users if u.target is operator.setitem]
            built = ir.calls(inverse, "empty_like", (torch.empty_like,)) and inverse.args == (self.perm,)
            if built and not inverse.kwargs and writes == [user] and _is_arange(values, ir.fake(self.perm).shape[0]):
                self.inverse.append((inverse, user))
                self.matched += [values, inverse, user]

    def find_offsets(self, ids_like: list[fx.Node]) -> None:
        for ids in ids_like:
            for histc in _users_through_casts(ids):
                if not _counts_experts(histc, self.experts):
                    continue
                cumsums = [c for c in histc.users if _int32_cumsum(c)]
                if cumsums:
                    self.offs += cumsums
                    self.matched += [ids, *_casts_between(ids, histc), histc, *cumsums]


def _is_arange(node, length) -> bool:
    """``torch.arange(length)`` (or from 0 with step 1; a symbolic length given as a node of its value)."""
    if not ir.calls(node, "", (torch.arange,)):
        return False
    bounds = [ir.example_value(v) for v in (node.args if len(node.args) > 1 else (0, *node.args))]
    return len(bounds) >= 2 and bounds[0] == 0 and bounds[2:] in ([], [1]) and moe_indices.same(bounds[1], length)


def _users_through_casts(node: fx.Node) -> list[fx.Node]:
    """Users of ``node`` and of its dtype casts (one level)."""
    users = list(node.users)
    return users + [u for c in users if ir.is_op(c, "cast") for u in c.users]


def _casts_between(ids: fx.Node, histc: fx.Node) -> list[fx.Node]:
    source = histc.args[0] if histc.args else histc.kwargs.get("input")
    return [source] if source is not ids else []


def _counts_experts(node, experts: int) -> bool:
    """``torch.histc(ids, bins=E, min=0, max=E - 1 or E)``."""
    if not ir.calls(node, "histc", (torch.histc,)):
        return False
    bins, low, high = (
        ir.arg(node, i, name, default) for i, name, default in ((1, "bins", 100), (2, "min", 0), (3, "max", 0))
    )
    return bins == experts and low == 0 and high in (experts - 1, experts)


def _int32_cumsum(node) -> bool:
    return (
        ir.calls(node, "cumsum", (torch.cumsum,))
        and ir.arg(node, 1, "dim") == 0
        and node.kwargs.get("dtype") == torch.int32
    )


class MoEPermutePass(RewritePass):
    """MoE routing (sort by expert, gathers, counts, inverse) to `turbo_inductor.moe_permute`."""

    name = NAME
    phase = Phase.FUSE

    def apply(self, graph: fx.Graph, options: Options) -> int:
        count, erased = 0, set()
        for node in list(graph.nodes):
            if node in erased:  # a routing site's node, erased with an earlier sort
                continue
            sort = _sort_of(node)
            if sort is None:
                continue
            perm, values, ids = sort
            routing = _topk_indices(ids)
            if routing is None:
                declined(self.name, node, "the sorted ids are not the flattened indices of a top-k over the experts")
                continue
            site = Site(perm, *routing)
            site.find_gathers()
            site.find_weights()
            site.find_inverse()
            flat_ids = [u for u in site.indices.users if moe_indices.flat_source(u) is site.indices]
            site.find_offsets(flat_ids + ([values] if values is not None else []))
            reason = self._rewrite(graph, node, site, values, options)
            if reason:
                declined(self.name, node, reason)
                continue
            position = {n: i for i, n in enumerate(graph.nodes)}
            matched = {*site.matched, perm, node, ids} | ({values} if values is not None else set())
            erased.update(surgery.erase_unused(sorted(matched, key=position.__getitem__)))
            count += 1
        return count

    def _rewrite(self, graph: fx.Graph, sort: fx.Node, site: Site, values: fx.Node | None, options: Options) -> str:
        """Insert the permute and redirect the site's readers to it; or say why not."""
        if not site.x_gathers:
            return "no gather of the tokens by the permutation (perm // k)"
        if not site.offs:
            return f"no offsets cumsum(histc(ids, bins={site.experts}, min=0, max={site.experts - 1}), int32)"
        fakes = [ir.fake(v) for v in (site.x, site.indices, site.weights)]
        if not can_permute(*fakes):
            return "the op does not take these tokens, indices and weights"
        position = {n: i for i, n in enumerate(graph.nodes)}
        before = min([sort, *site.matched], key=position.__getitem__)
        reads = (site.x, site.indices, site.weights)
        if not surgery.available_at(reads, before, position):
            return "the tokens or the router weights are computed after the routing starts"
        surgery.hoist(reads, before, position)
        permute = surgery.insert_view(
            graph,
            before,
            MoEPermuteNode,
            x=site.x,
            indices=site.indices,
            weights=site.weights,
            num_experts=site.experts,
            impl=options.impl,
        )
        for gather in site.x_gathers:
            gather.replace_all_uses_with(permute.output("x_sorted"))
        if site.weights_gather is not None:
            site.weights_gather.replace_all_uses_with(permute.output("weights_sorted"))
        if site.inverse:
            flat = surgery.insert_op(graph, before, torch.reshape, (permute.output("positions"), (-1,)))
            for inverse, built_by in site.inverse:
                inverse.replace_all_uses_with(flat, delete_user_cb=lambda user: user is not built_by)  # noqa: B023
        for cumsum in site.offs:
            cumsum.replace_all_uses_with(permute.output("offs"))
        site.perm.replace_all_uses_with(permute.output("order"))
        readers = [u for u in values.users if u not in site.matched] if values is not None else []
        if readers:  # the sorted ids read elsewhere (a cast for another histogram, say): gathered by the order
            first = min(readers, key=position.__getitem__)
            sorted_ids = surgery.insert_op(graph, first, operator.getitem, (sort.args[0], permute.output("order")))
            values.replace_all_uses_with(sorted_ids, delete_user_cb=lambda user: user not in site.matched)
        return ""
