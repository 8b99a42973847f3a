"""Attention under a materialized causal mask -> ``F.scaled_dot_product_attention(..., is_causal=True)``.

Matched: ``F.scaled_dot_product_attention(q, k, v, attn_mask=M)`` where M is computed in the graph from no graph
input (transformers builds it from ``arange``s and ``<=`` when it cannot skip it under torch.compile), and M's value
is the causal mask SDPA's ``is_causal`` means: ``kv_idx <= q_idx`` for every batch and head, as a bool mask, or as
an additive one of 0 and -inf (or the dtype's lowest, which softmax turns into the same zero). The rewrite is
exact. SDPA then runs a causal kernel (Flash, cuDNN) that skips the masked half instead of reading a mask over all
of it (``docs/passes.md``, "Causal masks"). Left alone: masks that read a graph input (padding, sizes that are
symbolic), any other mask (sliding windows, a query offset), and masks over ``MAX_ELEMENTS`` elements.
A checkpointed region (a layer under activation checkpointing) gets the mask as an input of its body: the pass on
the graph that computes it rewrites the body's attention too, and the body's input goes with its last use.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch._subclasses.fake_tensor import unset_fake_temporarily

from ..options import Options
from . import ir, surgery
from .manager import Phase, RewritePass, declined

# The mask is computed once at compile time, on its own device: a 16k x 16k mask is 256 MiB as bool.
MAX_ELEMENTS = 1 << 28

# What a constant mask may be computed with: pure functions of their arguments.
_PURE_FUNCTIONS = {
    torch.arange, torch.ones, torch.zeros, torch.full, torch.tril, torch.triu, torch.where, torch.logical_and,
    torch.logical_or, torch.logical_not, torch.bitwise_and, torch.bitwise_or, torch.eq, torch.ne, torch.le,
    torch.lt, torch.ge, torch.gt, torch.add, torch.sub, torch.mul, torch.remainder, torch.scalar_tensor,
    torch.diff, torch.cumsum,
    operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod, operator.neg, operator.invert,
    operator.and_, operator.or_, operator.xor, operator.eq, operator.ne, operator.le, operator.lt, operator.ge,
    operator.gt, operator.getitem,
}  # fmt: skip
_PURE_METHODS = {
    "expand", "expand_as", "view", "reshape", "unsqueeze", "squeeze", "to", "bool", "float", "type_as",
    "masked_fill", "logical_and", "logical_or", "logical_not", "eq", "ne", "le", "lt", "ge", "gt", "add", "sub",
    "mul", "tril", "triu", "__and__", "__or__", "__invert__", "__getitem__", "contiguous", "clone", "long", "int",
    "cumsum", "diff", "new_ones", "new_zeros", "new_full",
}  # fmt: skip
_SDPA_PARAMETERS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
# Higher-order ops whose body, a submodule, reads the op's operands as its placeholders, in order.
_REGIONS = (torch.ops.higher_order.tag_activation_checkpoint,)


class CausalMaskPass(RewritePass):
    """Attention under a causal mask built in the graph to SDPA's `is_causal`."""

    name = "causal_mask"
    phase = Phase.CANONICALIZE

    def apply(self, graph: fx.Graph, options: Options) -> int:
        verdicts: dict[fx.Node, str] = {}  # one mask serves every layer: its value is computed and compared once

        def verdict(mask: fx.Node) -> str:
            if mask not in verdicts:
                verdicts[mask] = why_not_causal(mask)
            return verdicts[mask]

        count = self._rewrite(graph, verdict)
        for region in [n for n in graph.nodes if n.op == "call_function" and n.target in _REGIONS]:
            count += self._rewrite_region(region, verdict)
        masks = [mask for mask, reason in verdicts.items() if not reason and mask.graph is graph]
        if masks:
            surgery.erase_unused(surgery.producers(masks, set()))
        return count

    def _rewrite(self, graph: fx.Graph, verdict, inputs: dict | None = None) -> int:
        """Rewrites ``graph``'s attention calls under a causal mask. ``inputs`` maps a body's placeholders to the
        operands of the region that runs it; a mask read through one is judged as that operand."""
        count = 0
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target is not F.scaled_dot_product_attention:
                continue
            arguments = dict(zip(_SDPA_PARAMETERS, node.args)) | dict(node.kwargs)
            mask = arguments.get("attn_mask")
            if not isinstance(mask, fx.Node) or arguments.get("is_causal", False):
                continue
            outer = (inputs or {}).get(mask, mask)
            reason = verdict(outer) if isinstance(outer, fx.Node) else "the mask is a constant"
            reason = reason or why_not_for(ir.fake(mask), ir.fake(arguments["query"]), ir.fake(arguments["key"]))
            if reason:
                declined(self.name, node, reason)
                continue
            query, key, value = (arguments.pop(name) for name in _SDPA_PARAMETERS[:3])
            del arguments["attn_mask"]
            node.args, node.kwargs = (query, key, value), arguments | {"is_causal": True}
            count += 1
        return count

    def _rewrite_region(self, region: fx.Node, verdict) -> int:
        """The attention in the body of ``region`` (a checkpointed layer) under a mask its operands pass in; each
        placeholder left unread leaves the body with its operand."""
        body_attr, *operands = region.args
        body = getattr(region.graph.owning_module, body_attr.target, None) if body_attr.op == "get_attr" else None
        if not isinstance(body, fx.GraphModule):
            return 0
        placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(operands):
            return 0
        count = self._rewrite(body.graph, verdict, dict(zip(placeholders, operands)))
        if count:
            unread = {i for i, p in enumerate(placeholders) if not p.users and isinstance(operands[i], fx.Node)}
            for i in unread:
                body.graph.erase_node(placeholders[i])
            region.args = (body_attr, *(o for i, o in enumerate(operands) if i not in unread))
            body.recompile()
        return count


def why_not_causal(mask: fx.Node) -> str:
    """Why ``mask`` is not SDPA's causal mask over its last two dims (computed now, when the graph computes it
    from no input), or "" when it is."""
    nodes = surgery.producers([mask], set())
    inside = set(nodes)
    if mask not in inside:  # as in a checkpointed layer's subgraph, which gets the mask from the outer graph
        return "the mask is a graph input"
    if any(not _pure(n) or any(a not in inside for a in n.all_input_nodes) for n in nodes):
        return "the mask reads a graph input or an op not known to be pure"
    fakes = [t for t in map(ir.fake, nodes) if t is not None]
    if ir.fake(mask) is None or ir.fake(mask).dim() < 2:
        return "the mask carries no shape of two or more dims"
    if any(not all(isinstance(d, int) for d in t.shape) for t in fakes):
        return "the mask's sizes are symbolic"
    # An expanded mask's broadcast dims take no memory.
    if max((t.numel() for t in fakes if 0 not in t.stride()), default=0) > MAX_ELEMENTS:
        return f"the mask has over {MAX_ELEMENTS} elements"
    values: dict[fx.Node, object] = {}
    with unset_fake_temporarily(), torch.no_grad():
        for node in nodes:
            args, kwargs = fx.map_arg((node.args, node.kwargs), values.__getitem__)
            if node.op == "call_method":
                values[node] = getattr(args[0], node.target)(*args[1:], **kwargs)
            else:
                values[node] = node.target(*args, **kwargs)
        value = values[mask]
        causal = torch.ones(value.shape[-2:], dtype=torch.bool, device=value.device).tril()
        if value.dtype == torch.bool:
            same = torch.equal(value, causal.expand_as(value))
        elif value.is_floating_point():
            allowed = (value == 0) == causal
            same = bool(allowed.all()) and bool((value[..., ~causal] <= torch.finfo(value.dtype).min).all())
        else:
            return f"a {value.dtype} mask"
    return "" if same else "the mask is not the causal one"


def why_not_for(mask: torch.Tensor, query: torch.Tensor | None, key: torch.Tensor | None) -> str:
    """Why causal ``mask`` (fake) is not SDPA's causal mask for this ``query`` and ``key``, or "" when it is."""
    if query is None or key is None:
        return "no shapes on the query or key"
    q_len, kv_len = query.shape[-2], key.shape[-2]
    if not isinstance(q_len, int) or not isinstance(kv_len, int):
        return "the query or key length is symbolic"
    if tuple(mask.shape[-2:]) != (q_len, kv_len):
        return "the mask does not span the query and key lengths"
    # SDPA raises on a mask that does not broadcast over the batch and heads; so must the graph still.
    leading = zip(reversed(mask.shape[:-2]), reversed(query.shape[:-2]))
    if mask.dim() > query.dim() or any(m_dim not in (1, q_dim) for m_dim, q_dim in leading if isinstance(q_dim, int)):
        return "the mask does not broadcast over the query's batch and heads"
    if mask.dtype != torch.bool and mask.dtype != query.dtype:
        return f"a {mask.dtype} mask for a {query.dtype} query"
    return ""


def _pure(node: fx.Node) -> bool:
    if node.op == "call_function":
        return node.target in _PURE_FUNCTIONS
    return node.op == "call_method" and node.target in _PURE_METHODS
