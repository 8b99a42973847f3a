"""What every op module shares: the ``turbo_inductor`` library, op definitions and input checks.

Why kernel ops are traced into compiled graphs, and why public ops are composites: ``docs/ops.md``.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
from collections.abc import Callable

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode

from ..kernels import registry

NAMESPACE = "turbo_inductor"
LIB = torch.library.Library(NAMESPACE, "FRAGMENT")

SUPPORTED_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def kernel_op(name: str, kernels: tuple[str, ...], symbolic_sizes: bool = True, fake: bool = False) -> Callable:
    """Decorator: ``turbo_inductor::<name>``, a functional custom op whose body calls ``kernels`` (registry names).

    The body takes an ``impl`` argument. In a compiled graph it is traced in where every chosen implementation
    is traceable; otherwise the op stays one call. ``symbolic_sizes=False``: it stays one call under symbolic
    sizes. Why and when: ``docs/ops.md``, "Kernel ops traced into compiled graphs".
    ``fake=True``: the body runs on fake tensors too, allocating its outputs; it is the op's fake."""

    def define(body: Callable) -> torch.library.CustomOpDef:
        op = torch.library.custom_op(f"{NAMESPACE}::{name}", _returning_no_views(body), mutates_args=())
        signature = inspect.signature(body)

        def trace_into_graph(mode, func, types, args, kwargs):
            if any(not issubclass(t, (FakeTensor, FunctionalTensor)) and t is not torch.Tensor for t in types):
                return NotImplemented  # another tensor subclass: let it handle the op first
            bound = signature.bind(*args, **kwargs)
            device = next(v.device for v in bound.arguments.values() if isinstance(v, torch.Tensor))
            impl = bound.arguments.get("impl", registry.AUTO)
            symbolic = not symbolic_sizes and any(
                isinstance(size, torch.SymInt)
                for v in bound.arguments.values()
                if isinstance(v, torch.Tensor)
                for size in v.shape
            )
            # A Triton launch takes no symbolic float, so the op stays one call. Dynamo then specializes the float.
            symbolic = symbolic or any(isinstance(v, torch.SymFloat) for v in bound.arguments.values())
            if symbolic or _KEEP_WHOLE.get() or not all(registry.traceable(kernel, device, impl) for kernel in kernels):
                return mode.__torch_dispatch__(func, types, args, kwargs)
            with mode, registry.tracing():
                return body(*args, **kwargs)

        op.register_torch_dispatch(FunctionalTensorMode, trace_into_graph)
        if fake:
            op.register_fake(body)
        return op

    return define


def _returning_no_views(body: Callable) -> Callable:
    """``body`` whose results are never views: autograd forbids writing a custom op's view output in place
    (``dist.all_reduce(y)`` after a linear). Kernels' results are often viewed to x's shape; detaching keeps the
    storage and drops the view."""

    def no_view(t):
        return t.detach() if isinstance(t, torch.Tensor) and t._is_view() else t

    @functools.wraps(body)
    def run(*args, **kwargs):
        out = body(*args, **kwargs)
        return tuple(map(no_view, out)) if isinstance(out, (tuple, list)) else no_view(out)

    run.__signature__ = inspect.signature(body, eval_str=True)  # the schema is inferred from it
    return run


_KEEP_WHOLE = contextvars.ContextVar("turbo_inductor_keep_whole", default=False)


@contextlib.contextmanager
def kept_whole():
    """Kernel ops called inside stay one node each in a traced graph, not their kernels' nodes.

    Inductor's constant folding can run such a node; it skips Triton kernel nodes."""
    token = _KEEP_WHOLE.set(True)
    try:
        yield
    finally:
        _KEEP_WHOLE.reset(token)


def composite_op(name: str, schema: str | None = None) -> Callable[[Callable], torch._ops.OpOverload]:
    """Decorator: ``turbo_inductor::<name>``, a public op that is its body for every dispatch key, autograd included.

    It decomposes into the kernel ops its body calls (``docs/ops.md``). Its schema is the body's signature, as a
    kernel op's is; ``schema`` (``"(...) -> ..."``) spells it where a signature cannot: ``infer_schema`` makes every
    ``int`` a ``SymInt``."""

    def define(body: Callable) -> torch._ops.OpOverload:
        LIB.define(name + (schema or torch.library.infer_schema(body, mutates_args=())))
        LIB.impl(name, body, "CompositeImplicitAutograd")
        return getattr(getattr(torch.ops, NAMESPACE), name).default

    return define


class OpInputError(ValueError):
    """Raised for input an op cannot take; the message names the op and the problem."""


def check(condition: bool, op: str, message: Callable[[], str]) -> None:
    """Raise OpInputError naming ``op`` unless ``condition``.

    ``message`` is built only on failure: ops check on every call."""
    if not condition:
        raise OpInputError(f"turbo_inductor.{op}: {message()}")


def check_float(op: str, name: str, t: torch.Tensor) -> None:
    check(isinstance(t, torch.Tensor), op, lambda: f"{name} must be a Tensor, got {type(t).__name__}")
    check(
        t.dtype in SUPPORTED_FLOAT_DTYPES,
        op,
        lambda: f"{name} has dtype {t.dtype}; supported: float32, bfloat16, float16",
    )


def check_same_device(op: str, **tensors: torch.Tensor | None) -> None:
    devices = [t.device for t in tensors.values() if t is not None]
    check(
        all(d == devices[0] for d in devices),
        op,
        lambda: (
            "tensors on different devices: "
            + ", ".join(f"{name} on {t.device}" for name, t in tensors.items() if t is not None)
        ),
    )


def check_linear(
    op: str,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    weight_name: str = "weight",
    weight_dtype: torch.dtype | None = None,
) -> None:
    """Check the operands of ``F.linear(x, weight, bias)``: weight [N, K], bias [N], K = x.shape[-1].

    weight is in ``weight_dtype`` (default: x's; an FP8 W differs); bias is in x's dtype."""
    check_float(op, "x", x)
    dtype = weight_dtype or x.dtype
    check(
        isinstance(weight, torch.Tensor)
        and weight.dim() == 2
        and weight.dtype == dtype
        and x.dim() >= 1
        and weight.shape[1] == x.shape[-1],
        op,
        lambda: (
            f"{weight_name} must be [N, K] in {dtype} with K = x.shape[-1]; got {weight_name} "
            f"{list(weight.shape)} {weight.dtype}, x {list(x.shape)} {x.dtype}"
        ),
    )
    if bias is not None:
        check(
            bias.shape == (weight.shape[0],) and bias.dtype == x.dtype,
            op,
            lambda: f"bias must be [{weight.shape[0]}] of x's dtype, got {list(bias.shape)} {bias.dtype}",
        )
    check_same_device(op, x=x, **{weight_name: weight}, bias=bias)


def register_linear_autograd(
    op,
    backward_op,
    keeps_x: Callable[[object, torch.Tensor], bool] = lambda arg, weight: True,
    saves: Callable[[tuple, tuple], tuple] = lambda inputs, saved: saved,
    keeps_weight: Callable[[tuple], bool] = lambda inputs: True,
    passes_weight_dtype: bool = False,
) -> None:
    """Autograd of ``op(x, weight, bias, arg, impl, *rest)``, which returns y or ``(y, *saved)``.

    ``backward_op(dy, x, weight, *saved, arg, impl)`` returns ``(dx, dweight[, dbias])``; dbias defaults to dy's
    row sum. It gets x None where ``keeps_x(arg, weight)`` is False, and weight None where ``keeps_weight(inputs)``
    is: a W computed in the graph (a concatenation) is then not held for the backward. With ``passes_weight_dtype``
    it also gets W's dtype, last, which dW is to have. ``arg`` is a recipe or group name. ``saves(inputs, saved)``
    may put inputs in place of saved outputs. ``saved`` and ``rest`` get no gradient. A gradient no input wants is
    None."""

    def setup(ctx, inputs, output):
        x, weight, bias, arg, impl, *rest = inputs
        ctx.n_rest = len(rest)
        returned = tuple(output[1:]) if isinstance(output, (tuple, list)) else ()
        saved = saves(inputs, returned)
        ctx.save_for_backward(x if keeps_x(arg, weight) else None, weight if keeps_weight(inputs) else None, *saved)
        ctx.mark_non_differentiable(*returned)
        # y is the one output with a gradient: the saved ones (W^T in FP8) are not zero-filled for the backward.
        ctx.set_materialize_grads(False)
        ctx.arg, ctx.impl, ctx.has_bias = arg, impl, bias is not None
        ctx.weight_dtype = (weight.dtype,) if passes_weight_dtype else ()

    def backward(ctx, dy, *_saved_grads):
        x, weight, *saved = ctx.saved_tensors
        dx, dweight, *dbias = backward_op(dy, x, weight, *saved, ctx.arg, ctx.impl, *ctx.weight_dtype)
        wants_dx, wants_dweight, wants_dbias = ctx.needs_input_grad[:3]
        if wants_dbias and not dbias:
            dbias = [dy.reshape(-1, dy.shape[-1]).sum(0, dtype=torch.float32).to(dy.dtype)]
        return (
            dx if wants_dx else None,
            dweight if wants_dweight else None,
            dbias[0] if wants_dbias else None,
            None,
            None,
            *([None] * ctx.n_rest),
        )

    op.register_autograd(backward, setup_context=setup)


# ---- the layouts row-wise kernels take ------------------------------------------------------------------------


def rows_view(t: torch.Tensor) -> torch.Tensor:
    """Non-empty ``t`` as a contiguous [rows, last dim] matrix: the layout every row-wise kernel takes."""
    return t.contiguous().view(-1, t.shape[-1])


def unit_stride_rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as [rows, last dim] with unit column stride: a view where strides allow. Halves of one tensor stay
    views."""
    rows = t.reshape(-1, t.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def flat_or_none(t: torch.Tensor | None) -> torch.Tensor | None:
    """None, or ``t`` as a contiguous 1-D tensor: one value per row."""
    return None if t is None else t.reshape(-1).contiguous()


def contiguous_or_none(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.contiguous()
