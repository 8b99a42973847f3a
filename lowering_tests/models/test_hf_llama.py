"""A Hugging Face Llama (tiny config, built from code) trains through the fused RMSNorm and SwiGLU ops, and in FP8
under autocast."""

import pytest
import torch

import turbo_inductor
from turbo_inductor.testing import hf
from turbo_inductor.testing.compare import (
    assert_matches_inductor,
    assert_ran,
    default_counts,
    masked_attentions,
    ops_after,
    run,
)
from turbo_inductor.testing.hf import CausalLMLoss
from turbo_inductor.testing.tolerance import snr_db

pytest.importorskip("transformers")

LAYERS = 1  # one layer holds every fusion site: the input norm, the residual norms, the GLU


@pytest.mark.reference_kernels
def test_llama_runs_fused_ops_in_forward_and_backward():
    """In bf16, as it trains (fp32 numerics of the same spellings: passes/test_rmsnorm.py, passes/test_glu.py)."""
    torch.manual_seed(0)
    model = CausalLMLoss(hf.build("llama3-8b", LAYERS, tiny=True).to(torch.bfloat16))
    input_ids = torch.randint(0, hf.TINY["vocab_size"], (2, 16))
    masks = masked_attentions(model, [input_ids])
    assert masks in (0, LAYERS)
    counts = assert_matches_inductor(model, [input_ids])
    # two norms per layer and the final one; every one but the first reads a residual add; the embedding, the loss;
    # q's and k's rotary embedding per layer; a causal mask built in the graph, where transformers builds one
    ends = {"embedding": 1, "cross_entropy": 1, "rotary": 2 * LAYERS, "causal_mask": masks}
    assert counts == default_counts(rmsnorm=1, rmsnorm_residual=2 * LAYERS, glu=LAYERS, **ends)
    assert_ran("rotary", 4 * LAYERS)  # forward and backward
    assert_ran("cross_entropy_fwd", 1)
    assert_ran("embedding_bwd", 1)
    assert ops_after("turbo_inductor.rmsnorm_residual") == 2 * LAYERS and ops_after("turbo_inductor.rmsnorm") == 1
    assert_ran("rmsnorm_fwd", 2 * LAYERS + 1)
    assert_ran("rmsnorm_bwd", 2 * LAYERS + 1)
    # LlamaMLP: down_proj(act_fn(gate_proj(x)) * up_proj(x))
    assert ops_after("turbo_inductor.glu") == LAYERS
    assert_ran("glu_fwd", LAYERS)
    assert_ran("glu_bwd", LAYERS)


def test_llama_with_fp32_parameters_trains_in_fp8_under_autocast_dynamic_and_checkpointed():
    """The Trainer's mixed precision: fp32 parameters under torch.autocast(bf16), with ``dynamic=True`` and gradient
    checkpointing. Every linear becomes a bf16 FP8 linear, q/k/v and gate/up one each over their weights
    concatenated; each norm writes its linears' bf16 input and its FP8 copy. A layer's last residual add is its
    checkpointed region's output: the next norm cannot fuse it. The loss is the bf16 model's within FP8 noise; every
    gradient meets the FP8 backward gate (the reference runs uncompiled: Inductor's bf16 rounding is far below
    both). The static case is Qwen2's (test_hf_models.py): Llama's code with biases on q/k/v."""
    from turbo_inductor.testing import DEVICE

    torch.manual_seed(0)
    llama = hf.build("llama3-8b", LAYERS, tiny=True)
    llama.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = CausalLMLoss(llama).to(DEVICE)
    input_ids = torch.randint(0, hf.TINY["vocab_size"], (2, 16), device=DEVICE)
    # on CPU the reference kernels: the Triton interpreter's FP8 stores round ~2% of values wrongly
    options = {"fp8": "rowwise", **({"impl": "reference"} if DEVICE == "cpu" else {})}
    with torch.autocast(DEVICE, torch.bfloat16):
        bf16 = run(model, [input_ids], "eager")
        turbo_inductor.reset_records()
        fused = run(model, [input_ids], "primus_turbo", options=options, dynamic=True)
    counts = turbo_inductor.rewrite_counts()
    assert {name: counts[name] for name in ("fp8", "fp8_concat", "rmsnorm_residual", "rmsnorm_fp8", "glu_fp8")} == {
        "fp8": 2 * LAYERS + 1,  # o_proj, down_proj, the head
        "fp8_concat": 2 * LAYERS,  # q/k/v and gate/up: each one FP8 linear over their weights concatenated
        "rmsnorm_residual": 0,  # no residual add fuses; the final norm stays a plain norm
        "rmsnorm_fp8": 2 * LAYERS,  # every other norm writes FP8
        "glu_fp8": LAYERS,
    }
    torch.testing.assert_close(fused[0][0], bf16[0][0], rtol=1e-2, atol=0)
    assert len(fused[1]) == len(bf16[1])
    for got, want in zip(fused[1], bf16[1]):
        assert got.dtype == want.dtype == torch.float32 and snr_db(got, want) >= 20


def saved_for_backward(model, input_ids, options) -> tuple[dict, int]:
    """(rewrite counts, bytes of the tensors the compiled forward saves for the backward): activation memory."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    torch._dynamo.reset()
    turbo_inductor.reset_records()
    compiled = torch.compile(model, backend="primus_turbo", options=options)
    compiled(input_ids).backward()  # compiles: the hooks below see the compiled step alone
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = compiled(input_ids)
    loss.backward()
    return dict(turbo_inductor.rewrite_counts()), sum(storages.values())


@pytest.mark.reference_kernels
def test_gradient_checkpointing_keeps_the_fusions_and_saves_less():
    """transformers' gradient checkpointing (the default for large models): each layer a checkpointed region that
    Dynamo traces (turbo_inductor.checkpointing), our ops recomputed in its backward. The fusions are those without
    checkpointing but one per layer: a layer's last residual add is its region's output, which the next norm, in
    the next region, cannot fuse. Outputs and gradients are Inductor's; the forward saves less for the backward."""
    layers = 2
    torch.manual_seed(0)
    model = CausalLMLoss(hf.build("llama3-8b", layers, tiny=True).to(torch.bfloat16))
    model.model.config.use_cache = False  # as training with checkpointing sets it: transformers warns otherwise
    input_ids = torch.randint(0, hf.TINY["vocab_size"], (2, 16))
    plain, plain_bytes = saved_for_backward(model, input_ids, None)
    model.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    checkpointed, checkpointed_bytes = saved_for_backward(model, input_ids, None)
    moved = {"rmsnorm": plain["rmsnorm"] + layers, "rmsnorm_residual": plain["rmsnorm_residual"] - layers}
    assert plain["rmsnorm_residual"] == 2 * layers and checkpointed == {**plain, **moved}
    # 0.68 here: the LM head's and the loss's saved tensors, outside every region, are a large share of a tiny model's
    assert checkpointed_bytes < 0.75 * plain_bytes, (checkpointed_bytes, plain_bytes)
    assert_matches_inductor(model, [input_ids])
    assert_ran("rmsnorm_fwd", 2 * (2 * layers) + 1)  # the layers' norms twice: in the forward and the recompute
    assert_ran("glu_bwd", layers)


# Python state outside the model: a checkpointed forward that logs its calls mutates it.
# A list's append, which every torch traces; torch 2.11 does not trace a class attribute's setattr.
CALLS = []


class SideEffectInCheckpoint(torch.nn.Module):
    """A checkpointed norm whose forward mutates Python state, as transformers' layers do (5.2x: a context variable
    of the kernels hub)."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.RMSNorm(32)

    def region(self, x):
        CALLS.append(x.shape[0])
        return self.norm(x)

    def forward(self, x):
        return torch.utils.checkpoint.checkpoint(self.region, x, use_reentrant=False) * 2


def test_a_checkpointed_region_with_a_side_effect_is_traced_and_a_fallback_is_named(monkeypatch):
    """Importing the package lets Dynamo trace it (the user's own setting wins); where it is not traced, one warning
    names the reason and the fix."""
    from turbo_inductor import checkpointing

    assert getattr(torch._dynamo.config, checkpointing.SKIP_REPLAY) is True
    x = torch.randn(4, 32, requires_grad=True)
    torch.compile(SideEffectInCheckpoint(), backend="primus_turbo")(x).sum().backward()
    assert turbo_inductor.rewrite_counts()["rmsnorm"] == 1
    monkeypatch.setattr(checkpointing, "_warned", False)
    with torch._dynamo.config.patch(**{checkpointing.SKIP_REPLAY: False}):
        checkpointing.trace_checkpointed_layers()
        assert getattr(torch._dynamo.config, checkpointing.SKIP_REPLAY) is False, "the user's setting"
        torch._dynamo.reset()
        turbo_inductor.reset_records()
        with pytest.warns(UserWarning, match=r"runs eagerly.*side effect.*Fix, for a checkpointed layer: torch"):
            torch.compile(SideEffectInCheckpoint(), backend="primus_turbo")(x).sum().backward()
    assert turbo_inductor.rewrite_counts().get("rmsnorm", 0) == 0
