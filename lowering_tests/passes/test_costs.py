"""The FP8 cost model: ``"auto"`` puts a GEMM in FP8 where the device's cost table measured it faster, logs each
choice and keeps it in the compile record; ``true`` forces FP8, ``false`` keeps high precision. That the shipped table
is what its runs make: benchmarks/tests/test_cost_table.py."""

import logging

import pytest
import torch

import turbo_inductor
from turbo_inductor import costs
from turbo_inductor.kernels import registry
from turbo_inductor.recipes import FP8Config
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.compare import assert_matches_inductor, rewrites_without_compiling
from turbo_inductor.testing.moe import TitanMoE, hf_sparse_moe

EXPERTS, HIDDEN, INTERMEDIATE, TOKENS, TOP_K = 4, 64, 32, 16, 2


def a_table(grouped_ms=None, linear_ms=None) -> dict:
    """A cost table measuring the MoE below: its experts' grouped GEMMs (gate and up [K 64, N 32], down [K 32,
    N 64]), and its shared expert's linears of the same shapes, where given."""
    shapes = ((HIDDEN, INTERMEDIATE), (INTERMEDIATE, HIDDEN))
    grouped = [
        {"groups": EXPERTS, "rows": TOKENS * TOP_K, "k": k, "n": n, "ms": grouped_ms, "source": "test"}
        for k, n in shapes
    ]
    return {
        "device": "test",
        "margin": 0.02,
        "defaults": {costs.GROUPED_MM: costs.HIGH_PRECISION, costs.LINEAR: "fp8"},
        costs.GROUPED_MM: grouped if grouped_ms else [],
        costs.LINEAR: [
            {"groups": 1, "rows": TOKENS, "k": k, "n": n, "ms": linear_ms, "source": "test"} for k, n in shapes
        ]
        if linear_ms
        else [],
    }


@pytest.fixture
def on_a_gpu_with(monkeypatch):
    """Makes the compile see a GPU model whose cost table is the one given."""

    def use(table):
        monkeypatch.setattr(costs, "device_slug", lambda device: "test-gpu")
        monkeypatch.setattr(costs, "table", lambda slug: table if slug == "test-gpu" else None)

    return use


def moe_rewrites(experts_option, device=DEVICE, **more_options):
    model = TitanMoE(HIDDEN, INTERMEDIATE, experts=EXPERTS, top_k=TOP_K, expert_dtype=torch.bfloat16)
    x = torch.randn(1, TOKENS, HIDDEN, device=device, dtype=torch.bfloat16)
    options = {"fp8": {"recipe": "rowwise", "experts": experts_option}, **more_options}
    return rewrites_without_compiling(model.to(device, torch.bfloat16), [x], options=options)


@pytest.mark.parametrize(
    "experts, measured, fp8",
    [
        ("auto", {costs.HIGH_PRECISION: 1.0, "rowwise": 1.2}, False),  # measured slower
        ("auto", {costs.HIGH_PRECISION: 1.0, "rowwise": 0.99}, False),  # faster, but within the margin
        ("auto", {costs.HIGH_PRECISION: 1.0, "rowwise": 0.8}, True),
        # faster than the ranking's bf16 kernel, not than the bf16 backend's one GEMM per group
        ("auto", {costs.HIGH_PRECISION: 1.0, costs.implementation_key("vendor_per_group"): 0.7, "rowwise": 0.8}, False),
        ("auto", None, False),  # not measured: the table's default for experts
        (True, {costs.HIGH_PRECISION: 1.0, "rowwise": 1.2}, True),  # forced
        (False, {costs.HIGH_PRECISION: 1.0, "rowwise": 0.8}, False),
    ],
)
def test_experts_take_fp8_where_the_table_says_it_wins(on_a_gpu_with, caplog, experts, measured, fp8):
    on_a_gpu_with(a_table(grouped_ms=measured))
    with caplog.at_level(logging.INFO, logger="turbo_inductor"):
        counts = moe_rewrites(experts)
    assert counts["fp8_experts"] == (3 if fp8 else 0)
    decisions = [line for record in turbo_inductor.compile_records() for line in record.decisions]
    experts_lines = [line for line in decisions if line.startswith("fp8_experts: experts: ")]
    assert len(experts_lines) == (2 if experts == "auto" else 0), decisions  # one per shape: gate/up, down
    for line in experts_lines:
        assert line in caplog.text
        if measured:
            high = min((key for key in measured if not key.startswith("rowwise")), key=measured.get)
            by = f" by {high.split('impl=')[1]}" if "impl=" in high else ""
            assert f"measured on test-gpu at 32 rows: {measured[high]:.3f} ms in high precision{by}, " in line
        else:
            assert "not measured on test-gpu: high precision, the table's default" in line


@pytest.mark.parametrize(
    "measured, runs",
    [
        ({"rowwise": 0.8, "rowwise_with_gw_hp": 0.7}, "rowwise_with_gw_hp"),  # the substitute measured faster
        ({"rowwise": 0.7, "rowwise_with_gw_hp": 0.8}, "rowwise"),
        ({"rowwise_with_gw_hp": 0.8}, "rowwise_with_gw_hp"),  # only the substitute measured
        ({"rowwise": 1.2, "rowwise_with_gw_hp": 1.1}, None),  # neither wins
    ],
)
def test_auto_runs_the_fastest_of_the_recipe_and_its_substitutes(on_a_gpu_with, measured, runs):
    """rowwise_with_gw_hp has rowwise's forward and a bf16 weight gradient: where the table measured it faster,
    "auto" runs it for rowwise experts, and says so."""
    on_a_gpu_with(a_table(grouped_ms={costs.HIGH_PRECISION: 1.0, **measured}))
    counts = moe_rewrites("auto", record_graphs=True)
    assert counts["fp8_experts"] == (3 if runs else 0)
    decisions = [line for record in turbo_inductor.compile_records() for line in record.decisions]
    experts = [line for line in decisions if line.startswith("fp8_experts: ")]
    verdict = f"FP8 {runs}" if runs else costs.HIGH_PRECISION
    assert len(experts) == 2 and all(f": {verdict}, measured on test-gpu" in line for line in experts), decisions
    # the three experts' GEMMs run the substitute; the shared expert's linears (unmeasured: FP8) the recipe asked
    graph = turbo_inductor.compile_records()[-1].graph_after
    gemms = [line for line in graph.splitlines() if "turbo_inductor.fp8_grouped_mm.default(" in line]
    assert sum("'rowwise_with_gw_hp'" in line for line in gemms) == (3 if runs == "rowwise_with_gw_hp" else 0)
    assert sum("'rowwise'" in line for line in gemms) == (3 if runs == "rowwise" else 0)


def test_a_linear_measured_slower_in_fp8_stays(on_a_gpu_with):
    """The shared expert's three linears (the router's N, the number of experts, is too narrow for FP8)."""
    on_a_gpu_with(a_table(linear_ms={costs.HIGH_PRECISION: 1.0, "rowwise": 1.5}))
    counts = moe_rewrites(False)
    assert counts["fp8"] == counts["fp8_concat"] == 0
    on_a_gpu_with(a_table())  # not measured: the table's default for linears
    counts = moe_rewrites(False)
    assert (counts["fp8"], counts["fp8_concat"]) == (1, 1)  # down; gate and up as one


def test_a_device_without_a_table_takes_fp8_as_asked():
    """The CPU, which no table measures, on every machine (a model on the GPU takes that GPU's table)."""
    decision = costs.decide(costs.GROUPED_MM, "rowwise", torch.device("cpu"), 32, 64, 64, 4)
    assert decision.fp8 and decision.reason == "no cost table for cpu: FP8 as the option asks"
    assert moe_rewrites("auto", device="cpu")["fp8_experts"] == 3


def test_a_gpu_without_a_table_keeps_experts_in_high_precision(on_a_gpu_with):
    """Never slower where nothing was measured (FP8 experts as asked made Qwen3-MoE 0.63x Inductor on an H100,
    against 1.19x in bf16): a GPU without a table takes the defaults, experts in high precision, linears FP8."""
    on_a_gpu_with(None)
    gpu = torch.device("cuda")
    experts = costs.decide(costs.GROUPED_MM, "rowwise", gpu, 8192, 2048, 1536, 128)
    linear = costs.decide(costs.LINEAR, "rowwise", gpu, 8192, 4096, 4096)
    assert not experts.fp8 and experts.reason.endswith(
        "no cost table for test-gpu: high precision, the default for a grouped_mm"
    )
    assert linear.fp8 and linear.reason.endswith("no cost table for test-gpu: FP8 rowwise, the default for a linear")


def test_the_nearest_measured_rows_within_a_factor_of_two_decide(on_a_gpu_with):
    on_a_gpu_with(a_table(grouped_ms={costs.HIGH_PRECISION: 1.0, "rowwise": 0.5}))

    def decide(rows, recipe="rowwise"):
        return costs.decide(costs.GROUPED_MM, recipe, torch.device("cuda"), rows, HIDDEN, INTERMEDIATE, EXPERTS)

    assert decide(60).fp8 and decide(17).fp8  # 32 measured
    assert not decide(65).fp8 and not decide(15).fp8 and not decide(None).fp8  # the default
    assert not decide(32, "blockwise").fp8


@pytest.mark.cost_tables
def test_the_h200_table_takes_fp8_for_mixtrals_experts_and_bf16_for_qwen3s(monkeypatch):
    """Measured on an H200, forward and backward with the quantization: Mixtral's FP8 experts ran 5% faster than bf16
    (gate_up rowwise; down rowwise_with_gw_hp, rowwise's substitute); Qwen3-MoE's 128 small experts ran slower in
    every recipe. The model's routed rows (batch 2 x 2048) lie within a factor of two of the measured ones."""
    monkeypatch.setattr(costs, "device_slug", lambda device: "nvidia-h200")

    def decide(rows, k, n, groups):
        return costs.decide(costs.GROUPED_MM, "rowwise", torch.device("cuda"), rows, k, n, groups)

    gate_up, down = decide(8192, 4096, 28672, 8), decide(8192, 14336, 4096, 8)
    assert (gate_up.fp8, gate_up.recipe, down.fp8, down.recipe) == (True, "rowwise", True, "rowwise_with_gw_hp")
    assert "18.367 ms in high precision" in gate_up.reason
    assert not any(decide(32768, k, n, 128).fp8 for k, n in ((2048, 1536), (768, 2048)))


@pytest.mark.cost_tables
def test_the_h100_table_runs_mixtrals_bf16_gemms_per_expert_and_qwen3s_grouped(monkeypatch):
    """Measured on an H100, forward and backward, at the model's routed rows: one cuBLAS GEMM per expert ran
    Mixtral's gate_up and down 7% and 15% faster than torch's grouped kernel in GPU time (as the model showed: all
    per expert, its bf16 step ran 1.12x Inductor against 1.09x), and Qwen3-MoE's 128 small experts 9-19x slower by
    wall time, where the host lags (a sync and 128 launches per pass)."""
    monkeypatch.setattr(costs, "device_slug", lambda device: "nvidia-h100-80gb-hbm3")

    def choose(rows, k, n, groups):
        return costs.grouped_implementation(torch.device("cuda"), rows, k, n, groups)[0]

    assert choose(8192, 14336, 4096, 8) == choose(8192, 4096, 28672, 8) == "vendor_per_group"
    assert choose(32768, 2048, 1536, 128) is None and choose(32768, 768, 2048, 128) is None


@pytest.mark.parametrize("value, parsed", [("auto", "auto"), ("AUTO", "auto"), (True, True), ("false", False)])
def test_the_option_takes_true_false_or_auto(value, parsed):
    assert FP8Config.from_option({"recipe": "rowwise", "experts": value}).experts == parsed
    assert FP8Config.from_option("rowwise").experts == FP8Config.from_option("rowwise").linears == "auto"
    with pytest.raises(ValueError, match="option 'fp8.linears' takes true, false or 'auto', got 'maybe'"):
        FP8Config.from_option({"recipe": "rowwise", "linears": "maybe"})


@pytest.mark.parametrize(
    "measured, preferred",
    [
        ({costs.HIGH_PRECISION: 1.0, costs.implementation_key("vendor_per_group"): 0.9}, "vendor_per_group"),
        ({costs.HIGH_PRECISION: 1.0, costs.implementation_key("vendor_per_group"): 0.99}, None),  # within the margin
        ({costs.HIGH_PRECISION: 1.0, costs.implementation_key("vendor_per_group"): 1.5}, None),
        ({costs.HIGH_PRECISION: 1.0, "rowwise": 1.2}, None),  # no other implementation measured
        # the ranking's choice timed as the others were (its wall time, 1.2) is the one they compare with
        (
            {
                costs.HIGH_PRECISION: 1.0,
                **{costs.implementation_key(n): t for n, t in (("auto", 1.2), ("triton", 1.1))},
            },
            "triton",
        ),
    ],
)
def test_bf16_experts_prefer_the_implementation_the_table_measured_faster(on_a_gpu_with, measured, preferred):
    """The experts FP8 did not take run the implementation measured fastest at their shape, as a preference: on this
    CPU, where it does not run, the registry's own choice runs, and the step still trains like Inductor's."""
    on_a_gpu_with(a_table(grouped_ms=measured))
    counts = moe_rewrites(False, record_graphs=True)
    assert counts["grouped_mm_impl"] == (3 if preferred else 0)  # gate, up and down of the routed experts
    graph = turbo_inductor.compile_records()[-1].graph_after
    gemms = [line for line in graph.splitlines() if "turbo_inductor.grouped_mm.default(" in line]
    assert len(gemms) == 3 and sum(f"'prefer:{preferred}'" in line for line in gemms) == (3 if preferred else 0)
    decisions = [line for record in turbo_inductor.compile_records() for line in record.decisions]
    lines = [line for line in decisions if line.startswith("grouped_mm_impl: experts: ")]
    verdict = preferred or "the ranking's implementation"
    assert len(lines) == 2 and all(f": {verdict}, measured on test-gpu at 32 rows" in line for line in lines)


def test_bf16_experts_preferring_an_implementation_train_like_inductor_on_it(on_a_gpu_with):
    """The preferred implementation runs the forward, dgrad and wgrad; outputs and gradients are Inductor's."""
    on_a_gpu_with(a_table(grouped_ms={costs.HIGH_PRECISION: 1.0, costs.implementation_key("triton"): 0.5}))
    torch.manual_seed(0)
    model = TitanMoE(HIDDEN, INTERMEDIATE, experts=EXPERTS, top_k=TOP_K).to(DEVICE, torch.bfloat16)
    x = torch.randn(2, TOKENS // 2, HIDDEN, device=DEVICE, dtype=torch.bfloat16)
    counts = assert_matches_inductor(model, [x])
    assert counts["grouped_mm_impl"] == 3
    calls = turbo_inductor.kernel_calls()
    assert calls[("grouped_gemm", "triton")] >= 6 and calls[("grouped_gemm_wgrad", "triton")] >= 3, calls
    assert not any(name != "triton" for kernel, name in calls if kernel.startswith("grouped_gemm")), calls


def test_bf16_experts_measured_fastest_in_the_rankings_first_stay_as_they_are(on_a_gpu_with):
    """The table times the ranking's first implementation apart from ``auto``; the two differ by noise alone."""
    first = registry.candidates("grouped_gemm", torch.device(DEVICE))[0]
    on_a_gpu_with(a_table(grouped_ms={costs.HIGH_PRECISION: 1.0, costs.implementation_key(first): 0.5}))
    assert moe_rewrites(False)["grouped_mm_impl"] == 0
    decisions = [line for record in turbo_inductor.compile_records() for line in record.decisions]
    lines = [line for line in decisions if line.startswith("grouped_mm_impl: ")]
    assert len(lines) == 2 and all(line.endswith(", the ranking's first already") for line in lines), decisions


def test_an_implementation_the_table_names_but_this_package_lacks_is_not_preferred(on_a_gpu_with):
    """A table older than a renamed implementation: the ranking runs, and the decision says why."""
    on_a_gpu_with(a_table(grouped_ms={costs.HIGH_PRECISION: 1.0, costs.implementation_key("cutlass"): 0.5}))
    assert moe_rewrites(False)["grouped_mm_impl"] == 0
    decisions = [line for record in turbo_inductor.compile_records() for line in record.decisions]
    lines = [line for line in decisions if line.startswith("grouped_mm_impl: ")]
    assert len(lines) == 2 and all(
        line.endswith("(no implementation 'cutlass' here: the table is stale)") for line in lines
    )


def test_experts_keep_the_implementation_the_user_forced_and_other_dtypes_theirs(on_a_gpu_with):
    faster = {costs.HIGH_PRECISION: 1.0, costs.implementation_key("vendor_per_group"): 0.5}
    on_a_gpu_with(a_table(grouped_ms=faster))
    assert moe_rewrites(False, impl="reference")["grouped_mm_impl"] == 0
    # transformers' fallback in fp32: its down GEMM has a measured shape, but the table times bf16
    model = hf_sparse_moe("qwen3_moe", HIDDEN, INTERMEDIATE, EXPERTS, TOP_K).to(DEVICE, torch.float32)
    x = torch.randn(1, TOKENS, HIDDEN, device=DEVICE)
    assert rewrites_without_compiling(model, [x])["grouped_mm_impl"] == 0
    on_a_gpu_with(None)  # no table: nothing measured, nothing said
    assert moe_rewrites(False)["grouped_mm_impl"] == 0
    decisions = [line for record in turbo_inductor.compile_records() for line in record.decisions]
    assert not [line for line in decisions if line.startswith("grouped_mm_impl")]
