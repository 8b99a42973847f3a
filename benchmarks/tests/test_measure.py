"""The main job's measurements that need no GPU: what a step saves for its backward, told apart by kind."""

from __future__ import annotations

import torch

from benchmarks.measure import saved_for_backward


class _SavesACopyOfW(torch.autograd.Function):
    """y = x W^T, saving x twice (a view of it), W itself and a copy of W, as an FP8 linear saves W quantized."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, x[: x.shape[0] // 2], w, w * 2)
        return x @ w.t()

    @staticmethod
    def backward(ctx, dy):
        x, _, _, w2 = ctx.saved_tensors
        return dy @ w2 / 2, dy.t() @ x


class _Step:
    def __init__(self):
        self.model = torch.nn.Linear(64, 32, bias=False)
        self.x = torch.empty(16, 64)

    def draw(self, k: int) -> None:
        self.x.copy_(torch.randn(self.x.shape, generator=torch.Generator().manual_seed(k)))

    def __call__(self):
        out = _SavesACopyOfW.apply(self.x, self.model.weight)
        out.sum().backward()  # saves nothing of its own
        return out


def test_saved_memory_tells_activations_from_weight_copies_and_counts_a_storage_once():
    step = _Step()
    saved = saved_for_backward(step, step.draw)
    gib = 4 / 2**30  # bytes of an fp32 element
    assert saved["saved_gib_by_kind"] == {
        "activations float32": 16 * 64 * gib,  # x and its view: one storage
        "weights and constants float32": 32 * 64 * gib,  # W * 2; W itself is the parameter's
    }
    assert saved["saved_gib"] == sum(saved["saved_gib_by_kind"].values())
    x = step.x.clone()
    step.draw(0)
    assert torch.equal(step.x, x), "input 0 is drawn back"
