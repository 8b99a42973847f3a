"""FP8 recipes: how an FP8 linear quantizes each GEMM operand. One frozen ``Recipe`` per recipe name.

The ops take a recipe by name, a ``str`` in their schemas. ``Recipe.from_name`` gives its description.
``FP8Config`` is the backend's ``fp8`` option: a recipe and the linears it covers.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from .options import parse_bool


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How an FP8 linear quantizes its operands.

    Blocks are (rows, cols) of an operand [R, C], C contracted. 0 spans the whole dimension. What they are for the
    kernels (``kernel_block``), and the operands' formats per device: ``ops/fp8_operands.py``."""

    name: str
    activation_block: tuple[int, int]  # x, dy and their transposes
    weight_block: tuple[int, int]
    gradient_format: str  # "e4m3" or "e5m2"
    power_of_two: bool = False  # scales rounded up to powers of two
    high_precision_wgrad: bool = False  # dW = dy^T x in the input dtype
    # The forward GEMM accumulates in fast mode, as torchao's recipes do. dgrad and wgrad accumulate in full, but for
    # the experts' grouped GEMMs (ops/fp8_grouped_mm.py, FAST_ACCUM_DGRAD and FAST_ACCUM_WGRAD).
    fast_accum_forward: bool = False
    # What the option's "auto" may run instead where the cost table measured it faster: recipes with the same forward
    # and a backward at least as accurate.
    substitutes: tuple[str, ...] = ()

    @staticmethod
    def from_name(name: str) -> Recipe:
        if name not in RECIPES:
            raise ValueError(f"unknown FP8 recipe {name!r}; choose from {sorted(RECIPES)}")
        return RECIPES[name]

    @property
    def quantizes_x_in_rows(self) -> bool:
        """Whether x's blocks lie within a row. A producer writing whole rows (RMSNorm, GLU) can then quantize x.

        Tensorwise cannot: its scale needs the whole tensor's amax first."""
        return self.activation_block[0] == 1

    @property
    def weight_scales_transpose(self) -> bool:
        """Whether W^T's scales are W's transposed: blocks of the whole tensor, or square. Given the forward's
        scales, a backward then casts W^T from W in one pass, with no maxima (``FP8Config.saves_weight_t``)."""
        return self.weight_block[0] == self.weight_block[1]

    def concatenates_exactly(self, rows: Sequence[int]) -> bool:
        """Whether FP8 linears of W_i [N_i, K] on one x compute what one linear of the W_i concatenated does.
        True where no scale of W spans rows of two W_i: the forward and dW are then the same. Tensorwise's one
        scale would. dx differs: it quantizes dy and W^T along the concatenated N (rowwise: across all N_i)."""
        block = self.weight_block[0]
        return block > 0 and all(n % block == 0 for n in rows)


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe("tensorwise", (0, 0), (0, 0), "e5m2", fast_accum_forward=True),
        Recipe("rowwise", (1, 0), (1, 0), "e4m3", fast_accum_forward=True, substitutes=("rowwise_with_gw_hp",)),
        # torchao's "rowwise"
        Recipe("rowwise_pow2", (1, 0), (1, 0), "e4m3", power_of_two=True, fast_accum_forward=True),
        # torchao's recipe of that name
        Recipe("rowwise_with_gw_hp", (1, 0), (1, 0), "e4m3", high_precision_wgrad=True, fast_accum_forward=True),
        Recipe("blockwise", (1, 128), (128, 128), "e4m3"),
        Recipe("mxfp8", (1, 32), (1, 32), "e4m3", power_of_two=True),
    )
}
ROW_RECIPES = tuple(name for name, r in RECIPES.items() if r.quantizes_x_in_rows)


OFF = "off"


AUTO = "auto"


@dataclasses.dataclass(frozen=True)
class FP8Config:
    """The ``fp8`` option: linears become FP8 linears of ``recipe``.

    Parameters matching ``exclude`` and linears narrower than ``min_size`` stay as they are. ``linears`` and
    ``experts`` (MoE experts' grouped GEMMs): True, False, or ``"auto"``: FP8 where the device's cost table says it
    wins (``turbo_inductor.costs``). ``save_weight_t``: whether the forward keeps W^T in FP8 for the backward, or
    the backward quantizes it again (FSDP2); ``"auto"``: :meth:`saves_weight_t`."""

    recipe: str = OFF
    exclude: str = ""
    min_size: int = 0
    save_weight_t: bool | str = AUTO
    experts: bool | str = AUTO
    linears: bool | str = AUTO

    @property
    def enabled(self) -> bool:
        return self.recipe != OFF

    def saves_weight_t(self, experts: bool = False, concatenated: bool = False) -> bool:
        """Whether FP8 GEMMs keep W^T from the forward. ``"auto"``: a linear keeps none, its backward
        quantizing W^T from W again (by the forward's scales where they are W^T's, else with a second read of W), for
        1-2% of a step against up to a tenth of its peak memory. Linears that ``fp8_concat`` joins (``concatenated``)
        keep theirs, whose backward would otherwise hold the concatenated W; so do MoE experts, whose W^T is measured
        only kept (``docs/fp8.md``, "W^T for the backward")."""
        if self.save_weight_t != AUTO:
            return self.save_weight_t
        return experts or concatenated

    @staticmethod
    def from_option(value: Any) -> FP8Config:
        if value in (None, False, OFF, "", "0", "false"):
            return FP8Config()
        fields = dict(value) if isinstance(value, dict) else {"recipe": value}
        unknown = set(fields) - {f.name for f in dataclasses.fields(FP8Config)}
        if unknown or fields.get("recipe") not in RECIPES:
            raise ValueError(
                f"primus_turbo: option 'fp8' takes one of {sorted(RECIPES)} or 'off', or a dict with keys "
                f"recipe/exclude/min_size/save_weight_t/experts/linears; got {value!r}"
            )
        re.compile(fields.get("exclude", ""))
        return FP8Config(
            fields["recipe"],
            fields.get("exclude", ""),
            int(fields.get("min_size", 0)),
            _bool_or_auto("fp8.save_weight_t", fields.get("save_weight_t", AUTO)),
            _bool_or_auto("fp8.experts", fields.get("experts", AUTO)),
            _bool_or_auto("fp8.linears", fields.get("linears", AUTO)),
        )


def _bool_or_auto(key: str, value: Any) -> bool | str:
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO
    try:
        return parse_bool(key, value)
    except ValueError:
        raise ValueError(f"primus_turbo: option {key!r} takes true, false or 'auto', got {value!r}") from None
