"""turbo_inductor: the "primus_turbo" torch.compile backend. It routes LLM building blocks onto fused kernels.

model = torch.compile(model, backend="primus_turbo")          # no import needed
turbo_inductor.ops.rmsnorm(x, weight, eps=1e-6)               # the ops, callable directly
turbo_inductor.rewrite_counts()                               # fused sites per pass in the compiled graphs
turbo_inductor.compile_records()[-1].implementations          # the implementations each kernel of a graph uses
turbo_inductor.kernel_calls()                                 # kernel calls per implementation (not traced ones)
"""

from . import ops
from .checkpointing import trace_checkpointed_layers
from .kernels.registry import kernel_calls, reset_kernel_calls
from .kernels.triton import default_to_static_launch
from .passes import compile_records, reset_records, rewrite_counts

default_to_static_launch()  # before Inductor's compile workers start: docs/kernels.md, "Launchers"
trace_checkpointed_layers()  # before Dynamo traces a checkpointed layer: docs/passes.md, "Activation checkpointing"

__version__ = "0.1.0"
__all__ = ["ops", "compile_records", "rewrite_counts", "reset_records", "kernel_calls", "reset_kernel_calls"]
