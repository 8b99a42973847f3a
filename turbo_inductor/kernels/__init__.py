"""Kernels, one module per op family in each implementation folder; importing registers them."""
from . import registry
from .reference import rmsnorm as _reference_rmsnorm  # noqa: F401
from .triton import rmsnorm as _triton_rmsnorm  # noqa: F401
from .reference import glu as _reference_glu  # noqa: F401
from .triton import glu as _triton_glu  # noqa: F401
