"""Hugging Face model families other than Llama (tiny configs, built from code) train in FP8 under autocast with fp32
parameters, as the Trainer's mixed precision runs them: what each family's spelling lets the passes fuse."""

import pytest
import torch

import turbo_inductor
from turbo_inductor.testing import DEVICE, hf
from turbo_inductor.testing.compare import masked_attentions, rewrites_without_compiling, run
from turbo_inductor.testing.moe import transformers_masks_sentinel_rows
from turbo_inductor.testing.tolerance import snr_db, snr_spread_db

pytest.importorskip("transformers")

LAYERS = 1  # one layer holds every fusion site: the input norm, the residual norms, the GLU
# family: (model, rewrites expected), each model as its transformers class builds it at tiny sizes. Every linear
# becomes FP8 (q/k/v/o, gate/up/down, the head). q/k/v and gate/up, each reading one x, run as one FP8 linear over
# their weights concatenated (fp8_concat): o, down and the head stay single, 2 per layer + 1. Phi-3's qkv and
# gate_up are fused already: 4 per layer + 1. Every norm but the final one (which reads the last residual add)
# writes its linears' FP8 input, and so does each GLU (Gemma's too, which weights its norms by 1 + w in fp32 and
# casts back after). Each model's token embedding and loss become ours. So do q's and k's rotary embedding: with
# fp32 parameters the table is fp32 and ``q * cos`` promotes bf16 q, but attention casts the result back to bf16
# (passes/test_rotary.py). A causal mask built in the graph becomes SDPA's ``is_causal`` where transformers builds
# one (testing.compare.masked_attentions).
ENDS = dict(embedding=1, cross_entropy=1, rotary=2 * LAYERS)
NORMS = dict(rmsnorm_residual=1, rmsnorm_fp8=2 * LAYERS, glu_fp8=LAYERS, **ENDS)
# Separate q/k/v and gate/up projections, concatenated per input.
SEPARATE_PROJECTIONS = dict(fp8=2 * LAYERS + 1, fp8_concat=2 * LAYERS, **NORMS)
FAMILIES = {
    "qwen2": ("qwen2.5-7b", SEPARATE_PROJECTIONS),  # q/k/v with biases
    "phi3": ("phi3-mini", dict(fp8=4 * LAYERS + 1, **NORMS)),
    "gemma": ("gemma-7b", SEPARATE_PROJECTIONS),
    "qwen3": ("qwen3-8b", dict(rmsnorm=2 * LAYERS, **SEPARATE_PROJECTIONS)),  # q's and k's norms, per head
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_trains_in_fp8_under_autocast(family):
    """The rewrites each family's spelling allows; the loss within 0.5% of Inductor's bf16 autocast; every gradient
    (fp32) at the FP8 backward gate, 20 dB. Where a tiny random model's own FP8 noise is above that gate (Qwen2's
    weakest gradient: 19.3 dB), a gradient may be no worse than the ideal emulation's (the same FP8 linears with
    every fusion around them off) by more than two SNRs of its size spread by chance: a norm's 64-element gradient
    by 2.2 dB."""
    name, expected = FAMILIES[family]
    torch.manual_seed(0)
    model = hf.CausalLMLoss(hf.build(name, LAYERS, tiny=True)).to(DEVICE)
    input_ids = torch.randint(0, hf.TINY["vocab_size"], (2, 16), device=DEVICE)
    # on CPU the reference kernels: the Triton interpreter's FP8 stores round ~2% of values wrongly
    options = {"fp8": "rowwise", **({"impl": "reference"} if DEVICE == "cpu" else {})}
    with torch.autocast(DEVICE, torch.bfloat16):
        masks = masked_attentions(model, [input_ids])
        assert masks in (0, LAYERS)
        expected = {**expected, **({"causal_mask": masks} if masks else {})}
        inductor = run(model, [input_ids], "inductor")
        turbo_inductor.reset_records()
        ours = run(model, [input_ids], "primus_turbo", options=options)
        assert {k: v for k, v in turbo_inductor.rewrite_counts().items() if v} == expected
        ideal = None
        if any(snr_db(got, want) < 20 for got, want in zip(ours[1], inductor[1])):
            unfused = {name: False for name in ("rmsnorm", "rmsnorm_residual", "glu", "rmsnorm_fp8", "glu_fp8")}
            ideal = run(model, [input_ids], "primus_turbo", options={**options, **unfused})
    torch.testing.assert_close(ours[0][0], inductor[0][0], rtol=5e-3, atol=0)
    assert len(ours[1]) == len(inductor[1])
    for i, (got, want) in enumerate(zip(ours[1], inductor[1])):
        assert got.dtype == want.dtype == torch.float32
        snr = snr_db(got, want)
        assert snr >= 20 or snr >= snr_db(ideal[1][i], want) - snr_spread_db(want.numel()), (i, snr)


def test_mistral_gets_llamas_rewrites():
    """Mistral's modeling code is Llama's, whose numerics test_hf_llama checks: here its rewrites alone."""
    model = hf.CausalLMLoss(hf.build("mistral-7b", LAYERS, tiny=True)).to(DEVICE)
    input_ids = torch.randint(0, hf.TINY["vocab_size"], (2, 16), device=DEVICE)
    with torch.autocast(DEVICE, torch.bfloat16):
        masks = masked_attentions(model, [input_ids])
        counts = rewrites_without_compiling(model, [input_ids], options={"fp8": "rowwise"})
    assert {k: v for k, v in counts.items() if v} == {
        **FAMILIES["qwen2"][1],
        **({"causal_mask": masks} if masks else {}),
    }


@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen3-30b-a3b"])
def test_moe_families_get_the_routing_and_expert_rewrites(name):
    """transformers' Mixtral and Qwen3-MoE: experts as 3-D parameters through its grouped_mm. Both grouped GEMMs
    become FP8 experts (forced), the routing and its inverse our permute (in FP8) and combine, and the experts' GLU
    writes the down GEMM's FP8 input; the router (N, the number of experts, under 16) stays. Qwen3's q and k norms
    stay plain norms."""
    model = hf.CausalLMLoss(hf.build(name, LAYERS, tiny=True)).to(DEVICE, torch.bfloat16)
    input_ids = torch.randint(0, hf.TINY["vocab_size"], (2, 16), device=DEVICE)
    masks = masked_attentions(model, [input_ids])
    # on a GPU, "auto" would ask its cost table, which measured no model this small
    options = {"fp8": {"recipe": "rowwise", "experts": True}}
    counts = rewrites_without_compiling(model, [input_ids], options=options)
    expected = dict(fp8=LAYERS + 1, fp8_concat=LAYERS, fp8_experts=2 * LAYERS, rmsnorm_residual=2 * LAYERS)
    # the permute feeds FP8 experts only: it moves x's FP8 rows and scales (moe_permute_fp8)
    expected |= dict(moe_permute_fp8=LAYERS, moe_combine=LAYERS, rmsnorm_fp8=LAYERS, glu_fp8=LAYERS, **ENDS)
    expected |= {"rmsnorm": 2 * LAYERS} if name == "qwen3-30b-a3b" else {}
    expected |= {"causal_mask": masks} if masks else {}
    expected |= {"moe_sentinel_mask": LAYERS} if transformers_masks_sentinel_rows() else {}
    assert {k: v for k, v in counts.items() if v} == expected
