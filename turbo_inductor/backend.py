"""``torch.compile(model, backend="primus_turbo")``: Inductor with our rewrites in front.

The ``torch_dynamo_backends`` entry point (setup.py) registers it: no import is needed.
It calls ``compile_fx`` with our pass manager as the pre-grad custom pass. The passes see Dynamo's graph; those of
the POST_GRAD phase run as the post-grad custom pass, on AOTAutograd's forward and backward graphs.
Our ops carry registered autograd, so the fused kernels run forward and backward.
A graph with nothing to fuse compiles exactly as with backend="inductor".
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch._inductor import config as inductor_config
from torch._inductor.compile_fx import compile_fx

from . import ops as _ops  # noqa: F401  (registers the ops)
from . import ranks
from .checkpointing import warn_if_checkpointed_layers_ran_eagerly
from .kernels.triton import static_launch_config
from .options import Options
from .passes import PASSES, PassManager
from .passes.manager import forget, mark_hop_bodies


def primus_turbo(gm: torch.fx.GraphModule, example_inputs: list[Any], options: Mapping[str, Any] | None = None):
    parsed = Options.parse(options, PASSES)
    patches = dict(parsed.inductor)
    if patches.get("freezing") and not inductor_config.freezing:
        # Dynamo picks the constants before this call, from the global config alone: the option freezes nothing.
        # Why it matters to the FP8 linears: docs/ops.md, "Freezing".
        warnings.warn(
            "primus_turbo: options={'freezing': True} freezes no parameter; set "
            "torch._inductor.config.freezing = True before compiling",
            stacklevel=2,
        )
    manager = patches["pre_grad_custom_pass"] = PassManager(PASSES, parsed)
    # A user's own post-grad pass stays: ours then do not run.
    user_post_grad = patches.get("post_grad_custom_post_pass") or inductor_config.post_grad_custom_post_pass
    if manager.post_grad is not None and user_post_grad is None:
        patches["post_grad_custom_post_pass"] = manager.post_grad
    patches.update({key: True for key in static_launch_config() if key not in patches})
    if hasattr(inductor_config, "pre_grad_pass_timing"):
        # Run the passes before the cache lookup, not only on a miss (torch >= 2.12). Every compile then reports
        # its rewrites, and the cache key covers the rewritten graph.
        patches["pre_grad_pass_timing"] = "early"
    # Our uuid (sources, options) tags the cache key. The rewritten graph names our ops, not what they do.
    # Without the tag, a changed op could load a compiled graph calling it with old arguments.
    tag = f"{torch.compiler.config.cache_key_tag}primus_turbo-{manager.uuid()}"
    check_ranks = ranks.first_call_check(gm)  # before the passes fuse the all-reduces
    mark_hop_bodies(gm)
    try:
        with torch.compiler.config.patch(cache_key_tag=tag):
            compiled = compile_fx(gm, example_inputs, config_patches=patches)
    except BaseException:
        # Dynamo may abandon this compile and trace again, as when it specializes a float under dynamic=True.
        # The record would count rewrites of a graph that never runs.
        forget(manager.record)
        raise
    warn_if_checkpointed_layers_ran_eagerly()
    return check_ranks(compiled) if check_ranks is not None else compiled
