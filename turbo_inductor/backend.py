"""``torch.compile(model, backend="primus_turbo")``: Inductor with our rewrites in front.

Registered through the ``torch_dynamo_backends`` entry point (setup.py), so no import is needed. The backend keeps
AOTAutograd and Inductor: it wraps ``compile_fx`` and hands it our pass manager as the pre-grad custom pass, which
sees the graph Dynamo captured before AOTAutograd. The ops the passes insert carry registered autograd, so the
fused kernels run in the forward and in the backward. A graph with nothing to fuse compiles exactly as with
backend="inductor".
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch._inductor import config as inductor_config
from torch._inductor.compile_fx import compile_fx

from . import ops as _ops  # noqa: F401  (registers the ops)
from .options import Options
from .passes import PASSES, PassManager
from .passes.manager import forget


def primus_turbo(gm: torch.fx.GraphModule, example_inputs: list[Any], options: Mapping[str, Any] | None = None):
    parsed = Options.parse(options, PASSES)
    patches = dict(parsed.inductor)
    if patches.get("freezing") and not inductor_config.freezing:
        # Dynamo chose which parameters become constants before this call, reading the global config alone: the
        # option would freeze nothing (backend="inductor" alike), and the FP8 linears would quantize W at each call.
        warnings.warn(
            "primus_turbo: options={'freezing': True} freezes no parameter; set "
            "torch._inductor.config.freezing = True before compiling",
            stacklevel=2,
        )
    manager = patches["pre_grad_custom_pass"] = PassManager(PASSES, parsed)
    if hasattr(inductor_config, "pre_grad_pass_timing"):
        # Run the passes before the cache lookup (torch >= 2.12 would otherwise run a pass that has a uuid only on a
        # miss): every compile then reports its rewrites, and the cache key covers the rewritten graph.
        patches["pre_grad_pass_timing"] = "early"
    # Our uuid (sources, options) tags the cache key itself: with the passes run early, Inductor keys on the rewritten
    # graph alone, which names our ops but not what they do, and a new version of an op met an old version's
    # compiled graph calling it with the old arguments.
    tag = f"{torch.compiler.config.cache_key_tag}primus_turbo-{manager.uuid()}"
    try:
        with torch.compiler.config.patch(cache_key_tag=tag):
            return compile_fx(gm, example_inputs, config_patches=patches)
    except BaseException:
        # Dynamo may abandon this compile and trace again (with dynamic=True, a float input that an op takes as a
        # float is specialized and the trace restarted): the record would count rewrites of a graph that never runs.
        forget(manager.record)
        raise
