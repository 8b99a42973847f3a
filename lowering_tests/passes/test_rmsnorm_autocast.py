"""The rmsnorm_autocast pass: under autocast with fp32 parameters, a norm whose every use autocast casts to bf16
(its linears) writes bf16 itself. The output is the same; the norm's gradient comes back in bf16."""

import pytest
import torch
import torch.nn as nn

import turbo_inductor
from turbo_inductor.testing import DEVICE, hf
from turbo_inductor.testing.compare import run
from turbo_inductor.testing.hf import CausalLMLoss
from turbo_inductor.testing.llama import RMSNorm
from turbo_inductor.testing.tolerance import snr_db

# on CPU the reference kernels: the Triton interpreter rounds some bf16 stores the other way
IMPL = {"impl": "reference"} if DEVICE == "cpu" else {}


def assert_same_output(got, want):
    """Bit for bit with the reference kernels (CPU); on the GPU at bf16's noise: the Triton kernel compiled to store
    bf16 may sum a row in another order than the one storing fp32 (system/test_gpu.py: within an ulp)."""
    if DEVICE == "cpu":
        assert torch.equal(got, want)
    else:
        assert snr_db(got, want) >= 40


def counts_and_results(model, inputs, **options):
    turbo_inductor.reset_records()
    with torch.autocast(DEVICE, torch.bfloat16):
        results = run(model, inputs, "primus_turbo", options={**IMPL, **options})
    return turbo_inductor.rewrite_counts(), results


def test_an_hf_llamas_norms_write_their_linears_bf16_input():
    """Both norms of the layer (q/k/v's and gate/up's) and the final one (the LM head's) write bf16. The loss is
    the same as without the pass (:func:`assert_same_output`); each gradient within a bf16 rounding of the norm's
    gradient."""
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = CausalLMLoss(hf.build("llama3-8b", 1, tiny=True)).to(DEVICE)
    ids = torch.randint(0, hf.TINY["vocab_size"], (2, 16), device=DEVICE)
    counts, (loss, grads) = counts_and_results(model, [ids])
    assert counts["rmsnorm_autocast"] == 3
    _, (want, want_grads) = counts_and_results(model, [ids], rmsnorm_autocast=False)
    assert_same_output(loss[0], want[0])
    for got, expected in zip(grads, want_grads):
        assert got.dtype == expected.dtype == torch.float32 and snr_db(got, expected) >= 40


class NormThenLinear(nn.Module):
    def __init__(self, also_read_uncast: bool = False):
        super().__init__()
        self.norm, self.linear, self.also_read_uncast = RMSNorm(64, 1e-6), nn.Linear(64, 32), also_read_uncast

    def forward(self, x):
        h = self.norm(x)
        y = self.linear(h.view(-1, 64))
        return (y, h * 2) if self.also_read_uncast else y


@pytest.mark.parametrize(
    "model, autocast, fires",
    [
        (NormThenLinear(), True, 1),  # through a view: the pair of casts does not fold, the fp32 copy still goes
        (NormThenLinear(also_read_uncast=True), True, 0),  # h * 2 reads the fp32 value
        (NormThenLinear(), False, 0),  # no autocast: nothing casts
    ],
    ids=["linear-after-view", "read-uncast", "no-autocast"],
)
def test_only_a_norm_every_use_of_which_autocast_casts(model, autocast, fires):
    x = torch.randn(4, 8, 64, device=DEVICE)
    model = model.to(DEVICE)
    turbo_inductor.reset_records()
    with torch.autocast(DEVICE, torch.bfloat16, enabled=autocast):
        got = run(model, [x], "primus_turbo", options=IMPL)
        assert turbo_inductor.rewrite_counts()["rmsnorm_autocast"] == fires
        want = run(model, [x], "primus_turbo", options={**IMPL, "rmsnorm_autocast": False})
    for g, w in zip(got[0], want[0]):
        assert_same_output(g, w)
    for g, w in zip(got[1], want[1]):
        assert snr_db(g, w) >= 40
