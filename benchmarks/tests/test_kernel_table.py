"""The per-kernel table summed by kind: the names our GPU runs record land in the kinds a floor argument needs."""

from __future__ import annotations

import json

from benchmarks import kernel_table
from benchmarks.common import launch_us


def test_kernels_of_a_saved_run_fall_in_their_kinds():
    names = {
        "void cutlass::device_kernel<at::cuda::detail::enable_3x_kernel_for_sm9x<...GemmUniversal...>>": "GEMM",
        "_grouped_wgrad_kernel": "GEMM",
        "_grouped_gemm_kernel": "GEMM",
        "nvjet_tst_256x128_64x4_2x1_v_bz_coopA_TNT": "GEMM",
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1": "attention",
        "_fp8_tile_kernel": "FP8 quantization",
        "_grouped_transposed_kernel": "FP8 quantization",
        "_dispatch_fp8_kernel": "FP8 quantization",
        "_route_kernel": "MoE routing",
        "_gather_sum_kernel": "MoE routing",
        "_rmsnorm_bwd_kernel": "our row kernels",
        "triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0": "Inductor's kernels",
        "triton_poi_fused_index_select_scatter_1": "Inductor's kernels",
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, ...>": "copies and fills",
        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL": "other",
    }
    assert {name: kernel_table.kind_of(name) for name in names} == names


def test_a_row_sums_to_its_kinds(tmp_path, capsys):
    kernels_us = {"_grouped_gemm_kernel": 300.0, "nvjet_x": 100.0, "_fp8_tile_kernel": 50.0, "weird": 50.0}
    assert kernel_table.by_kind(kernels_us) == {"GEMM": 400.0, "FP8 quantization": 50.0, "other": 50.0}
    path = tmp_path / "run.json"
    launches_us = {"_fp8_tile_kernel grid [8, 1, 1]": 10.0, "_fp8_tile_kernel grid [64, 1, 1]": 40.0, "nvjet_x": 1.0}
    rows = [{"model": "m", "column": "fp8", "kernels_us": kernels_us, "launches_us": launches_us}]
    rows.append({"model": "m", "column": "eager"})
    path.write_text(json.dumps({"environment": {"machine": "1x NVIDIA H200", "torch": "2.11"}, "rows": rows}))
    kernel_table.print_run(str(path))
    out = capsys.readouterr().out
    assert "m fp8: 0.50 ms = GEMM 0.40 ms (80%), FP8 quantization 0.05 ms (10%), other 0.05 ms (10%)" in out
    assert "eager" not in out and "grid" not in out
    kernel_table.print_run(str(path), "FP8 quantization")  # --launches: that kind's launches, slowest first
    lines = capsys.readouterr().out.splitlines()[2:]
    assert lines == [
        "         40.0 us  _fp8_tile_kernel grid [64, 1, 1]",
        "         10.0 us  _fp8_tile_kernel grid [8, 1, 1]",
    ]


def test_every_kernel_we_launch_has_a_kind():
    """A new kernel, Triton or native, lands in a kind, not in "other": a floor argument would miss its time. Native
    kernels are named as the profiler names them, in their namespace (``turbo_inductor::(anonymous namespace)::``)."""
    import pathlib
    import re

    from turbo_inductor.testing import hopper

    csrc = "".join(path.read_text() for path in pathlib.Path(__file__).parents[2].joinpath("csrc").glob("*.cu"))
    native = re.findall(r"__global__ void (?:__launch_bounds__\([^)]*\)\s*)?(\w+)", csrc)
    assert len(native) >= 8, native
    names = [*hopper.launched_kernels(), *(f"void turbo_inductor::(anonymous namespace)::{n}<float>" for n in native)]
    assert [name for name in names if kernel_table.kind_of(name) == kernel_table.OTHER] == []


def test_launch_times_split_a_kernel_by_its_grid_per_step():
    """``launch_us``: a Chrome trace's kernel events by name and launch grid, per step; host events left out."""
    trace = {
        "traceEvents": [
            {"cat": "kernel", "name": "_fp8_tile_kernel", "dur": 30.0, "args": {"grid": [64, 1, 1]}},
            {"cat": "kernel", "name": "_fp8_tile_kernel", "dur": 10.0, "args": {"grid": [64, 1, 1]}},
            {"cat": "kernel", "name": "_fp8_tile_kernel", "dur": 4.0, "args": {"grid": [8, 1, 1]}},
            {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "dur": 99.0},
        ]
    }
    assert launch_us(trace, steps=2) == {
        "_fp8_tile_kernel grid [64, 1, 1]": 20.0,
        "_fp8_tile_kernel grid [8, 1, 1]": 2.0,
    }
