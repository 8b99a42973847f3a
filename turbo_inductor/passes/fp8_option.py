"""The ``fp8`` option, which the FP8 linear, concat and experts passes read: its name, and the parameter names its
``exclude`` matches."""

from __future__ import annotations

import re

import torch.fx as fx

NAME = "fp8"


def parameter_name(node: fx.Node) -> str:
    """``layers.0.mlp.down_proj.weight`` for a placeholder Dynamo made from a module parameter, else ''."""
    # Dynamo records each graph input's source in its placeholder's meta, e.g.
    # L['self']._modules['layers']._modules['0']._parameters['weight'].
    grapharg = node.meta.get("grapharg") if node.op == "placeholder" else None
    source = getattr(grapharg, "source", None)
    if source is None:
        return ""
    name = source.name() if callable(source.name) else source.name  # a method in torch 2.11, a property later
    return ".".join(re.findall(r"_(?:modules|parameters|buffers)\['([^']+)'\]", name))
