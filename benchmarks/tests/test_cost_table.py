"""The shipped FP8 cost table (``turbo_inductor/costs/``) is what ``benchmarks.cost_table`` makes of the committed
runs it names."""

import json

import pytest

from benchmarks import cost_table
from benchmarks.runs import RESULTS
from turbo_inductor import costs


@pytest.mark.cost_tables
def test_the_shipped_table_is_what_its_runs_make(tmp_path):
    shipped = json.loads((costs.HERE / "nvidia-h200.json").read_text())
    sources = {entry["source"].split(" ")[0] for kind in (costs.GROUPED_MM, costs.LINEAR) for entry in shipped[kind]}
    cost_table.main([str(RESULTS / name) for name in sorted(sources)] + ["--out", str(tmp_path)])
    assert json.loads((tmp_path / "nvidia-h200.json").read_text()) == shipped


def test_a_row_costs_its_gpu_time_where_the_run_recorded_it():
    shape = "linear 8192x2048->2048"
    rows = [
        {"shape": shape, "mode": "fwd+bwd", "backend": "inductor", "ms": 0.43, "gpu_ms": 0.41},
        {"shape": shape, "mode": "fwd+bwd", "backend": "primus_turbo fp8 rowwise", "ms": 1.15, "gpu_ms": 0.35},
        {"shape": shape, "mode": "fwd+bwd", "backend": "primus_turbo fp8 tensorwise", "ms": 1.27},
        {"shape": shape, "mode": "fwd", "backend": "primus_turbo fp8 blockwise", "ms": 0.1, "gpu_ms": 0.1},
    ]
    table = cost_table.entries({"benchmark": "fp8", "rows": rows}, "fp8.json")
    assert table[costs.LINEAR] == [
        {
            "groups": 1,
            "rows": 8192,
            "k": 2048,
            "n": 2048,
            "ms": {costs.HIGH_PRECISION: 0.41, "rowwise": 0.35, "tensorwise": 1.27},
            "source": "fp8.json",
        }
    ]


def test_a_grouped_row_times_an_implementation_that_waits_on_the_gpu_by_gpu_time_while_its_host_keeps_up():
    """The others' launches run ahead in a compiled graph: their GPU time, however long an eager call kept the host
    (Qwen3-MoE's down, 1.12 ms wall against 0.79 GPU, on an H100). One that reads offs on the host (one GEMM per
    group): its GPU time at Mixtral's 8 groups, its wall time at Qwen3-MoE's 128, where its host lags."""
    mixtral = "mixtral-8x7b down [8192, 14336] x [8, 14336, 4096]"
    qwen3 = "qwen3-30b-a3b down [32768, 768] x [128, 768, 2048]"
    rows = [
        {"shape": mixtral, "mode": "fwd+bwd", "column": "grouped_mm impl=auto", "ms": 5.74, "gpu_ms": 4.77},
        {"shape": mixtral, "mode": "fwd+bwd", "column": "grouped_mm impl=vendor_per_group", "ms": 4.60, "gpu_ms": 4.2},
        {"shape": mixtral, "mode": "fwd+bwd", "column": "grouped_mm impl=triton", "ms": 6.1, "gpu_ms": 5.2},
        {"shape": mixtral, "mode": "fwd+bwd", "column": "fp8 rowwise auto", "ms": 4.5, "gpu_ms": 4.41},
        {"shape": mixtral, "mode": "fwd", "column": "grouped_mm impl=vendor", "ms": 1.0, "gpu_ms": 1.0},
        {"shape": qwen3, "mode": "fwd+bwd", "column": "grouped_mm impl=auto", "ms": 1.12, "gpu_ms": 0.79},
        {"shape": qwen3, "mode": "fwd+bwd", "column": "grouped_mm impl=vendor_per_group", "ms": 14.9, "gpu_ms": 2.0},
    ]
    big, small = cost_table.entries({"benchmark": "grouped_mm", "rows": rows}, "grouped_mm.json")[costs.GROUPED_MM]
    assert (big["groups"], big["rows"], big["k"], big["n"]) == (8, 8192, 14336, 4096)
    assert big["ms"] == {
        costs.HIGH_PRECISION: 4.77,
        costs.implementation_key("auto"): 4.77,
        costs.implementation_key("vendor_per_group"): 4.2,
        costs.implementation_key("triton"): 5.2,
        "rowwise": 4.41,
    }
    assert small["ms"] == {
        costs.HIGH_PRECISION: 0.79,
        costs.implementation_key("auto"): 0.79,
        costs.implementation_key("vendor_per_group"): 14.9,
    }
