"""The cross_entropy pass: ``F.cross_entropy`` rewritten (counts, the kernel running, results equal to
backend="inductor", near misses left alone), and the compiled loss launching the kernel at a real vocabulary."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import turbo_inductor
from turbo_inductor.kernels.triton import interpreting as triton_interpreting
from turbo_inductor.testing import DEVICE
from turbo_inductor.testing.compare import (
    assert_left_alone,
    assert_matches_inductor,
    assert_ran,
    ops_after,
    rewrites_without_compiling,
)
from turbo_inductor.testing.tolerance import assert_close

IGNORE = -100


class LMHeadLoss(nn.Module):
    """A causal LM's head and loss as transformers writes them (ForCausalLMLoss): the bf16 logits upcast, viewed
    as rows, cross-entropy over the shifted labels; ``num_items`` gives the sum divided by the count."""

    def __init__(self, hidden=32, vocab=300, dtype=torch.bfloat16, style="hf"):
        super().__init__()
        self.lm_head = nn.Linear(hidden, vocab, bias=False, dtype=dtype)
        self.vocab, self.style = vocab, style

    def forward(self, h, labels):
        logits = self.lm_head(h)
        shifted = F.pad(labels, (0, 1), value=IGNORE)[..., 1:]
        if self.style == "hf":
            rows = logits.float().view(-1, self.vocab)
            return F.cross_entropy(rows, shifted.reshape(-1), ignore_index=IGNORE), logits
        if self.style == "hf_num_items":
            rows = logits.float().view(-1, self.vocab)
            total = F.cross_entropy(rows, shifted.reshape(-1), ignore_index=IGNORE, reduction="sum")
            return total / (shifted != IGNORE).sum()
        if self.style == "module":  # nn.CrossEntropyLoss on logits already in fp32
            return nn.CrossEntropyLoss()(logits.reshape(-1, self.vocab), shifted.reshape(-1))
        if self.style == "smoothing":
            return F.cross_entropy(logits.float().view(-1, self.vocab), shifted.reshape(-1), label_smoothing=0.1)
        if self.style == "bf16":  # no upcast: cross_entropy computes in bf16, which the op does not
            return F.cross_entropy(logits.view(-1, self.vocab), shifted.reshape(-1))
        raise AssertionError(self.style)


def lm_inputs(dtype=torch.bfloat16, vocab=300):
    h = torch.randn(2, 8, 32, device=DEVICE, dtype=dtype)
    labels = torch.randint(0, vocab, (2, 8), device=DEVICE)
    labels[:, :2] = IGNORE
    return h, labels


def test_hugging_face_loss_reads_the_bf16_logits_in_training():
    model, inputs = LMHeadLoss().to(DEVICE), lm_inputs()
    counts = assert_matches_inductor(model, inputs)
    assert counts["cross_entropy"] == 1
    assert ops_after("turbo_inductor.cross_entropy") == 1
    assert ops_after("Tensor.float") == 0, "no fp32 copy of the logits"
    assert_ran("cross_entropy_fwd", 1)
    assert_ran("cross_entropy_bwd", 1)
    assert turbo_inductor.compile_records()[-1].implementations["cross_entropy_bwd"][0] == (
        "triton" if DEVICE == "cuda" or triton_interpreting() else "reference"
    )


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_logits_of_an_fp8_lm_head_take_the_gradient_inductor_fuses(recipe):
    """The reference gradient is tensor math: Inductor fuses it into the FP8 LM head's quantization of dy."""
    model, inputs = LMHeadLoss(vocab=320).to(DEVICE), lm_inputs(vocab=320)
    counts = rewrites_without_compiling(model, inputs, options={"fp8": recipe})
    assert counts["fp8"] == 1 and counts["cross_entropy"] == 1
    assert turbo_inductor.compile_records()[-1].implementations["cross_entropy_bwd"] == ["reference"]


@pytest.mark.parametrize("style", ["hf_num_items", "module"])
def test_other_spellings_are_rewritten(style):
    dtype = torch.float32 if style == "module" else torch.bfloat16
    model, inputs = LMHeadLoss(dtype=dtype, style=style).to(DEVICE), lm_inputs(dtype)
    assert rewrites_without_compiling(model, inputs)["cross_entropy"] == 1
    assert_matches_inductor(model, inputs)


class ClassLoss(nn.Module):
    """Logits of a bf16 head upcast to fp32, cross-entropy with ``ignore_index`` a class and ``reduction`` given."""

    def __init__(self, ignore_index, reduction, vocab=24):
        super().__init__()
        self.head = nn.Linear(32, vocab, bias=False, dtype=torch.bfloat16)
        self.ignore_index, self.reduction = ignore_index, reduction

    def forward(self, h, target):
        logits = self.head(h).float()
        return F.cross_entropy(logits, target, ignore_index=self.ignore_index, reduction=self.reduction)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_ignore_index_and_reduction_reach_the_op(reduction):
    """A class as ``ignore_index`` (rows of class 3 are padding) and every reduction: the op takes both, forward and
    backward, as torch computes them. -100 in its place would count class 3's rows; another reduction, another
    shape or sum."""
    h = torch.randn(12, 32, device=DEVICE, dtype=torch.bfloat16)
    target = torch.randint(0, 24, (12,), device=DEVICE)
    target[::4] = 3
    assert 0 < (target == 3).sum() < 12
    model = ClassLoss(3, reduction).to(DEVICE)
    counts = assert_matches_inductor(model, [h, target])
    assert counts["cross_entropy"] == 1
    assert ops_after("turbo_inductor.cross_entropy") == 1 and ops_after("Tensor.float") == 0
    assert_ran("cross_entropy_fwd", 1)
    assert_ran("cross_entropy_bwd", 1)


@pytest.mark.parametrize("style", ["smoothing", "bf16"])
def test_near_misses_are_left_alone(style):
    assert_left_alone(LMHeadLoss(style=style).to(DEVICE), lm_inputs())


@pytest.mark.skipif(DEVICE != "cuda", reason="compiled code launches Triton kernels on a GPU only")
def test_compiled_loss_launches_the_kernel_at_a_real_vocabulary():
    from torch._inductor.utils import run_and_get_code

    model = LMHeadLoss(hidden=256, vocab=32064).to(DEVICE)
    h = torch.randn(4, 256, 256, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, 32064, (4, 256), device=DEVICE)
    compiled = torch.compile(model, backend="primus_turbo")

    def step():
        loss, logits = compiled(h, labels)
        loss.backward()
        return loss, logits

    (loss, logits), codes = run_and_get_code(step)
    code = "\n".join(codes)
    assert "_cross_entropy_fwd_kernel" in code and "_cross_entropy_bwd_kernel" in code
    assert "torch.ops.turbo_inductor" not in code
    rows = logits.detach().double().view(-1, 32064).requires_grad_()
    expected = F.cross_entropy(rows, F.pad(labels, (0, 1), value=IGNORE)[..., 1:].reshape(-1), ignore_index=IGNORE)
    assert_close(loss, expected, torch.float32)
    expected.backward()
    assert_close(h.grad, (rows.grad @ model.lm_head.weight.double()).view_as(h), torch.bfloat16)
