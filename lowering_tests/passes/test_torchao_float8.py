"""A model converted by torchao (``convert_to_float8_training``) and compiled with backend="primus_turbo": its
Float8Linear matmuls become our fp8_linear with the same recipe, forward and backward, at torchao's accuracy."""

import copy
import re

import pytest
import torch
import torch.nn as nn

import turbo_inductor
from turbo_inductor.ops.fp8_operands import fp8_formats
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.compare import assert_left_alone, assert_ran, ops_after, run
from turbo_inductor.testing.tolerance import snr_db

torchao_float8 = pytest.importorskip("torchao.float8")

# Triton's CPU interpreter rounds ~2% of fp8 stores wrongly (off by 2x near a binade edge): the reference kernels
# on CPU.
IMPL = "auto" if DEVICE == "cuda" else "reference"
OURS = {"tensorwise": "tensorwise", "rowwise": "rowwise_pow2"}  # torchao's recipe -> ours


def trampolines(counts: str) -> int:
    """Dynamo's calls of an autograd function kept whole (torchao's matmul), in the op counts ``counts``."""
    return sum(
        n
        for record in turbo_inductor.compile_records()
        for op, n in getattr(record, counts).items()
        if op.endswith("trampoline_autograd_apply")
    )


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64, bias=False)).to(DEVICE)


def converted(model, config):
    model = copy.deepcopy(model)
    torchao_float8.convert_to_float8_training(model, config=config)
    return model


@pytest.mark.parametrize("recipe", sorted(OURS))
def test_torchao_float8_linears_run_on_our_fp8_linear(recipe):
    model, x = mlp(), torch.randn(4, 8, 64, device=DEVICE)
    fp8 = converted(model, torchao_float8.Float8LinearConfig.from_recipe_name(recipe))
    torchao = run(fp8, [x], "inductor")
    turbo_inductor.reset_records()
    turbo_inductor.reset_kernel_calls()
    ours = run(fp8, [x], "primus_turbo", options={"impl": IMPL, "record_graphs": True})
    assert turbo_inductor.rewrite_counts()["torchao_float8"] == 2
    assert trampolines("ops_before") == 2 and trampolines("ops_after") == 0
    assert ops_after("turbo_inductor.fp8_linear") == 2
    graph = turbo_inductor.compile_records()[-1].graph_after
    assert graph.count(f"'{OURS[recipe]}'") == 2 and "Float8LinearConfig" not in graph
    # W^T kept as the fp8 option's save_weight_t="auto" keeps it for ours: none for linears not concatenated
    assert len(re.findall(r"fp8_linear\.default\([^)]*, False\)", graph)) == 2
    assert_ran("fp8_gemm", 2 * 3)  # y forward; dgrad and wgrad backward, per linear
    # Against the model before conversion (fp32): the output at the e4m3 gate, and every result (the input's
    # gradient has been through two FP8 dgrads) as accurate as torchao's, give or take 1 dB. The gates of one
    # linear's output, dgrad and wgrad hold for each recipe in ops/test_fp8_linear.py.
    high = run(model, [x], "inductor")
    assert snr_db(ours[0][0], high[0][0]) >= 25
    for n, (got, want, truth) in enumerate(zip(ours[0] + ours[1], torchao[0] + torchao[1], high[0] + high[1])):
        assert snr_db(got, truth) >= snr_db(want, truth) - 1, f"result {n}: less accurate than torchao"


def other_format():
    """FP8 casts in formats no recipe of ours uses, that every FP8 GEMM takes (no e5m2 x e5m2 product): x in
    e5m2, W and dy in e4m3."""
    e4m3, e5m2 = fp8_formats(torch.device(DEVICE))
    return torchao_float8.Float8LinearConfig(
        cast_config_input=torchao_float8.CastConfig(target_dtype=e5m2),
        cast_config_weight=torchao_float8.CastConfig(target_dtype=e4m3),
        cast_config_grad_output=torchao_float8.CastConfig(target_dtype=e4m3),
    )


def full_accumulation():
    """The forward GEMM accumulating in full, where torchao's default (and our recipes) accumulate fast."""
    return torchao_float8.Float8LinearConfig(gemm_config_output=torchao_float8.Float8GemmConfig(use_fast_accum=False))


@pytest.mark.parametrize(
    "change", ["rowwise_with_gw_hp", "pad_inner_dim", "power_of_two_tensorwise", "other_format", "full_accumulation"]
)
def test_configs_that_are_not_our_recipes_stay_with_torchao(change):
    from_name = torchao_float8.Float8LinearConfig.from_recipe_name
    config = {
        "rowwise_with_gw_hp": lambda: from_name("rowwise_with_gw_hp"),
        "pad_inner_dim": lambda: torchao_float8.Float8LinearConfig(pad_inner_dim=True),
        "power_of_two_tensorwise": lambda: torchao_float8.Float8LinearConfig(round_scales_to_power_of_2=True),
        "other_format": other_format,
        "full_accumulation": full_accumulation,
    }[change]()
    model, x = mlp(), torch.randn(4, 8, 64, device=DEVICE)
    assert_left_alone(converted(model, config), [x])  # a config that is not ours


def test_the_rewrite_can_be_turned_off():
    model, x = mlp(), torch.randn(4, 8, 64, device=DEVICE)
    fp8 = converted(model, torchao_float8.Float8LinearConfig.from_recipe_name("tensorwise"))
    turbo_inductor.reset_records()
    run(fp8, [x], "primus_turbo", options={"torchao_float8": False})
    assert turbo_inductor.rewrite_counts().get("torchao_float8", 0) == 0
    assert trampolines("ops_after") == 2  # torchao's matmuls stay
    turbo_inductor.reset_records()
    run(fp8, [x], "primus_turbo")
    assert turbo_inductor.rewrite_counts()["torchao_float8"] == 2
