"""A short training run whose loss curve the backends are compared by: a tiny Llama-style decoder, fixed seed, data and
regression task, AdamW. The convergence benchmark (``benchmarks/convergence.py``) and the FP8 tests run it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from turbo_inductor.testing.llama import CONFIGS, LlamaDecoder


def loss_curve(
    backend: str, options: dict | None = None, steps: int = 50, device: str = "cpu", dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Losses of ``steps`` AdamW steps of the tiny decoder compiled with ``backend``; same seed, data and task for
    every backend."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    config = CONFIGS["tiny"]
    model = LlamaDecoder(config).to(device, dtype)
    x = torch.randn(2, 32, config.hidden, device=device, dtype=dtype)
    target = torch.randn(2, 32, config.hidden, device=device, dtype=dtype)
    compiled = torch.compile(model, backend=backend, options=options)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    curve = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(compiled(x).float(), target.float())
        loss.backward()
        optimizer.step()
        curve.append(loss.item())
    return torch.tensor(curve)


def max_deviation(curve: torch.Tensor, reference: torch.Tensor) -> float:
    """The largest relative difference of a loss curve from the reference curve, over all steps."""
    return ((curve - reference).abs() / reference).max().item()
