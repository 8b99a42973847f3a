"""The fuzzer's driver: an example is a chain of random blocks (``blocks/``, one module per family), determined by its
seed; :func:`check` captures its Dynamo graph, rewrites it and runs it before and after, asserting what its blocks
expect.

An example's settings, blocks, weights and inputs are all on CPU. :func:`check` runs the passes on the graph in
strict mode, and runs the graph before and after eagerly. It asserts the rewrite counts, our ops left in the graph,
the kernels run forward and backward, and the outputs and gradients of the graph before: at the dtype's gate (in
bf16 or fp16, else no farther from a float64 run than the graph before), or at the FP8 gates where anything computes
in FP8.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import math
import random

import torch
import torch.nn as nn

import turbo_inductor
from lowering_tests.fuzz.blocks import KINDS
from lowering_tests.fuzz.blocks.base import E4M3_MAX, MAX_ROWS, Block, Expect, Setting
from lowering_tests.fuzz.blocks.moe import WHOLE_ROW_RECIPES
from turbo_inductor.passes import PASSES
from turbo_inductor.recipes import RECIPES, ROW_RECIPES
from turbo_inductor.testing.graph import capture, evaluate, rewrite
from turbo_inductor.testing.tolerance import TOLERANCE, snr_db

OUTPUT_GATE_DB, GRADIENT_GATE_DB = 25.0, 20.0  # FP8 gates (shared/targets.md)
# The same GEMMs' FP8 noise on inputs rounded elsewhere is another draw of it. Over the few values of a small
# gradient (a router's or an expert's, from 3 tokens) draws differ by up to 4.2 dB; on six other inputs, the same
# model puts the fused and the FP8-GEMMs-alone runs within 1.1 dB either way.
IDEAL_MARGIN_DB = 4.5
# The FP8 gate is lowered no further, however ill-conditioned the result: a rewrite computing something else falls
# below it (a dropped norm weight of N(1, 0.5): 7 dB). The least result accepted over 1,262 FP8 examples, 312 of them
# 2-expert MoEs on 1-3 tokens, was 17.4 dB: torchao's FP8 against ours, a linear's weight gradient from 3 tokens.
GATE_FLOOR_DB = 12.0
# The passes that make the FP8 GEMMs of the ``fp8`` option, and what they read (grouped_mm's canonical op).
FP8_GEMM_PASSES = ("grouped_mm", "fp8", "fp8_concat", "fp8_experts")
# The recipes that concatenate the weights of FP8 linears reading one x at every width drawn (fp8_concat).
CONCAT_RECIPES = tuple(name for name, recipe in RECIPES.items() if recipe.concatenates_exactly([16]))


# The kernels each of our ops runs (forward, backward), by kernel name.
OP_KERNELS = {
    "rmsnorm": ({"rmsnorm_fwd"}, {"rmsnorm_bwd"}),
    "rmsnorm_residual": ({"rmsnorm_fwd"}, {"rmsnorm_bwd"}),
    "rmsnorm_fp8": ({"rmsnorm_fwd_fp8"}, {"rmsnorm_bwd"}),
    "glu": ({"glu_fwd"}, {"glu_bwd"}),
    "glu_fused": ({"glu_fwd"}, {"glu_bwd"}),
    "glu_fp8": ({"glu_fwd_fp8"}, {"glu_bwd"}),
    "fp8_linear": ({"fp8_quantize", "fp8_gemm"}, {"fp8_quantize", "fp8_gemm"}),
    "fp8_shared_input": ({"fp8_quantize"}, set()),
    "gemm_allreduce": ({"gemm_allreduce_fwd"}, {"gemm_allreduce_bwd"}),
    "linear_dgrad_allreduce": (set(), {"gemm_allreduce_fwd"}),  # the forward is a plain GEMM
    "grouped_mm": ({"grouped_gemm"}, {"grouped_gemm", "grouped_gemm_wgrad"}),
    "fp8_grouped_mm": ({"fp8_quantize", "fp8_grouped_gemm"}, {"fp8_grouped_gemm"}),  # dW's kernel: by recipe
    "moe_permute": ({"moe_route", "moe_dispatch"}, {"moe_gather_sum"}),
    # dx: the FP8 grouped GEMMs reading its positions gather-sum their rows' gradients per token
    "moe_permute_fp8": ({"moe_route", "moe_dispatch_fp8"}, {"moe_gather_sum"}),
    "moe_combine": ({"moe_gather_sum"}, {"moe_dispatch"}),
    "rotary": ({"rotary"}, {"rotary"}),
    "embedding": ({"embedding_fwd"}, {"embedding_bwd"}),
    "cross_entropy": ({"cross_entropy_fwd"}, {"cross_entropy_bwd"}),
}
# Example i leads with LEADS[i % len(LEADS)]: (block kind, the fp8 option, its arguments). The fp8 option: "row"
# a recipe whose producers fuse, "whole_row" one whose scales also span the row (an MoE permute moves x in FP8),
# "concat" one that also concatenates linears reading one x, "shared" one whose linears on one x stay separate (they
# share its quantization), "any" any recipe, "off" none, None drawn. Any len(LEADS) consecutive seeds take every
# block kind and fire every pass.
LEADS = (
    ("norm", None, {}),
    ("residual_norm", None, {"residual": True}),
    ("glu", None, {}),
    ("glu", "row", {"down": "direct"}),  # glu_fp8
    ("norm_linears", "concat", {"plain": True, "concatenated": True}),  # rmsnorm_fp8, fp8_concat
    ("norm_linears", "shared", {"concatenated": True}),  # fp8_shared_input
    ("linears", "any", {}),
    ("scaled_mm", None, {}),
    ("torchao", None, {}),
    ("allreduce", "off", {}),
    ("dgrad", "off", {}),
    ("titan_moe", None, {}),
    ("hf_moe", "off", {"masks": True}),  # moe_sentinel_mask
    ("hf_moe", "whole_row", {}),  # fp8_experts, moe_permute_fp8
    ("rotary", None, {}),
    ("attention", None, {"mask": "bool, by index"}),  # causal_mask
    ("embedding", None, {"fused": True}),
    ("cross_entropy", None, {"fused": True}),
    ("near_miss", None, {}),
)


class Chain(nn.Module):
    """Blocks adding to a residual stream, as transformer layers do.
    The scalar multiply after each add keeps blocks apart: no pattern spans two blocks."""

    def __init__(self, blocks: list[Block]):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x):
        for block in self.blocks:
            x = (x + block(x) * 0.5) * 0.75
        return x


@dataclasses.dataclass
class Example:
    """A random model and its input, from its seed."""

    seed: int
    setting: Setting
    model: Chain
    x: torch.Tensor

    @property
    def blocks(self) -> list[Block]:
        return list(self.model.blocks)

    @property
    def fp8(self) -> bool:
        """Whether it computes anything in FP8: then the SNR gates apply."""
        return self.setting.fp8 is not None or any(b.kind in ("scaled_mm", "torchao") for b in self.blocks)

    @property
    def precision(self) -> torch.dtype:
        dtypes = [self.setting.dtype] + [b.precision for b in self.blocks if b.precision is not None]
        return min(dtypes, key=lambda d: torch.finfo(d).bits)

    def options(self) -> dict:
        return {"impl": self.setting.impl, **({"fp8": self.setting.fp8} if self.setting.fp8 else {})}

    def expect(self) -> Expect:
        expect = Expect()
        for block in self.blocks:
            expect.add(block.expect())
        return expect

    def __str__(self) -> str:
        s = self.setting
        head = (
            f"fuzz example seed={self.seed}: {str(s.dtype).removeprefix('torch.')} x{list(self.x.shape)} "
            f"fp8={s.fp8} impl={s.impl} {'training' if s.train else 'inference'}{' dynamic' * s.dynamic}"
        )
        rerun = (
            f"rerun: TURBO_FUZZ_SEED={self.seed} pytest lowering_tests/passes/test_fuzz_rewrites.py -k seed{self.seed}"
        )
        return "\n  ".join([head, *(b.describe() for b in self.blocks), rerun])


def generate(seed: int, lead: tuple | None = None, kinds=None, count: int | None = None, **fixed) -> Example:
    """The example of ``seed``: a block ``lead`` (default: LEADS by seed), then ``count`` (default 0 to 3) random
    blocks of ``kinds`` (default: any). ``fixed``: Setting fields given instead of drawn."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    kind, fp8, arguments = lead or LEADS[seed % len(LEADS)]
    count = rng.randint(0, 3) if count is None else count
    plan = [(kind, arguments)] + [(rng.choice(sorted(kinds or KINDS)), {}) for _ in range(count)]
    # One MoE, first: routing is discontinuous, so it reads the model's own input in both graphs.
    moe = next((p for p in plan if KINDS[p[0]].moe), None)
    plan = [moe] * (moe is not None) + [p for p in plan if not KINDS[p[0]].moe]
    # torch._scaled_mm has no backward, and dgrad wants one: the lead's kind stays
    dropped = {"scaled_mm", "dgrad"} - {kind} if {"scaled_mm", "dgrad"} <= {k for k, _ in plan} else set()
    plan = [p for p in plan if p[0] not in dropped]
    kinds = {k for k, _ in plan}
    if fp8 == "row":
        recipe = rng.choice(ROW_RECIPES)
    elif fp8 == "whole_row":
        recipe = rng.choice(WHOLE_ROW_RECIPES)
    elif fp8 == "concat":
        recipe = rng.choice(CONCAT_RECIPES)
    elif fp8 == "shared":
        recipe = "tensorwise"
    elif fp8 == "any" or (fp8 is None and rng.random() < 0.4):
        recipe = rng.choice(sorted(RECIPES))
    else:
        recipe = None
    hands_fp8 = recipe is not None or bool(kinds & {"scaled_mm", "torchao"})
    drawn = dict(
        dtype=rng.choice([torch.float32, torch.bfloat16]),
        hidden=rng.choice([16, 32, 48, 64] + ([40] if not hands_fp8 else [])),
        fp8=recipe,
        train="scaled_mm" not in kinds and ("dgrad" in kinds or rng.random() < 0.8),
        # Triton's CPU interpreter rounds ~2% of fp8 stores wrongly: FP8 runs the reference kernels on CPU
        impl="reference" if hands_fp8 else rng.choice(["reference", "auto"]),
        dynamic=rng.random() < 0.3,
    )
    setting = Setting(**{**drawn, **fixed})
    blocks = [KINDS[k](rng, setting, **kwargs) for k, kwargs in plan]
    if moe is not None or rng.random() < 0.5:
        # A router's gradient in FP8 from fewer than 4 tokens is a few scalars that cancel: their FP8 error is
        # beyond any gate (1 token: 3 dB against 15 dB with the FP8 GEMMs alone, 21 dB more sensitive than x).
        fewest = 4 if moe is not None and hands_fp8 else 1
        shape = (rng.randint(1, 3), rng.randint(fewest, 8), setting.hidden)
    else:
        shape = (rng.randint(1, MAX_ROWS), setting.hidden)
    return Example(seed, setting, Chain(blocks), torch.randn(shape).to(setting.dtype))


def assert_agree(example: Example, what: str, got, want, ideal=None, conditioning=None, truth=None) -> None:
    """``got`` equals ``want`` at the gate: the SNR gates where FP8 computes, else the dtype's tolerance.
    ``ideal()``: the same result with only the ``fp8`` option's GEMMs rewritten, for an example whose own FP8 noise
    is above the gates. ``conditioning()``: how many dB more the result moves than its inputs when they are rounded
    to FP8 (see :func:`inputs_in_fp8`). ``truth()``: the same result of the graph before in float64 (see
    :func:`in_float64`)."""
    if want is None or got is None:
        assert got is None and want is None, f"{example}\n{what}: one graph has none"
        return
    assert got.shape == want.shape and got.dtype == want.dtype, f"{example}\n{what}: {got.shape} {got.dtype}"
    if example.fp8:
        gate = OUTPUT_GATE_DB if what.startswith("output") else GRADIENT_GATE_DB
        db = snr_db(got, want)
        if db >= gate:
            return
        # Several FP8 GEMMs in a row add their noise. Then the result may be no worse than with those GEMMs alone
        # (models/test_hf_models.py's rule): the fusions around them add none. Over few values that noise is itself
        # noisy: the result may instead lie within it of the FP8 GEMMs' alone (a router's gradient from 8 tokens:
        # 9.6 dB against the graph before, 15.8 for the GEMMs alone, 15.7 between the two).
        assert ideal is not None, f"{example}\n{what}: {db:.1f} dB against the graph before the passes (gate {gate} dB)"
        alone = ideal()
        alone_db, apart = snr_db(alone, want), snr_db(got, alone)
        floor = max(alone_db - IDEAL_MARGIN_DB, GATE_FLOOR_DB)
        if db >= floor or apart >= floor:
            return
        # A result that cancels (a 2-expert router's gradient from 2 tokens: differences of near-equal scores)
        # magnifies any FP8 rounding: the gate is lowered by how much more it moves than its inputs do, against the
        # graph before and against the FP8 GEMMs alone alike (a fused producer's FP8 rounding flips, magnified).
        excess = conditioning() if conditioning is not None else 0.0
        lowered = max(gate - excess, GATE_FLOOR_DB)
        assert db >= lowered or apart >= lowered, (
            f"{example}\n{what}: {db:.1f} dB against the graph before the passes (gate {gate} dB, lowered to "
            f"{lowered:.1f}: {excess:.1f} dB more sensitive than its inputs, floor {GATE_FLOOR_DB} dB; "
            f"{alone_db:.1f} dB with the FP8 GEMMs alone, {apart:.1f} dB from them)"
        )
        return
    # Two low-precision results, each within the gate of the truth, are within twice the gate of each other.
    dtype = example.precision
    low = dtype in (torch.bfloat16, torch.float16)
    tol = TOLERANCE[dtype] * (2 if low else 1)
    # At the scale of the tensor: a weight's gradient sums rows, and the stream's values are differences of
    # larger ones (cancellation); both carry errors of the largest values' size.
    atol = tol * max(1.0, want.abs().max().item())
    if low and truth is not None and not torch.allclose(got.double(), want.double(), tol, atol, equal_nan=True):
        # A gradient summing rows that cancel can lie beyond the gate of the truth in both graphs, each rounding
        # differently (an attention's scale: 24.5 dB from float64 before the passes, 30.0 dB after). Then ours
        # must be no farther from float64 than the graph before, give or take the gate (as against Inductor).
        true = truth()
        gate = TOLERANCE[dtype] * max(1.0, true.abs().max().item())
        ours, before = ((t.double() - true).abs().max().item() for t in (got, want))
        assert ours <= before + gate, (
            f"{example}\n{what}: {ours:.3g} from float64, the graph before the passes {before:.3g} (gate {gate:.3g})"
        )
        return
    torch.testing.assert_close(
        got.double(), want.double(), rtol=tol, atol=atol, equal_nan=True, msg=lambda m: f"{example}\n{what}: {m}"
    )


def check(example: Example) -> None:
    """Capture, rewrite and run ``example``; assert what its blocks expect. Raises on the first difference,
    noting the example (its seed) on any error."""
    try:
        _check(example)
    except Exception as error:
        if not str(error).startswith("fuzz example"):
            error.add_note(str(example))
        raise


def _check(example: Example) -> None:
    s = example.setting
    gm, inputs = capture(example.model, example.x, s.train, s.dynamic)
    # Dynamo's placeholders: sizes, x, parameters, buffers. Gradients are of the floating tensors.
    names = [
        n.target
        for n, t in zip(gm.graph.find_nodes(op="placeholder"), inputs)
        if isinstance(t, torch.Tensor) and t.is_floating_point()
    ]
    want_outs, want_grads, _ = evaluate(gm, inputs, s.train)
    record = rewrite(gm, example.options())
    expect = example.expect()
    counts = {p.name: record.replaced[p.name] for p in PASSES}  # what each pass did, rewritten again or not
    assert counts == {p.name: expect.counts[p.name] for p in PASSES}, f"{example}\nrewrites: {counts}"
    ours = {op.removeprefix("turbo_inductor."): n for op, n in record.ops_after.items() if op.startswith("turbo_")}
    assert ours == dict(+expect.ops), f"{example}\nour ops after the passes: {ours}, expected {dict(+expect.ops)}"

    turbo_inductor.reset_kernel_calls()
    got_outs, got_grads, backward = evaluate(gm, inputs, s.train)
    forward = collections.Counter(turbo_inductor.kernel_calls()) - backward
    for phase, calls, index in (("forward", forward, 0), ("backward", backward, 1)):
        if phase == "backward" and not s.train:
            continue
        ran = {kernel for kernel, _ in calls}
        wanted = set().union(*(OP_KERNELS[op][index] for op in +expect.ops))
        assert wanted <= ran, f"{example}\n{phase}: kernels {sorted(wanted - ran)} did not run ({dict(calls)})"
        if s.impl == "reference":
            assert {impl for _, impl in calls} <= {"reference"}, f"{example}\n{phase}: {dict(calls)}"

    assert len(got_outs) == len(want_outs) and len(got_grads) == len(want_grads), f"{example}\nresult count"
    ideal = functools.cache(lambda: fp8_gemms_alone(example))
    rounded = functools.cache(lambda: inputs_in_fp8(example))
    truth = functools.cache(lambda: in_float64(example))

    def conditioning(kind: int, i: int, want) -> float:
        inputs_db, results = rounded()
        return max(0.0, inputs_db - snr_db(results[kind][i], want))

    labels = ([f"output {i}" for i in range(len(got_outs))], [f"gradient of {name}" for name in names])
    for kind, (gots, wants) in enumerate(((got_outs, want_outs), (got_grads, want_grads))):
        for i, (got, want) in enumerate(zip(gots, wants)):
            assert_agree(
                example,
                labels[kind][i],
                got,
                want,
                lambda kind=kind, i=i: ideal()[kind][i],
                lambda kind=kind, i=i, w=want: conditioning(kind, i, w),
                lambda kind=kind, i=i: truth()[kind][i],
            )


def inputs_in_fp8(example: Example) -> tuple[float, tuple[list, list]]:
    """The graph before the passes on its floating inputs (x, parameters) rounded to e4m3 with one scale each:
    (the lowest SNR of a rounded input against itself, (outputs, gradients)). A result as well conditioned as its
    inputs moves as much as they do."""
    gm, inputs = capture(example.model, example.x, example.setting.train, example.setting.dynamic)
    rounded, inputs_db = [], math.inf
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            scale = E4M3_MAX / t.detach().abs().amax().float().clamp(min=1e-12)
            r = ((t.detach().float() * scale).to(torch.float8_e4m3fn).float() / scale).to(t.dtype)
            inputs_db = min(inputs_db, snr_db(r, t.detach()))
            t = r
        rounded.append(t)
    return inputs_db, evaluate(gm, rounded, example.setting.train)[:2]


def fp8_gemms_alone(example: Example) -> tuple[list, list]:
    """(outputs, gradients) of ``example`` with only the ``fp8`` option's GEMMs rewritten, every fusion off."""
    gm, inputs = capture(example.model, example.x, example.setting.train, example.setting.dynamic)
    rewrite(gm, {**example.options(), **{p.name: False for p in PASSES if p.name not in FP8_GEMM_PASSES}})
    return evaluate(gm, inputs, example.setting.train)[:2]


def in_float64(example: Example) -> tuple[list, list]:
    """(outputs, gradients) of the graph before the passes with the model and x in float64, under the output
    cotangents the example's own run sees. What casts to a dtype of its own (torchtitan's bf16 experts) stays in it."""
    gm, inputs = capture(
        copy.deepcopy(example.model).double(), example.x.double(), example.setting.train, example.setting.dynamic
    )
    return evaluate(gm, inputs, example.setting.train, cotangent_dtype=example.x.dtype)[:2]
