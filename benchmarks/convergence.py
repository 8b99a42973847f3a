"""Training convergence: the loss curves of a tiny Llama-style decoder (fixed seed and data, AdamW on a fixed
regression task) compiled with backend="inductor" and backend="primus_turbo", in high precision and with each FP8
recipe; writes the curves as JSON and a chart (PNG) and prints each column's largest deviation from Inductor's curve.

    python -m benchmarks.convergence [--steps 50] [--fp8 tensorwise,rowwise] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F

import turbo_inductor
from benchmarks.llama import CONFIGS, LlamaDecoder


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


def main(argv=None) -> dict:
    on_gpu = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--fp8", default="tensorwise,rowwise", help="FP8 recipes (comma-separated; empty: none)")
    parser.add_argument("--out", default=os.path.join("benchmarks", "results"))
    args = parser.parse_args(argv)
    device, dtype = ("cuda", torch.bfloat16) if on_gpu else ("cpu", torch.float32)
    # On CPU the FP8 GEMM is the emulation: say so rather than let the registry pick it silently.
    fp8_impl = {} if on_gpu else {"impl": "reference"}
    columns = {"inductor": ("inductor", None), "primus_turbo": ("primus_turbo", None)}
    columns.update(
        {f"primus_turbo fp8 {r}": ("primus_turbo", {"fp8": r, **fp8_impl}) for r in args.fp8.split(",") if r}
    )
    curves = {}
    for name, (backend, options) in columns.items():
        turbo_inductor.reset_records()
        curves[name] = loss_curve(backend, options, args.steps, device, dtype)
        print(
            f"{name:28s} loss {curves[name][0]:.4f} -> {curves[name][-1]:.4f}, "
            f"max deviation from inductor {max_deviation(curves[name], curves['inductor']):.2%}, "
            f"rewrites {turbo_inductor.rewrite_counts() if backend == 'primus_turbo' else {}}"
        )
    write_outputs(args.out, curves, device, dtype)
    return curves


def write_outputs(out: str, curves: dict, device: str, dtype: torch.dtype) -> None:
    os.makedirs(out, exist_ok=True)
    stem = os.path.join(out, "convergence")
    with open(stem + ".json", "w") as f:
        json.dump(
            {
                "device": device,
                "dtype": str(dtype),
                "torch": torch.__version__,
                "curves": {name: curve.tolist() for name, curve in curves.items()},
            },
            f,
            indent=1,
        )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for name, curve in curves.items():
        ax.plot(
            range(1, len(curve) + 1), curve, label=name, linewidth=1.2, linestyle="-" if name == "inductor" else "--"
        )
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    gpu = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    ax.set_title(f"tiny Llama-style decoder, AdamW, {str(dtype).replace('torch.', '')} ({gpu})", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(stem + ".png", dpi=120)
    plt.close(fig)
    print(f"wrote {stem}.json and {stem}.png")


if __name__ == "__main__":
    main()
