"""Activation checkpointing under the backend: checkpointed layers traced, or a warning that says why not.

Dynamo traces ``torch.utils.checkpoint`` as one region and refuses a forward that mutates Python state inside it,
since a checkpoint's backward would replay the mutation. transformers' layers do (from 5.2x, a kernels-hub context
variable set and reset around each forward): every checkpointed layer then runs eagerly, without Inductor and
without our fusions. Dynamo traces them when it may skip that replay; for a set-and-reset nothing differs. Why and
what was measured: ``docs/passes.md``, "Activation checkpointing".
"""

from __future__ import annotations

import warnings

import torch

SKIP_REPLAY = "skip_fwd_side_effects_in_bwd_under_checkpoint"
_warned = False


def _is_side_effect_in_region(reason: str) -> bool:
    """Dynamo's graph breaks for Python state mutated inside a higher-order op's region ("HOP: Unsafe side effect",
    "HOP: Non-nullified side effect"): under checkpointing, what the flag lets it trace."""
    first = reason.splitlines()[0] if reason else ""
    return first.startswith("HOP:") and "side effect" in first


def trace_checkpointed_layers() -> None:
    """Let Dynamo trace checkpointed forwards that mutate Python state, unless the user set the flag themselves."""
    config = torch._dynamo.config
    if not hasattr(config, SKIP_REPLAY):
        return
    is_default = getattr(config, "_is_default", lambda name: getattr(config, name) is False)
    if is_default(SKIP_REPLAY):
        setattr(config, SKIP_REPLAY, True)


def warn_if_checkpointed_layers_ran_eagerly() -> None:
    """Once per process: a warning with the reason and the fix where Dynamo left a checkpointed region to eager.
    With the flag set, checkpointed regions take side effects: a region that still breaks on one is another
    higher-order op (an autograd.Function), which the flag cannot help."""
    global _warned
    if _warned or getattr(torch._dynamo.config, SKIP_REPLAY, True):
        return
    from torch._dynamo.utils import counters

    reasons = [reason for reason in counters["graph_break"] if _is_side_effect_in_region(reason)]
    if not reasons:
        return
    _warned = True
    warnings.warn(
        "primus_turbo: a region Dynamo traces as one op (a checkpointed layer, torch.utils.checkpoint) runs eagerly, "
        f"without Inductor or our fusions: {reasons[0].splitlines()[0]}. Fix, for a checkpointed layer: "
        f"torch._dynamo.config.{SKIP_REPLAY} = True (importing turbo_inductor sets it unless you set it), or a "
        "forward free of Python side effects",
        stacklevel=3,
    )
