"""The main job's columns, as data: eager, Inductor and primus_turbo (bf16, per FP8 recipe, per implementation, per
set of options), then the peers a user would pick instead where installed: torchao's float8 training (compiled by
Inductor, and by primus_turbo, which runs torchao's linears on its own fp8_linear), torchao's MoE training, and
Liger-Kernel's kernels in transformers' models (compiled by Inductor, and by primus_turbo: whether the two compose)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import json
import sys
from collections.abc import Callable

import torch

from turbo_inductor.testing import scaled_mm_takes_row_scales

# The FP8 recipes a GPU run measures unless --fp8 says otherwise: those with goals on every model (goals.py).
DEFAULT_FP8 = ("tensorwise", "rowwise")
# FP8 recipes torchao has under the same names (a torchao column is added for each one requested), and those whose
# torchao configs primus_turbo runs on its own fp8_linear (a column of the torchao model compiled by primus_turbo).
TORCHAO_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
TORCHAO_ON_OURS = ("tensorwise", "rowwise")
# The peer libraries whose columns a run adds where they are installed (run_model --peers).
PEERS = ("torchao", "liger")


@dataclasses.dataclass(frozen=True)
class Column:
    """A column: its name, the backend compiling it (``eager``: none), our backend's options, and for a peer's column
    how the peer converts the model (``convert(model, patches)``: what it patches outside the model lasts as long as
    the ``contextlib.ExitStack`` ``patches``), compiled then without options of ours. ``eager_on_failure``: where the
    compiled column fails it is measured eagerly, and says so."""

    name: str
    backend: str
    options: dict | None = None
    convert: Callable[[torch.nn.Module, contextlib.ExitStack], None] | None = None
    eager_on_failure: bool = False

    def prepare(self, model: torch.nn.Module, dynamic, patches: contextlib.ExitStack):
        """``model`` as this column runs it: converted for a peer, then compiled (eager: as it is)."""
        if self.convert is not None:
            self.convert(model, patches)
            return torch.compile(model, backend=self.backend, dynamic=dynamic)
        if self.backend == "eager":
            return model
        return torch.compile(model, backend=self.backend, options=self.options, dynamic=dynamic)


BASELINES = (Column("eager", "eager"), Column("inductor", "inductor"), Column("primus_turbo", "primus_turbo"))


def ours(recipes: list[str], impls: list[str], named: list[str]) -> list[Column]:
    """Our backend's columns beyond bf16: per FP8 recipe; per implementation forced (in bf16 and each recipe); per
    ``NAME=JSON`` set of options."""
    columns = [Column(f"primus_turbo fp8 {recipe}", "primus_turbo", {"fp8": recipe}) for recipe in recipes]
    for impl in impls:
        for recipe in ["", *recipes]:
            name = f"primus_turbo{f' fp8 {recipe}' if recipe else ''} impl={impl}"
            columns.append(Column(name, "primus_turbo", {"impl": impl, **({"fp8": recipe} if recipe else {})}))
    for column in named:
        name, _, options = column.partition("=")
        columns.append(Column(f"primus_turbo {name}", "primus_turbo", json.loads(options)))
    return columns


def torchao_recipes(recipes, device: str, known) -> list[str]:
    """Those of ``recipes`` (of ``known``) torchao runs on ``device``: none without torchao, and its rowwise ones
    only where ``torch._scaled_mm`` takes per-row scales."""
    if importlib.util.find_spec("torchao") is None:
        return []
    return [r for r in recipes if r in known and (r == "tensorwise" or scaled_mm_takes_row_scales(device))]


def torchao_float8(recipe: str, model: torch.nn.Module, patches: contextlib.ExitStack) -> None:
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe))


def torchao_moe(model: torch.nn.Module, patches: contextlib.ExitStack) -> None:
    """torchao's MoE training: its FP8 rowwise grouped GEMMs on the experts (the other linears stay bf16)."""
    from torchao.prototype.moe_training.config import Float8TrainingOpConfig
    from torchao.quantization import quantize_

    quantize_(model, Float8TrainingOpConfig(), filter_fn=lambda module, fqn: fqn.endswith("experts"))


def liger(model: torch.nn.Module, patches: contextlib.ExitStack) -> None:
    patches.enter_context(liger_applied(model.model))


def liger_patches(lm) -> bool:
    """Whether Liger-Kernel is installed and patches transformers models of ``lm``'s type; True where it fails to
    import, so that its column reports the failure."""
    if importlib.util.find_spec("liger_kernel") is None:
        return False
    try:
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except Exception:  # imported again when its column is built, which then reports the error
        return True
    return lm.config.model_type in MODEL_TYPE_TO_APPLY_LIGER_FN


@contextlib.contextmanager
def liger_applied(lm):
    """Liger-Kernel's kernels in transformers' model ``lm``, applied as its README applies them to a model already
    built (``_apply_liger_kernel_to_instance``), for the block. Liger also replaces the classes and the rotary function
    in the family's modeling module, which every other model of the family calls: the module is restored on leaving."""
    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    module = vars(sys.modules[type(lm).__module__])
    saved = dict(module)
    try:
        _apply_liger_kernel_to_instance(model=lm)
        yield
    finally:
        for added in module.keys() - saved.keys():
            del module[added]
        module.update(saved)


def torchao_columns(recipes: list[str], device: str, moe: bool) -> list[Column]:
    """torchao's float8 training per recipe it has, compiled by Inductor (the peer), then the same model compiled by
    primus_turbo; for an MoE decoder, torchao's MoE training instead (its compile fails on Hopper, ao#4048: measured
    eagerly then, as the column says)."""
    if importlib.util.find_spec("torchao") is not None and moe:
        return [Column("torchao moe fp8 rowwise", "inductor", convert=torchao_moe, eager_on_failure=True)]
    if moe:
        return []
    return [
        Column(f"torchao fp8 {recipe}", "inductor", convert=functools.partial(torchao_float8, recipe))
        for recipe in torchao_recipes(recipes, device, TORCHAO_RECIPES)
    ] + [
        Column(
            f"torchao fp8 {recipe} on primus_turbo", "primus_turbo", convert=functools.partial(torchao_float8, recipe)
        )
        for recipe in torchao_recipes(recipes, device, TORCHAO_ON_OURS)
    ]


def liger_columns(base: torch.nn.Module, hf_model: bool) -> list[Column]:
    """Liger-Kernel's Triton kernels patched into transformers' model (the kernel library a user would pick instead),
    compiled by Inductor and by primus_turbo."""
    if not (hf_model and liger_patches(base.model)):
        return []
    return [Column("liger", "inductor", convert=liger), Column("liger on primus_turbo", "primus_turbo", convert=liger)]


def for_run(args, work, device: str) -> list[Column]:
    """Every column of a run on ``work`` (a ``models.Workload``), in the table's order."""
    recipes = [recipe for recipe in args.fp8.split(",") if recipe]
    impls = [impl for impl in args.impl.split(",") if impl]
    peers = args.peers.split(",")
    return [
        *BASELINES,
        *ours(recipes, impls, args.column),
        *(torchao_columns(recipes, device, work.moe) if "torchao" in peers else []),
        *(liger_columns(work.base, work.hf) if "liger" in peers else []),
    ]
