"""A Hugging Face Llama (tiny config, built from code) trains through the fused RMSNorm and SwiGLU ops."""
import pytest
import torch

from compare import assert_matches_inductor, assert_ran, default_counts, ops_after

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
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, attn_implementation="sdpa")
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
