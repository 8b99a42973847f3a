"""MoE blocks: torchtitan's layer and transformers' sparse MoE blocks (grouped_mm, moe_permute, moe_combine,
fp8_experts, moe_permute_fp8)."""

from __future__ import annotations

import torch

from lowering_tests.fuzz.blocks.base import Block, Expect, Setting
from turbo_inductor.recipes import RECIPES, ROW_RECIPES
from turbo_inductor.testing.moe import TitanMoE, hf_sparse_moe, transformers_masks_sentinel_rows

# Row recipes with whole-row scales: the GEMMs after an FP8 permute quantize x^T per group from x's rows where they
# lie (rowwise_with_gw_hp's wgrad takes x). Blockwise and MXFP8 x^T blocks run across groups: their rows would be
# gathered in expert order anyway, so their permute moves x in FP8 only for experts without a weight gradient.
WHOLE_ROW_RECIPES = tuple(name for name in ROW_RECIPES if RECIPES[name].activation_block[1] == 0)


def permute_fp8(s: Setting, *weights: torch.Tensor) -> Expect:
    """moe_permute_fp8 on a permute whose x_sorted only the FP8 experts of ``weights`` read: it replaces the
    moe_permute. A parameter requires grad in an inference graph too (Dynamo's fake of it, whatever the grad mode)."""
    frozen = not any(weight.requires_grad for weight in weights)
    fires = int(s.fp8 in WHOLE_ROW_RECIPES or (s.fp8 in ROW_RECIPES and frozen))
    return Expect().fired(moe_permute_fp8=fires).left(moe_permute=-fires, moe_permute_fp8=fires)


class TitanMoEBlock(Block):
    """torchtitan's MoE layer (testing/moe.py): its experts run in bf16 whatever the model's dtype."""

    kind = "titan_moe"
    moe = True
    precision = torch.bfloat16

    def __init__(self, rng, s):
        super().__init__(rng, s)
        experts = self.choose(rng, "experts", [2, 3, 4, 8])
        top_k = self.choose(rng, "top_k", [k for k in (1, 2, 3) if k <= experts])
        self.shared = self.choose(rng, "shared_expert", [True, False])
        self.scores_first = self.choose(rng, "scores before experts", [True, False])
        self.layer = TitanMoE(
            s.hidden,
            self.choose(rng, "expert width", s.widths),
            experts,
            top_k,
            score_func=self.choose(rng, "scores", ["softmax", "sigmoid"]),
            score_before_experts=self.scores_first,
            shared_expert=self.shared,
        ).to(s.dtype)
        self.setting = s

    def expect(self):
        s, shared = self.setting, int(self.shared)
        # Weighted in fp32 after the experts, rows in bf16 added to an fp32 model's stream: the combine would sum
        # in bf16, so it is left alone.
        combine = int(self.scores_first or s.dtype == torch.bfloat16)
        expect = Expect().fired(grouped_mm=3, moe_permute=1, moe_combine=combine, glu=1 + shared)
        expect.left(moe_permute=1, moe_combine=combine)
        if s.fp8 is None:
            return expect.left(grouped_mm=3, glu=1 + shared)
        expect.fired(fp8=3 * shared, fp8_experts=3).left(fp8_linear=3 * shared, fp8_grouped_mm=3)
        # In an fp32 model, x_sorted is read by its casts to the experts' bf16, scores before the experts by their
        # product: the permute then stays.
        if s.dtype == self.layer.expert_dtype and not self.scores_first:
            expect.add(permute_fp8(s, self.layer.w1, self.layer.w3))
        # the shared expert's w1 and w3 read one x: concatenated, their outputs are the halves of one
        width = self.layer.shared.w1.out_features if self.shared else 0
        concatenated = int(self.shared and RECIPES[s.fp8].concatenates_exactly([width, width]))
        expect.fired(fp8_concat=concatenated).left(fp8_linear=-concatenated)
        shared_x = int(self.shared and not concatenated)  # w1 and w3 share x's quantization
        expect.fired(fp8_shared_input=shared_x).left(fp8_shared_input=shared_x)
        if s.fp8_producers:
            return expect.fired(glu_fp8=1 + shared).left(glu_fp8=1 + shared)
        return expect.left(glu=1 + shared - concatenated, glu_fused=concatenated)

    def forward(self, x):
        return self.layer(x)


class HFMoEBlock(Block):
    """transformers' own sparse MoE block (Mixtral's or Qwen3-MoE's), its experts run by ``grouped_mm``."""

    kind = "hf_moe"
    moe = True

    def __init__(self, rng, s, masks: bool | None = None):
        super().__init__(rng, s)
        experts = self.choose(rng, "experts", [2, 3, 4, 8])
        self.layer = hf_sparse_moe(
            self.choose(rng, "family", ["mixtral", "qwen3_moe"]),
            s.hidden,
            self.choose(rng, "expert width", s.widths),
            experts,
            # top-1: the weights, normalized over the choices, are 1: the router's gradient is rounding noise only
            self.choose(rng, "top_k", [k for k in (2, 3) if k <= experts]),
            self.choose(rng, "expert parallel masks", [False, True] if masks is None else [masks]),
        ).to(s.dtype)
        self.setting = s

    def expect(self):
        expect = Expect().fired(grouped_mm=2, moe_permute=1, moe_combine=1, glu=1).left(moe_permute=1, moe_combine=1)
        masks = self.choices["expert parallel masks"] or transformers_masks_sentinel_rows()
        expect.fired(moe_sentinel_mask=int(masks))
        if self.setting.fp8 is None:
            return expect.left(grouped_mm=2, glu_fused=1)
        expect.fired(fp8_experts=2).left(fp8_grouped_mm=2)
        expect.add(permute_fp8(self.setting, self.layer.experts.gate_up_proj))
        if self.setting.fp8_producers:
            return expect.fired(glu_fp8=1).left(glu_fp8=1)
        return expect.left(glu_fused=1)

    def forward(self, x):
        out = self.layer(x)
        return out[0] if isinstance(out, tuple) else out
