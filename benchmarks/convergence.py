"""Training convergence: the loss curves of a tiny Llama-style decoder (fixed seed, data and regression task, AdamW)
under Inductor and primus_turbo, in high precision and per FP8 recipe, each against Inductor's curve.
``python -m benchmarks.convergence [--steps 50] [--fp8 tensorwise,rowwise] [--out DIR]``"""

from __future__ import annotations

import argparse

import torch

import turbo_inductor
from benchmarks import chart, record
from turbo_inductor.testing.convergence import loss_curve, max_deviation


def main(argv=None) -> dict:
    on_gpu = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.split("``")[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--fp8", default="tensorwise,rowwise", help="FP8 recipes (comma-separated; empty: none)")
    parser.add_argument("--out", default=None, help="folder for the JSON and PNG (default: $OUT, else benchmarks/out)")
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
    rows = [
        {
            "column": name,
            "first_loss": curve[0].item(),
            "last_loss": curve[-1].item(),
            "max_deviation_vs_inductor": max_deviation(curve, curves["inductor"]),
            "losses": curve.tolist(),
        }
        for name, curve in curves.items()
    ]
    configuration = {**vars(args), "device": device, "dtype": str(dtype).removeprefix("torch.")}
    path = record.write("convergence", record.changed_options(parser, args, {"out"}), configuration, rows, args.out)
    chart.write_chart(path)
    return curves


if __name__ == "__main__":
    main()
