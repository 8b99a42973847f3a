"""The floor of an MoE model's FP8 step from its saved kernel table: quantization moved to the bytes it must move at
copy bandwidth, the experts' GEMMs to the best published rates, each from the numbers the run and the bench saved."""

from __future__ import annotations

import json

import pytest

from benchmarks import floor

MODEL = {"hidden_size": 64, "intermediate_size": 128, "num_local_experts": 4, "num_experts_per_tok": 2, "layers": 2}
COLUMN = "primus_turbo fp8 rowwise experts"
CUTLASS_GROUPED = "_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalINS1_17GroupProblemShapeIN4cute5tupleE"


def _run(kernels_us: dict) -> dict:
    rows = [
        {"model": "mixtral-8x7b", "column": "inductor", "step_ms": 40.0},
        {"model": "mixtral-8x7b", "column": "primus_turbo", "step_ms": 36.0},
        {"model": "mixtral-8x7b", "column": COLUMN, "step_ms": 32.0, "kernels_us": kernels_us},
    ]
    configuration = {"batch": 2, "seq": 1024, "models": {"mixtral-8x7b": MODEL}}
    environment = {"machine": "1x NVIDIA H200"}
    return {"benchmark": "model", "configuration": configuration, "rows": rows, "environment": environment}


# Two bench rows: a copy at 4 TB/s (2.0 TB/s at 50%) and at 3 TB/s.
QUANT = {
    "rows": [
        {"shape": "mixtral-8x7b gate_up W", "mode": "rowwise both layouts", "rate": 2.0, "copy_pct": 50.0},
        {"shape": "mixtral-8x7b down x", "mode": "grouped transposed", "rate": 1.5, "copy_pct": 50.0},
    ],
    "environment": {"machine": "1x NVIDIA H200"},
}


def test_quantization_moves_its_bytes_at_the_fastest_copy_and_gemms_run_at_the_best_rates():
    kernels_us = {
        "_fp8_tile_kernel": 4000.0,
        "_grouped_transposed_kernel": 2000.0,
        "_dispatch_fp8_kernel": 500.0,
        CUTLASS_GROUPED: 20000.0,
        "nvjet_dense": 3000.0,  # a dense GEMM: kept
    }
    f = floor.model_floor(_run(kernels_us), QUANT, "mixtral-8x7b", COLUMN)
    assert f["quantization_ms"] == pytest.approx(6.5)
    assert f["copy_tbps"] == pytest.approx(4.0)
    # per layer at 4 bytes an element: W 4 experts x 64 x 384; x 2048 x 64, then 4096 rows x (256 + 128 + 64)
    gigabytes = 2 * 4 * (4 * 64 * 384 + 2048 * 64 + 4096 * 448) / 1e9
    assert f["quantization_gb"] == pytest.approx(gigabytes)
    assert f["quantization_at_copy_ms"] == pytest.approx(gigabytes / 4.0)
    # 4096 rows x 64 x 3 x 128 x 2 FLOPs per layer, 2 layers
    tflop = 2 * 4096 * 64 * 384 * 2 / 1e12
    assert f["expert_tflop_per_pass"] == pytest.approx(tflop)
    best_ms = 1e3 * tflop * (2 / 1346 + 1 / 873)
    assert f["expert_gemms_at_best_ms"] == pytest.approx(best_ms)
    at_copy = 32 - 6.5 + gigabytes / 4.0
    assert f["measured"] == pytest.approx(40 / 32)
    assert f["quantization_at_copy"] == pytest.approx(40 / at_copy)
    assert f["and_gemms_at_best"] == pytest.approx(40 / (at_copy - (20 - best_ms)))
    assert (f["baseline"], f["baseline_ms"], f["target"]) == ("inductor", 40.0, 1.30)


def test_an_expert_gemm_moves_each_operand_once_per_layout():
    shape = "mixtral-8x7b gate_up [256, 64] x [4, 64, 128]"
    kernels_us = {"_fp8_tile_kernel": 300.0, "_grouped_transposed_kernel": 100.0, CUTLASS_GROUPED: 1000.0}
    rows = [
        {"shape": shape, "mode": "fwd+bwd", "column": "bf16 torch._grouped_mm", "ms": 2.0},
        {"shape": shape, "mode": "fwd+bwd", "column": "fp8 rowwise auto", "ms": 1.6, "kernels_us": kernels_us},
        {"shape": shape, "mode": "fwd", "column": "fp8 rowwise auto", "ms": 9.0},
    ]
    (f,) = floor.floors({"benchmark": "grouped_mm", "rows": rows}, QUANT, "fp8 rowwise auto")
    # W, x and dy each read once and written in two FP8 layouts
    gigabytes = 4 * (4 * 64 * 128 + 256 * 64 + 256 * 128) / 1e9
    assert f["quantization_gb"] == pytest.approx(gigabytes)
    assert f["expert_tflop_per_pass"] == pytest.approx(2 * 256 * 64 * 128 / 1e12)
    at_copy = 1.6 - 0.4 + gigabytes / 4.0
    assert f["quantization_at_copy"] == pytest.approx(2.0 / at_copy)
    assert (f["baseline"], f["target"]) == ("bf16 torch._grouped_mm", 1.40)


def test_the_command_prints_and_saves_each_models_floor(tmp_path, capsys, monkeypatch):
    run, quant, out = tmp_path / "run.json", tmp_path / "quant.json", tmp_path / "floor.json"
    run.write_text(json.dumps(_run({"_fp8_tile_kernel": 1000.0, CUTLASS_GROUPED: 5000.0})))
    quant.write_text(json.dumps(QUANT))
    monkeypatch.setattr("sys.argv", ["floor", str(run), "--quant", str(quant), "--out", str(out)])
    floor.main()
    printed = capsys.readouterr().out
    assert f"mixtral-8x7b {COLUMN}: measured 1.250x (32.00 ms, inductor 40.00)" in printed
    saved = json.loads(out.read_text())
    assert saved["configuration"]["sources"] == [str(run), str(quant)]
    assert saved["environment"] == {"machine": "1x NVIDIA H200"}
    assert [row["quantization_ms"] for row in saved["rows"]] == [pytest.approx(1.0)]
