"""Shape patterns several passes match: the last dimension named or sliced, a 2-D transpose, a unit dim added,
one value per row."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from . import ir


def last_dim_only(dim: Any, ndim: int) -> bool:
    """``dim`` names exactly the last dimension (-1, ndim-1, [-1] or (ndim-1,))."""
    if isinstance(dim, (list, tuple)):
        if len(dim) != 1:
            return False
        dim = dim[0]
    return isinstance(dim, int) and not isinstance(dim, bool) and dim in (-1, ndim - 1)


def last_dim_slice(index, xt) -> tuple[int, int] | None:
    """(start, stop) when ``x[index]`` slices only the last dimension with step 1."""
    if not isinstance(index, tuple) or not index or not isinstance(index[-1], slice):
        return None
    leading = index[:-1]
    if leading and leading[0] is Ellipsis:
        leading = leading[1:]
    elif len(index) != xt.dim():
        return None
    if any(s != slice(None) for s in leading) or index[-1].step not in (None, 1):
        return None
    start, stop = index[-1].start or 0, index[-1].stop
    stop = xt.shape[-1] if stop is None else stop
    return (start, stop) if isinstance(start, int) and isinstance(stop, int) else None


def transpose_source(node) -> fx.Node | None:
    """W for ``W.t()``, ``W.T``, ``W.transpose(0, 1)`` (either order, or -1/-2) of a 2-D W."""
    if not isinstance(node, fx.Node) or not node.args or not isinstance(node.args[0], fx.Node):
        return None
    source, rest = node.args[0], tuple(node.args[1:])
    if node.op == "call_method":
        method = node.target
    elif node.target in (torch.t, torch.transpose):
        method = node.target.__name__
    elif node.target is getattr and rest in (("T",), ("mT",)):
        method, rest = "t", ()
    else:
        return None
    is_t = method == "t" and not rest
    is_swap = method == "transpose" and len(rest) == 2 and {d % 2 for d in rest if isinstance(d, int)} == {0, 1}
    st = ir.fake(source)
    return source if (is_t or is_swap) and st is not None and st.dim() == 2 else None


def adds_a_unit_dim(node) -> bool:
    """``t.unsqueeze(d)``, ``t[..., None]`` (full slices and None only) or ``t.view/reshape(...)``.
    The caller checks the shapes ([rows] -> [rows, 1]): then each form relabels t's elements alike."""
    if not isinstance(node, fx.Node) or not node.args or not isinstance(node.args[0], fx.Node):
        return False
    target = node.target
    if target in (torch.unsqueeze, torch.Tensor.unsqueeze, torch.reshape, torch.Tensor.view, torch.Tensor.reshape) or (
        node.op == "call_method" and target in ("unsqueeze", "view", "reshape")
    ):
        return True
    c = ir.call(node)
    index = c.args[1] if c is not None and c.op == "getitem" else None
    return (
        isinstance(index, tuple)
        and None in index
        and all(i is None or i is Ellipsis or i == slice(None) for i in index)
    )


def row_vector_of(scale: Any, rows_shape: tuple) -> fx.Node | None:
    """``p`` of shape ``rows_shape`` when ``scale`` is ``p[..., None]``, through dtype casts on either side.
    That is one value per row of a tensor of shape ``rows_shape + (width,)``."""
    st = ir.fake(scale)
    if st is None or tuple(st.shape) != tuple(rows_shape) + (1,):
        return None
    unsqueezed = ir.strip_casts(scale)
    if not adds_a_unit_dim(unsqueezed):
        return None
    p = ir.strip_casts(unsqueezed.args[0])
    pt = ir.fake(p)
    return p if pt is not None and tuple(pt.shape) == tuple(rows_shape) else None
