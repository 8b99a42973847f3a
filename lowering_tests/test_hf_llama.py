"""A Hugging Face Llama (tiny config, built from code) trains through the fused RMSNorm and SwiGLU ops, and in FP8
under autocast."""

import pytest
import torch
from compare import assert_matches_inductor, assert_ran, default_counts, ops_after, run, snr_db

import turbo_inductor

transformers = pytest.importorskip("transformers")

LAYERS = 2


class LossOf(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, labels=input_ids).loss


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_llama_runs_fused_ops_in_forward_and_backward(dtype):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        attn_implementation="sdpa",
    )
    model = LossOf(transformers.LlamaForCausalLM(config).to(dtype))
    input_ids = torch.randint(0, config.vocab_size, (2, 16))
    counts = assert_matches_inductor(model, [input_ids])
    # two norms per layer and the final one; every one but the first reads a residual add
    assert counts == default_counts(rmsnorm=2 * LAYERS + 1, rmsnorm_residual=2 * LAYERS, glu=LAYERS)
    assert ops_after("turbo_inductor.rmsnorm_residual") == 2 * LAYERS and ops_after("turbo_inductor.rmsnorm") == 1
    assert_ran("rmsnorm_fwd", 2 * LAYERS + 1)
    assert_ran("rmsnorm_bwd", 2 * LAYERS + 1)
    # LlamaMLP: down_proj(act_fn(gate_proj(x)) * up_proj(x))
    assert ops_after("turbo_inductor.glu") == LAYERS
    assert_ran("glu_fwd", LAYERS)
    assert_ran("glu_bwd", LAYERS)


@pytest.mark.parametrize("dynamic_checkpointed", [False, True], ids=["static", "dynamic-checkpointed"])
def test_llama_with_fp32_parameters_trains_in_fp8_under_autocast(dynamic_checkpointed):
    """The Hugging Face Trainer's mixed precision: fp32 parameters, torch.autocast(bf16). Every linear (lm_head
    included) becomes an FP8 linear in bf16; the residual adds (the bf16 attention or MLP output joining the fp32
    residual stream) fuse into the next norm, whose fp32 output the norm writes as its linears' bf16 input and its
    FP8 copy. The loss is Inductor's within FP8 noise, and every gradient (fp32) is as close to Inductor's as with
    those fusions off. Also with ``dynamic=True`` and gradient checkpointing, where Dynamo reads the input norm's
    output's ``.size()`` (that read stays, on the norm's bf16 output) and each layer's last residual add is the
    checkpointed region's output, which the next region's norm cannot fuse."""
    from conftest import DEVICE

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        attn_implementation="sdpa",
    )
    llama = transformers.LlamaForCausalLM(config)
    dynamic = True if dynamic_checkpointed else None
    if dynamic_checkpointed:
        llama.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = LossOf(llama).to(DEVICE)
    input_ids = torch.randint(0, config.vocab_size, (2, 16), device=DEVICE)
    # on CPU the reference kernels: the Triton interpreter's FP8 stores round ~2% of values wrongly (platform.md)
    options = {"fp8": "rowwise", **({"impl": "reference"} if DEVICE == "cpu" else {})}
    with torch.autocast(DEVICE, torch.bfloat16):
        inductor = run(model, [input_ids], "inductor", dynamic=dynamic)
        turbo_inductor.reset_records()
        fused = run(model, [input_ids], "primus_turbo", options=options, dynamic=dynamic)
        counts = turbo_inductor.rewrite_counts()
        plain = run(
            model,
            [input_ids],
            "primus_turbo",
            options={**options, "rmsnorm_fp8": False, "rmsnorm_residual": False},
            dynamic=dynamic,
        )
    assert (counts["fp8"], counts["rmsnorm_residual"], counts["rmsnorm_fp8"], counts["glu_fp8"]) == (
        7 * LAYERS + 1,
        LAYERS if dynamic_checkpointed else 2 * LAYERS,
        2 * LAYERS,
        LAYERS,
    )
    torch.testing.assert_close(fused[0][0], inductor[0][0], rtol=1e-2, atol=0)
    for f, p, i in zip(fused[1], plain[1], inductor[1]):
        assert f.dtype == i.dtype == torch.float32
        assert snr_db(f, i) >= snr_db(p, i) - 1
