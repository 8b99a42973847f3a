"""FP8 linears reading one x (q/k/v, gate/up) -> one ``turbo_inductor.fp8_linear`` over their weights concatenated.

x and x^T are quantized once and one GEMM runs; each linear's output is a slice ``y[..., a:b]`` of its result.
The weights stay separate parameters: ``aten.cat`` joins them in the graph, and its backward splits dW.
Taken where the forward and dW are the separate linears' (``Recipe.concatenates_exactly``): no scale of W spans two
weights' rows. dx is not: one GEMM sums over the concatenated N, and the rowwise recipes' dgrad scales of dy and W^T
span it (``docs/fp8.md``).
``tensorwise`` is declined: one scale over the concatenated W differs from each linear's own. So is ``blockwise``
unless each N is a multiple of 128, and ``save_weight_t=False``, whose backward would keep the concatenated W: under
``"auto"`` the concatenated linear keeps W^T, which the separate ones do not.
Under autocast the linears' casts of one x count as one x. Why and how: ``docs/passes.md``.
"""

from __future__ import annotations

import collections
import operator

import torch
import torch.fx as fx

from ..ops.fp8_linear import FP8LinearNode
from ..options import Options
from ..recipes import FP8Config, Recipe
from . import fp8_option, ir, surgery
from .manager import Phase, RewritePass, declined

# Tensor methods returning a view of their input; ``view`` itself fails on a slice where it would merge the last dim.
_VIEW_METHODS = {"view", "view_as", "transpose", "permute", "unsqueeze", "squeeze", "t", "expand", "unflatten"}


def _agreeing(linear: FP8LinearNode) -> tuple:
    """What linears concatenated share: every argument but x and the weights, and whether they have a bias.
    K is x's width for each."""
    arguments = linear.arguments()
    rest = tuple((name, value) for name, value in arguments.items() if name not in ("x", "weight", "bias"))
    return (*rest, arguments["bias"] is None)


def _views_hold(node: fx.Node, value: torch.Tensor) -> bool:
    """Whether the chains of views reading ``node`` still run where it holds ``value``, a strided slice.
    ``y.view(-1)`` runs on a linear's own output, not on a slice of a wider one."""
    for user in node.users:
        if user.op == "call_method" and user.target in _VIEW_METHODS and user.args[0] is node:
            function = getattr(torch.Tensor, user.target)
        elif user.op == "call_function" and user.target is operator.getitem and user.args[0] is node:
            function = operator.getitem
        else:
            continue
        args, kwargs = fx.map_arg((user.args[1:], user.kwargs), ir.example_value)
        try:
            with value.fake_mode:
                out = function(value, *args, **kwargs)
        except (RuntimeError, ValueError):  # as the view would raise when AOTAutograd traces it
            return False
        if isinstance(out, torch.Tensor) and not _views_hold(user, out):
            return False
    return True


class FP8ConcatPass(RewritePass):
    """FP8 linears reading one x (q/k/v, gate/up) as one over their weights concatenated."""

    name = "fp8_concat"
    phase = Phase.CLAIM
    after = (fp8_option.NAME,)
    option_doc = (
        "FP8 linears reading one x (q/k/v, gate/up) as one FP8 linear over their weights concatenated: x "
        "quantized once, one GEMM. Where the forward and dW stay the separate linears': every recipe but `tensorwise`; "
        "`blockwise` where each N is a multiple of 128. dx is not bit-exact: the rowwise recipes scale dy per token "
        "across the concatenated outputs, so a projection whose gradient is far smaller than the others' loses "
        "precision. Runs with the `fp8` option. Details: `docs/fp8.md`."
    )

    def apply(self, graph: fx.Graph, options: Options) -> int:
        config: FP8Config = options.value(fp8_option.NAME)
        if not config.enabled:
            return 0
        readers = collections.defaultdict(list)
        for node in graph.nodes:
            linear = FP8LinearNode.of(node)
            if linear is not None and linear.x_q is None:
                readers[ir.under_cast(linear.x)].append(linear)
        count = 0
        for linears in readers.values():
            groups = collections.defaultdict(list)
            for linear in linears:
                groups[_agreeing(linear)].append(linear)
            for group in groups.values():
                if len(group) < 2:
                    if len(linears) > 1:
                        declined(self.name, group[0].node, "no other FP8 linear of x has its recipe and bias")
                    continue
                count += self._concatenate(graph, group, config)
        return count

    def _concatenate(self, graph: fx.Graph, group: list[FP8LinearNode], config: FP8Config) -> int:
        first = group[0]
        rows = [ir.fake(linear.weight).shape[0] for linear in group]
        if not Recipe.from_name(first.recipe).concatenates_exactly(rows):
            declined(self.name, first.node, f"{first.recipe} weights of N {rows}: a scale would span two weights")
            return 0
        # "auto" keeps W^T for a concatenated linear only: a byte per weight, where the backward would hold two.
        save_weight_t = config.saves_weight_t(concatenated=True)
        if not save_weight_t:
            declined(self.name, first.node, "save_weight_t=False: the backward would hold the concatenated W")
            return 0
        out = ir.fake(first.node)
        starts = [sum(rows[:i]) for i in range(len(rows))]
        with out.fake_mode:
            wide = out.new_empty((*out.shape[:-1], sum(rows)))
            slices = [wide[..., a : a + n] for a, n in zip(starts, rows, strict=True)]
        if not all(_views_hold(linear.node, piece) for linear, piece in zip(group, slices, strict=True)):
            declined(self.name, first.node, "a view of an output would not hold on a slice of the wider output")
            return 0
        operands = [v for linear in group for v in (linear.weight, linear.bias)]
        cannot = surgery.gather_before(first.node, operands, [ir.under_cast(first.x)[0], *(lin.x for lin in group)])
        if cannot:
            declined(self.name, first.node, cannot)
            return 0
        concatenated = {
            name: surgery.insert_op(
                graph, first.node, torch.ops.aten.cat.default, ([getattr(v, name) for v in group], 0)
            )
            for name in ("weight", "bias")
            if first.bias is not None or name == "weight"
        }
        arguments = first.arguments() | concatenated | {"save_weight_t": save_weight_t}
        fused = surgery.insert_view(graph, first.node, FP8LinearNode, **arguments)
        for linear, a, n in zip(group, starts, rows, strict=True):
            piece = surgery.insert_op(graph, first.node, operator.getitem, (fused.node, (Ellipsis, slice(a, a + n))))
            linear.node.replace_all_uses_with(piece)
        surgery.erase_unused(dict.fromkeys([v for linear in group for v in (linear.x, linear.node)]))
        return 1
