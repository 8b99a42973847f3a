"""Fuzzing of the rewrites (lowering_tests/fuzz/): random models chained from blocks of every pass's patterns, their
spellings and near misses. Each example knows the rewrites it must get; the passes run in strict mode on its Dynamo
graph, and the rewritten graph must run our kernels forward and backward, with the outputs and gradients of the graph
before.

CI runs 40 examples from a seed that changes every run; ``pytest -m fuzz`` runs 500. ``TURBO_FUZZ_SEED=S`` reruns
the examples S, S + 1, ...; a failure names its seed. ``TURBO_FUZZ_EXAMPLES`` sets the CI count."""

import collections
import itertools
import os
import time
import zlib

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import turbo_inductor
from lowering_tests.fuzz.blocks import KINDS
from lowering_tests.fuzz.driver import GATE_FLOOR_DB, LEADS, assert_agree, check, generate
from turbo_inductor.ops.cross_entropy import CrossEntropyNode
from turbo_inductor.passes import PASSES, Phase, glu, rmsnorm, surgery
from turbo_inductor.passes.glu import GLUPass
from turbo_inductor.passes.rmsnorm import RMSNormPass
from turbo_inductor.testing.compare import assert_matches_inductor
from turbo_inductor.testing.distributed import SumOverRanks
from turbo_inductor.testing.graph import capture, rewrite


def base_seed() -> int:
    """TURBO_FUZZ_SEED, else one per run; the pytest-xdist workers of a run all derive the same one."""
    if os.environ.get("TURBO_FUZZ_SEED"):
        return int(os.environ["TURBO_FUZZ_SEED"])
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(time.time_ns())
    return zlib.crc32(run.encode()) % 10**9


BASE = base_seed()
CI_EXAMPLES = int(os.environ.get("TURBO_FUZZ_EXAMPLES", "40"))
LONG_EXAMPLES = 500


def run_example(seed: int) -> None:
    example = generate(seed)
    print(example)  # shown by pytest on a failure
    check(example)


@pytest.mark.parametrize("seed", range(BASE, BASE + CI_EXAMPLES), ids=lambda seed: f"seed{seed}")
def test_random_model_gets_its_rewrites(fake_group, seed):
    run_example(seed)


@pytest.mark.fuzz
@pytest.mark.parametrize("seed", range(BASE, BASE + LONG_EXAMPLES), ids=lambda seed: f"seed{seed}")
def test_random_model_gets_its_rewrites_long_run(fake_group, seed):
    run_example(seed)


def test_every_run_takes_every_block_kind_and_fires_every_pass():
    """Any len(LEADS) consecutive seeds do; CI runs more."""
    assert CI_EXAMPLES >= len(LEADS) or "TURBO_FUZZ_EXAMPLES" in os.environ
    examples = [generate(seed) for seed in range(BASE, BASE + len(LEADS))]
    assert {block.kind for example in examples for block in example.blocks} == set(KINDS)
    fired = {name for example in examples for name, n in example.expect().counts.items() if n}
    # The fuzzer rewrites Dynamo's graphs, without autocast or a GPU's cost table: the POST_GRAD passes (on
    # AOTAutograd's graphs), rmsnorm_autocast, grouped_mm_impl and grouped_mm_host_offs (for the implementation a
    # table prefers) have their own tests.
    unfired = {"rmsnorm_autocast", "grouped_mm_impl", "grouped_mm_host_offs"}
    assert fired == {p.name for p in PASSES if p.phase < Phase.POST_GRAD} - unfired


# ---- the fuzzer fails on a broken pass ---------------------------------------------------------------------------


def _raises(self, graph, options):
    raise RuntimeError("broken on purpose")


def _rewrites_nothing(self, graph, options):
    return 0


# erf and tanh GELUs differ by less than the bf16 gate: each becomes SiLU
_OTHER_ACTIVATION = {"silu": "gelu", "gelu": "silu", "gelu_tanh": "silu"}


def _wrong_activation(original):
    def activation_of(node):
        found = original(node)
        return (_OTHER_ACTIVATION[found[0]], found[1]) if found is not None else None

    return activation_of


def _without_weight(original):
    def match(node):
        found = original(node)
        if found is not None and found.weight is not None:
            found.weight = None
        return found

    return match


def _loss_arguments(original, **changes):
    """``surgery.insert_view`` that hands the cross-entropy op ``changes[name](value)`` for the pass's values."""

    def insert_view(graph, before, view, **arguments):
        if view is CrossEntropyNode:
            arguments.update({name: change(arguments[name]) for name, change in changes.items()})
        return original(graph, before, view, **arguments)

    return insert_view


def _break(monkeypatch, breakage: str) -> None:
    if breakage == "a pass raises":
        monkeypatch.setattr(GLUPass, "apply", _raises)
    elif breakage == "a pass rewrites nothing":
        monkeypatch.setattr(RMSNormPass, "apply", _rewrites_nothing)
    elif breakage == "the loss pass ignores -100 whatever it is told":
        monkeypatch.setattr(surgery, "insert_view", _loss_arguments(surgery.insert_view, ignore_index=lambda _: -100))
    elif breakage == "the loss pass sums a loss per row":
        sums = _loss_arguments(surgery.insert_view, reduction=lambda r: "sum" if r == "none" else r)
        monkeypatch.setattr(surgery, "insert_view", sums)
    elif breakage == "the GLU pass writes another activation":
        monkeypatch.setattr(glu, "activation_of", _wrong_activation(glu.activation_of))
    else:  # the norm pass drops the weight, counting the rewrite as usual
        monkeypatch.setattr(rmsnorm, "match_functional", _without_weight(rmsnorm.match_functional))
        monkeypatch.setattr(rmsnorm, "match_decomposed", _without_weight(rmsnorm.match_decomposed))


def _any(example) -> bool:
    return True


def _weighted_norm(example) -> bool:
    """Its norm's weight goes into our op (not a promoting fp32 weight, which stays a multiply)."""
    return example.blocks[0].norm.fused_whole


def _loss_ignoring(example) -> bool:
    """Its loss ignores class 3, a target of its second row."""
    return example.blocks[0].arguments["ignore_index"] == 3 and example.x.numel() > example.x.shape[-1]


def _loss_per_row(example) -> bool:
    """Its loss is one per row, of two rows or more: a sum in its place has another shape."""
    return example.blocks[0].reduction == "none" and example.x.numel() > example.x.shape[-1]


NUMERICS = r"(output \d+|gradient of \w+): "
# breakage: (the block it needs, which examples of it show the breakage, the error, its message)
BREAKAGES = {
    "a pass raises": (("glu", "off", {}), _any, RuntimeError, "broken on purpose"),
    "a pass rewrites nothing": (("norm", "off", {}), _any, AssertionError, "rewrites"),
    "the GLU pass writes another activation": (("glu", "off", {}), _any, AssertionError, NUMERICS),
    "the loss pass ignores -100 whatever it is told": (
        ("cross_entropy", "off", {"fused": True}),
        _loss_ignoring,
        AssertionError,
        NUMERICS,
    ),
    # the block puts a loss per row back on its row: a scalar cannot be
    "the loss pass sums a loss per row": (
        ("cross_entropy", "off", {"fused": True}),
        _loss_per_row,
        RuntimeError,
        "is invalid for input of size 1",
    ),
    "the norm pass drops the weight": (
        ("norm", "off", {"weighting": "after"}),
        _weighted_norm,
        AssertionError,
        NUMERICS,
    ),
}
# A wrong rewrite that changes a block's result by a few percent shows at the fp32 gate; bf16's (1e-2) may let
# it pass. A failing or missing rewrite shows in either.
CASES = [(b, torch.float32) for b in sorted(BREAKAGES)] + [
    (b, torch.bfloat16) for b in ("a pass raises", "a pass rewrites nothing")
]


@pytest.mark.parametrize("breakage, dtype", CASES, ids=lambda v: str(v).removeprefix("torch."))
def test_the_fuzzer_fails_on_a_broken_pass(fake_group, monkeypatch, breakage, dtype):
    """An example of the broken pass's block, the first from the run's seed on, passes as it is and fails with the
    pass broken, naming its seed."""
    lead, shows, error, message = BREAKAGES[breakage]
    seed = next(s for s in itertools.count(BASE) if shows(generate(s, lead, count=0, dtype=dtype)))
    check(generate(seed, lead, count=0, dtype=dtype))
    _break(monkeypatch, breakage)
    with pytest.raises(error, match=message) as failure:
        check(generate(seed, lead, count=0, dtype=dtype))
    assert f"seed={seed}" in str(failure.value) + "".join(getattr(failure.value, "__notes__", []))


# ---- the FP8 gate's floor ----------------------------------------------------------------------------------------


def test_the_fp8_gate_is_lowered_no_further_than_its_floor():
    """A result whose FP8 GEMMs alone are pure noise (-20 dB), and which is 100 dB more sensitive than its inputs:
    either would lower the gate below 0 dB. Just above the floor it passes; just below, it fails."""
    example = generate(BASE, ("linears", "any", {}), count=0)
    assert example.fp8
    want = torch.randn(4096, dtype=torch.float64)

    def at(db: float) -> torch.Tensor:
        """``want`` plus random noise, ``db`` under it."""
        noise = torch.randn_like(want)
        return want + noise * (want.norm() / noise.norm()) * 10 ** (-db / 20)

    alone = at(-20.0)
    for what in ("output 0", "gradient of w"):
        assert_agree(example, what, at(GATE_FLOOR_DB + 0.5), want, lambda: alone, lambda: 100.0)
        with pytest.raises(AssertionError, match=f"floor {GATE_FLOOR_DB} dB"):
            assert_agree(example, what, at(GATE_FLOOR_DB - 0.5), want, lambda: alone, lambda: 100.0)


def test_a_low_precision_result_is_judged_against_float64_where_the_graph_before_is_off():
    """The graph before 0.05 from float64, beyond the bf16 gate: ours, off the other way, passes while no farther
    from float64 than it, give or take the gate (0.01); farther, it fails."""
    example = generate(BASE, ("norm", "off", {}), count=0, dtype=torch.bfloat16)
    assert example.precision == torch.bfloat16 and not example.fp8
    true = torch.linspace(-1, 1, 64, dtype=torch.float64)
    want = (true + 0.05).bfloat16()
    assert_agree(example, "gradient of w", (true - 0.04).bfloat16(), want, truth=lambda: true)
    with pytest.raises(AssertionError, match="from float64"):
        assert_agree(example, "gradient of w", (true - 0.1).bfloat16(), want, truth=lambda: true)


# ---- end to end, compiled ----------------------------------------------------------------------------------------


def test_a_random_model_compiled_matches_inductor():
    """One example through the whole backend, against backend="inductor": its rewrites, outputs and gradients."""
    example = generate(BASE, ("norm", "off", {}), count=0, dtype=torch.float32, train=True)
    print(example)
    assert_matches_inductor(example.model, [example.x], train=example.setting.train, options=example.options())
    replaced = sum((record.replaced for record in turbo_inductor.compile_records()), collections.Counter())
    expected = example.expect().counts
    assert {p.name: replaced[p.name] for p in PASSES} == {p.name: expected[p.name] for p in PASSES}, example


# ---- what the fuzzer found -------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["rmsnorm", "fp8_linear"])
def test_an_ops_output_can_be_written_in_place_under_autograd(op):
    """As ``dist.all_reduce(y)`` writes a row-parallel linear's output, run eagerly: the gradient is that of the
    out-of-place write."""
    x, w = torch.randn(4, 32), torch.randn(32, 32)
    grads = []
    for in_place in (True, False):
        xg = x.clone().requires_grad_()
        if op == "rmsnorm":
            y = turbo_inductor.ops.rmsnorm(xg, None, 1e-5, impl="reference")
        else:
            y = turbo_inductor.ops.fp8_linear(xg, w, None, "rowwise", impl="reference")
        y = y.mul_(2) if in_place else y * 2
        (y * torch.arange(32.0)).sum().backward()
        grads.append(xg.grad)
    assert torch.equal(grads[0], grads[1])


class SumOverRanksSavingAnother(torch.autograd.Function):
    """SumOverRanks with a second tensor input, saved for its backward: not Megatron's copy."""

    @staticmethod
    def forward(ctx, x, another):
        ctx.save_for_backward(another)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return funcol.all_reduce(grad, "sum", dist.group.WORLD), None


class ColumnParallel(torch.nn.Module):
    def __init__(self, saves_another: bool = False):
        super().__init__()
        self.linear = torch.nn.Linear(32, 32)
        self.another = torch.nn.Parameter(torch.randn(32)) if saves_another else None

    def forward(self, x):
        if self.another is None:
            return self.linear(SumOverRanks.apply(x))
        return self.linear(SumOverRanksSavingAnother.apply(x, self.another))


def dgrad_rewrites(model: torch.nn.Module, dynamic: bool) -> int:
    gm, _ = capture(model, torch.randn(4, 32), train=True, dynamic=dynamic)
    return rewrite(gm, {}).counts["gemm_allreduce_dgrad"]


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_column_parallel_linear_is_fused_with_a_symbolic_batch(fake_group, dynamic):
    """Dynamo passes the symbolic batch size to the autograd.Function's call as one more input."""
    assert dgrad_rewrites(ColumnParallel(), dynamic) == 1


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_copy_that_takes_another_tensor_is_left_alone(fake_group, dynamic):
    assert dgrad_rewrites(ColumnParallel(saves_another=True), dynamic) == 0
