"""Which pass takes a linear. The claim-phase passes that replace whole linears register what they want here and
take a linear only when ``owner`` names them, so that they agree without asking each other."""

from __future__ import annotations

from collections.abc import Callable

from ..options import Options
from .matcher import Linear

Wants = Callable[[Linear, Options], bool]
_CLAIMANTS: dict[str, tuple[int, Wants]] = {}


def claimant(name: str, priority: int) -> Callable[[Wants], Wants]:
    """Decorator: pass ``name`` wants the linears for which the function is true (under the options given, which
    also say whether the pass is on). Where several want one, the highest priority takes it."""

    def register(wants: Wants) -> Wants:
        _CLAIMANTS[name] = (priority, wants)
        return wants

    return register


def owner(linear: Linear, options: Options) -> str | None:
    """The name of the pass that takes ``linear``, or None."""
    wanting = [(priority, name) for name, (priority, wants) in _CLAIMANTS.items() if wants(linear, options)]
    return max(wanting)[1] if wanting else None
