"""The benchmarks' results as data: the JSON each run writes, and the READMEs generated from it (no compiles)."""

import argparse
import copy
import json
import pathlib
import random
import re

import pytest

import benchmarks
from benchmarks import chart, goals, record, report, runs, sections
from benchmarks import summary as performance
from turbo_inductor.testing import hide_package
from turbo_inductor.testing.docs import generated

BENCHMARKS_DIR = pathlib.Path(benchmarks.__file__).resolve().parent
ENVIRONMENT = {
    "machine": "1x NVIDIA H200",
    "torch": "2.11.0+cu130",
    "triton": "3.6.0",
    "torchao": None,
    "python": "3.12.3",
    "date": "2026-12-01T10:00:00+00:00",
    "command": ["python3", "-m", "benchmarks.x"],
}


def op_rows(cases, modes, backends, gpu=True):
    """Rows as the op benchmarks write them; a backend's time is Inductor's over its index + 1."""
    rows = []
    for case in cases:
        for mode in modes:
            for n, backend in enumerate(backends):
                ratio = 1.0 if backend == "inductor" else 1.0 + 0.1 * (n + 1)
                row = {"shape": case, "mode": mode, "backend": backend, "ms": 0.5 / ratio, "rate": 1.0}
                row["speedup_vs_inductor"] = ratio
                if gpu:
                    row.update(gpu_ms=0.4 / ratio, gpu_speedup_vs_inductor=ratio)
                rows.append(row)
    return rows


def result(benchmark, rows, **extra):
    return {"benchmark": benchmark, "configuration": {}, "rows": rows, **extra, "environment": ENVIRONMENT}


def model_rows(model, columns, gpu=True):
    rows = []
    for n, column in enumerate(columns):
        row = {"model": model, "column": column, "step_ms": 20.0 / (1 + n / 10), "speedup_vs_inductor": 1 + n / 10}
        if gpu:
            row.update(gpu_ms=18.0, peak_gib=2.92)
        row.update(compile_s=30.0, out_snr_db=None if column == "inductor" else 41.2, dx_snr_db=38.0)
        rows.append(row)
    return rows


def every_benchmark() -> dict[str, dict]:
    """One GPU run of each benchmark in its default configuration, with the rows it writes."""
    fp8_cases = ["fp8 linear fwd 8192x4096->14336", "rmsnorm -> fp8 linear fwd 8192x4096->14336"]
    fp8_cases += ["swiglu -> fp8 linear fwd 8192x28672->4096", "frozen fp8 linear fwd 8192x4096->14336"]
    fp8_cases += [f"linear 8192x{d}->{d}" for d in (2048, 4096, 8192)]
    quant_modes = ["tensorwise", "tensorwise transposed", "rowwise", "rowwise transposed"]
    quant_modes += ["tensorwise both layouts", "rowwise both layouts"]
    fp8_backends = ["bare fp8 GEMM", "inductor", "primus_turbo fp8 tensorwise", "primus_turbo fp8 rowwise"]
    columns = ["eager", "inductor", "primus_turbo", "primus_turbo fp8 tensorwise", "primus_turbo fp8 rowwise"]
    columns += ["torchao fp8 tensorwise", "torchao fp8 rowwise"]
    columns += ["torchao fp8 tensorwise on primus_turbo", "torchao fp8 rowwise on primus_turbo"]
    fsdp2 = [
        {"column": c, "step_ms": 30.0, "speedup_vs_inductor": 1.3, "peak_gib": 5.0, "out_snr_db": 30.0}
        for c in ["inductor", "primus_turbo", "primus_turbo fp8 tensorwise", "primus_turbo fp8 rowwise"]
        + ["primus_turbo fp8 tensorwise, W^T not saved", "primus_turbo fp8 rowwise, W^T not saved"]
        + ["torchao fp8 tensorwise", "torchao fp8 rowwise"]
    ]
    gemm = ["mm then all-reduce", "inductor", "primus_turbo", "primus_turbo impl=overlap", "primus_turbo impl=push"]
    gemm_shapes = ["8192x4096x7168", "8192x4096x2048", "4096x4096x7168", "16x4096x7168"]
    return {
        "model_llama3-8b_train_fp8-tensorwise-rowwise.json": result(
            "model", model_rows("llama3-8b", columns), goals=[]
        ),
        "rmsnorm.json": result(
            "rmsnorm",
            op_rows(
                ["rmsnorm 8192x4096", "rmsnorm+residual 8192x4096"], ["fwd", "fwd+bwd"], ["inductor", "primus_turbo"]
            ),
        ),
        "glu.json": result(
            "glu",
            op_rows(
                ["swiglu 8192x14336", "swiglu fused gate/up 8192x14336", "swiglu probs (MoE) 8192x14336"],
                ["fwd", "fwd+bwd"],
                ["eager", "op (eager call)", "inductor", "primus_turbo"],
            ),
        ),
        "fp8.json": result("fp8", op_rows(fp8_cases, ["fwd"], fp8_backends, gpu=False)),
        "fp8_quant.json": result(
            "fp8_quant",
            op_rows(["8192x4096", "8192x14336", "4096x14336"], quant_modes, ["eager", "inductor", "triton", "native"]),
        ),
        "grouped_mm.json": result(
            "grouped_mm",
            [
                {"shape": shape, "mode": mode, "column": column, "ms": 1.0, "speedup_vs_torch_grouped_mm": 1.0}
                for shape in ("mixtral-8x7b gate_up 16384x4096->28672", "qwen3-30b-a3b down 65536x768->2048")
                for mode in ("fwd", "fwd+bwd")
                for column in (
                    "bf16 torch._grouped_mm",
                    "grouped_mm",
                    "fp8_grouped_mm rowwise",
                    "grouped_mm impl=triton",
                )
            ],
        ),
        "convergence.json": result(
            "convergence",
            [
                {"column": c, "first_loss": 1.0, "last_loss": 0.8, "max_deviation_vs_inductor": 0.001}
                for c in ["inductor", "primus_turbo", "primus_turbo fp8 tensorwise", "primus_turbo fp8 rowwise"]
            ],
        ),
        "gemm_allreduce_2ranks.json": result(
            "gemm_allreduce", op_rows(gemm_shapes, ["fwd", "fwd back-to-back"], gemm, gpu=False)
        ),
        "fsdp2_llama3-8b_2ranks.json": result("fsdp2", fsdp2),
        "floor_moe.json": result("floor", [floor_row(m) for m in ("mixtral-8x7b", "qwen3-30b-a3b")]),
    }


def floor_row(model):
    """A row as ``benchmarks/floor.py`` writes it (its kernel kinds left out)."""
    times = {"measured": 36.4, "quantization": 7.8, "quantization_at_copy": 3.4, "expert_gemms": 21.7}
    times |= {"expert_gemms_at_best": 15.2, "at_copy": 31.9, "and_gemms_at_best": 25.4}
    row = {"model": model, "column": "primus_turbo fp8 rowwise experts", "baseline": "inductor", "baseline_ms": 44.5}
    row |= {f"{name}_ms": ms for name, ms in times.items()}
    row |= {"measured": 44.5 / 36.4, "quantization_at_copy": 44.5 / 31.9, "and_gemms_at_best": 44.5 / 25.4}
    return row | {"target": 1.3}


def test_the_readme_is_what_the_report_makes_of_the_committed_results():
    assert report.README.read_text() == report.render(runs.load()), "run: python -m benchmarks.report"


def test_the_performance_table_is_generated_from_the_benchmark_results():
    """README.md's performance tables (``UPDATE_DOCS=1`` rewrites them)."""
    generated("README.md", "performance", performance.section())


def test_a_readme_of_every_benchmark_fits_two_pages():
    for text in (report.render(every_benchmark()), report.README.read_text()):
        lines = text.splitlines()
        assert len(lines) <= report.MAX_LINES
        assert max(map(len, lines)) <= runs.MAX_WIDTH, max(lines, key=len)
    assert "Not run on a GPU yet" not in report.render(every_benchmark())


def test_grouped_gemms_forced_onto_one_implementation_stay_in_the_json():
    text = report.render(every_benchmark())
    assert "| fp8_grouped_mm rowwise |" in text and "impl=triton" not in text


def test_the_report_renders_a_result():
    rows = op_rows(["rmsnorm 8192x4096"], ["fwd", "fwd+bwd"], ["eager", "op (eager call)", "inductor", "primus_turbo"])
    cpu_model = model_rows("tiny", ["eager", "inductor", "primus_turbo"], gpu=False)
    cpu_model.append({"model": "tiny", "column": "primus_turbo fp8 rowwise", "error": "RuntimeError: no"})
    text = report.render(
        {
            "rmsnorm.json": result("rmsnorm", rows),
            "model_tiny_train.json": result("model", cpu_model),
        }
    )
    assert (
        "## RMSNorm: `bash benchmarks/run_gpu.sh rmsnorm` (`bench_rmsnorm.py`)\n\n"
        "`python3 -m benchmarks.x`: 2026-12-01.\n\n"
        "| shape | mode (GPU ms) | inductor | primus_turbo |\n"
        "|---|---|---|---|\n"
        "| rmsnorm 8192x4096 | fwd | 0.4000 | 0.2857 (1.40x) |\n"
        "| rmsnorm 8192x4096 | fwd+bwd | 0.4000 | 0.2857 (1.40x) |\n"
    ) in text
    assert "Every run: 1x NVIDIA H200, torch 2.11.0+cu130, triton 3.6.0." in " ".join(text.splitlines()[:6])
    # what the run did not measure (GPU time, memory on CPU) is no column; an SNR of null: identical outputs; eager's
    # row only in the JSON
    assert (
        "| column | step ms | vs Inductor | compile s | out SNR dB | dx SNR dB |\n"
        "|---|---|---|---|---|---|\n"
        "| inductor | 18.182 | 1.10x | 30.0 | exact | 38.0 |\n"
        "| primus_turbo | 16.667 | 1.20x | 30.0 | 41.2 | 38.0 |\n"
        "| primus_turbo fp8 rowwise | failed: RuntimeError: no |  |  |  |  |\n"
    ) in text
    not_run = " ".join(text.split("## Not run on a GPU yet\n\n")[1].splitlines())
    assert "## SwiGLU" not in text and "SwiGLU (`glu`)" in not_run and "RMSNorm" not in not_run
    with pytest.raises(ValueError, match="does not know: \\['mystery'\\]"):
        report.render({"x.json": result("mystery", [])})


def test_every_section_reruns_a_step_of_run_gpu_sh():
    script = (BENCHMARKS_DIR / "run_gpu.sh").read_text()
    steps = set(re.findall(r"^\s+([a-z_0-9]+)\)", script, re.MULTILINE))
    assert {benchmark.step for benchmark in sections.BENCHMARKS} <= steps
    assert all((BENCHMARKS_DIR / benchmark.script).exists() for benchmark in sections.BENCHMARKS)


def test_a_run_is_written_as_json_named_by_its_configuration(tmp_path, monkeypatch):
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="8192x4096")
    parser.add_argument("--impls", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args(["--shapes", "1x2,3x4", "--impls", "--out", str(tmp_path)])
    parts = record.changed_options(parser, args, ignore={"out"})
    assert parts == ["shapes-1x2-3x4", "impls"]
    rows = [{"ms": 1.0, "snr": float("inf"), "gpu": float("nan"), "shape": (1, 2)}]
    path = record.write("rmsnorm", parts, vars(args), rows, args.out)
    assert path == str(tmp_path / "rmsnorm_shapes-1x2-3x4_impls.json")
    written = json.loads(open(path).read(), parse_constant=pytest.fail)  # NaN or Infinity would fail here
    assert written["rows"] == [{"ms": 1.0, "snr": None, "gpu": None, "shape": [1, 2]}]
    assert written["benchmark"] == "rmsnorm" and written["configuration"]["shapes"] == "1x2,3x4"
    assert set(written["environment"]) == {
        "machine", "torch", "triton", *record.PACKAGES, "native kernels", "python", "date", "command", "variables"
    }  # fmt: skip
    assert record.PACKAGES == ("transformers", "torchao", "liger-kernel")
    record.write("rmsnorm", parts, vars(args), rows, args.out)  # the same configuration again: overwritten
    with pytest.raises(FileExistsError, match="another configuration"):
        record.write("rmsnorm", parts, {**vars(args), "dtype": "float16"}, rows, args.out)
    assert len(record.file_name("model", ["x" * 300])) <= record.MAX_NAME + len(".json")
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    assert record.output_dir() == tmp_path / "out" and (tmp_path / "out").is_dir()
    monkeypatch.delenv("OUT")
    assert record.output_dir() == record.DEFAULT_OUT


def test_a_run_names_the_variables_it_started_with(monkeypatch):
    """Read when the benchmarks package is imported, before turbo_inductor's import sets defaults of its own."""
    monkeypatch.setitem(benchmarks.STARTED_WITH, "TURBO_INDUCTOR_NATIVE", "0")
    variables = record.environment()["variables"]
    assert variables["TURBO_INDUCTOR_NATIVE"] == "0"
    named = runs.environment_line("x.json", {**ENVIRONMENT, "variables": {"TURBO_INDUCTOR_NATIVE": "0"}}, "")
    assert named.startswith("`TURBO_INDUCTOR_NATIVE=0 python3 -m benchmarks.x`: ")


def test_a_run_of_transformers_models_says_what_ran():
    """--hf: the section says which classes ran; the README's table names the models. Runs of transformers' models
    measured alike share one table, each row against its own run's Inductor; another mode gets its own."""
    columns = ["eager", "inductor", "primus_turbo", "primus_turbo fp8 tensorwise", "torchao fp8 tensorwise"]
    results = {}
    for n, (model, model_class) in enumerate((("llama3-8b", "LlamaForCausalLM"), ("gemma-7b", "GemmaForCausalLM"))):
        rows = []
        for row in model_rows(model, columns):
            del row["out_snr_db"], row["dx_snr_db"]
            snr = None if row["column"] == "inductor" else 41.0
            rows.append({**row, "loss_snr_db": snr, "worst_grad_snr_db": snr, "step_ms": row["step_ms"] * (1 + n)})
        configuration = {
            "hf": model,
            "mode": "train",
            "autocast": False,
            "batch": 2,
            "seq": 2048,
            "snr_inputs": 4,
            "models": {model: {"class": model_class, "layers": 2}},
        }
        environment = {**ENVIRONMENT, "command": ["python3", "-m", "benchmarks.run_model", "--hf", model]}
        results[f"model_hf_{model}_train.json"] = {
            **result("model", rows),
            "configuration": configuration,
            "environment": environment,
        }
    text = report.render(results)
    assert (
        "`python3 -m benchmarks.run_model --hf gemma-7b`: 2026-12-01. `python3 -m benchmarks.run_model --hf "
        "llama3-8b`: 2026-12-01. GemmaForCausalLM, LlamaForCausalLM, 2 layers, training, 2 x 2048, SNR over 4 inputs."
    ) in " ".join(text.splitlines())
    header = "| model | column | step ms | vs Inductor | GPU ms | peak GiB | compile s | loss SNR dB |"
    header += " worst grad SNR dB |"
    assert "4 inputs.\n\n" + header + "\n" in text and text.count(header) == 1
    assert "| gemma-7b | inductor | 36.364 | 1.10x | 18.000 | 2.92 | 30.0 | exact | exact |\n" in text
    assert "| llama3-8b | inductor | 18.182 | 1.10x | 18.000 | 2.92 | 30.0 | exact | exact |\n" in text
    assert max(map(len, text.splitlines())) <= runs.MAX_WIDTH
    prefill = copy.deepcopy(results["model_hf_gemma-7b_train.json"])
    prefill["configuration"]["mode"] = "inference"
    both_modes = report.render({**results, "model_hf_gemma-7b_inference.json": prefill})
    assert both_modes.count("| step ms | vs Inductor |") == 2
    assert (
        "| gemma-7b (transformers, 2 layers, LM head) | 36.36 | 1.20x | 1.30x | - | 1.40x | - |"
        in performance.summary(results)
    )


def test_an_older_run_of_a_model_is_named_and_its_goals_and_row_are_the_newest_runs():
    def run(date, command, speedup, models=("llama3-8b",)):
        configuration = {"models": dict.fromkeys(models, {}), "mode": "train", "autocast": False, "batch": 2, "seq": 16}
        rows = [
            {**row, "speedup_vs_inductor": speedup}
            for model in models
            for row in model_rows(model, ["inductor", "primus_turbo"])
        ]
        environment = {**ENVIRONMENT, "date": date, "command": ["python3", command]}
        run = {"benchmark": "model", "configuration": configuration, "rows": rows, "goals": []}
        return run | {"environment": environment}

    def goal(model):  # the layer's bf16 goal, missed: 2.92 GiB, Inductor's peak too, is no less; its memory goal met
        return f"- {model}: 2 of 3 goals met; MISSED: bf16 >= {goals.LAYER.bf16:.2f}x Inductor at no more peak memory"

    results = {"a.json": run("2026-12-01T10:00:00", "old", 1.01), "b.json": run("2026-12-02T10:00:00", "new", 1.02)}
    text = report.render(results)
    assert "Older runs of these models, their tables in their JSON: `python3 old`: 2026-12-01." in text
    assert f"{goal('llama3-8b')}: 1.020x" in text and "1.010x" not in text
    assert "`python3 new`: 2026-12-02." in text
    summary = performance.summary(results)
    assert summary.count("| llama3-8b |") == 2, "once in the speed table, once in the memory table"
    # a column the newest run did not measure: the newest run's that did
    older = run("2026-12-01T11:00:00", "older", 1.44)
    older["rows"].append({**older["rows"][0], "column": "primus_turbo fp8 rowwise", "speedup_vs_inductor": 1.55})
    assert "| 1.55x | - | - |" in performance.summary({**results, "o.json": older})
    # a run of two models, one of them run again later: that model's rows and goals are the later run's only
    results["c.json"] = run("2026-12-01T12:00:00", "both", 1.03, models=("gemma-7b", "llama3-8b"))
    text = report.render(results)
    both = text.split("`python3 both`")[1].split("\n\n", 2)[1]
    assert both.splitlines()[2:3] == ["| inductor | 20.000 | 1.03x | 18.000 | 2.92 | 30.0 | exact | 38.0 |"], "gemma's"
    assert len(both.splitlines()) == 5 and both.endswith(f"{goal('gemma-7b')}: 1.030x, 2.92 GiB vs 2.92 GiB")
    assert f"{goal('llama3-8b')}: 1.020x" in text
    assert text.count("- llama3-8b:") == 1, "llama3-8b's goals, in its newest run only"


def test_the_report_holds_each_run_to_the_goals_as_they_stand_now():
    """A run recorded the goals of its day; the README holds its rows to goals.py's."""
    rows = model_rows("llama3-8b", ["inductor", "primus_turbo", "primus_turbo fp8 rowwise"])
    for row, speedup in zip(rows, (1.0, 1.2, goals.LAYER.fp8["rowwise"] - 0.01)):
        row.update(speedup_vs_inductor=speedup, peak_gib=2.0)
    recorded = [{"model": "llama3-8b", "goal": "primus_turbo fp8 rowwise >= 1.00x Inductor", "met": True}]
    configuration = {"config": "llama3-8b", "models": {"llama3-8b": {"layers": 1}}}
    text = report.render({"m.json": {**result("model", rows, goals=recorded), "configuration": configuration}})
    target = goals.LAYER.fp8["rowwise"]
    assert f"MISSED: fp8 rowwise >= {target:.2f}x Inductor: {target - 0.01:.3f}x" in text and ">= 1.00x" not in text
    cpu = {**result("model", rows), "configuration": configuration}
    assert runs.run_goals(cpu) == [], "a CPU run records no goals: its timings are held to none"


def test_a_result_edited_by_hand_is_marked_with_what_was_edited():
    """A JSON no run wrote as it stands carries "hand_edited": its command is marked in its section and in the
    README's table, each with a footnote naming the file and what was edited."""
    typed = {**result("model", model_rows("llama3-8b", ["inductor", "primus_turbo"])), "hand_edited": "typed"}
    typed["configuration"] = {"models": {"llama3-8b": {}}, "mode": "train", "autocast": False, "batch": 2, "seq": 16}
    text = report.render({"typed.json": typed, "rmsnorm.json": result("rmsnorm", [])})
    assert f"`python3 -m benchmarks.x`{runs.HAND_MARK}: 2026-12-01." in text
    assert f"\n\n{runs.HAND_MARK} `typed.json` edited by hand: typed.\n" in text
    assert text.count(runs.HAND_MARK) == 2, "the RMSNorm run is not marked"
    summary = performance.summary({"typed.json": typed})
    assert f"| llama3-8b{runs.HAND_MARK} |" in summary
    assert summary.endswith(f"\n\n{runs.HAND_MARK} `benchmarks/results/typed.json` edited by hand: typed.")
    # a column taken from a run edited by hand marks its model's row too
    newer = {**typed, "environment": {**ENVIRONMENT, "date": "2026-12-02T10:00:00+00:00"}}
    newer["rows"] = newer["rows"][:1]
    del newer["hand_edited"]
    assert f"| llama3-8b{runs.HAND_MARK} | 20.00 | 1.10x |" in performance.summary(
        {"typed.json": typed, "new.json": newer}
    )
    assert runs.HAND_MARK not in performance.summary({"new.json": newer})
    # the committed results edited by hand
    committed = runs.load()
    edited = sorted(file for file, run in committed.items() if run.get("hand_edited"))
    assert edited == [
        "grouped_mm_modes-fwd-bwd_kernels.json",
        "model_hf_gemma-7b_train_fp8-rowwise_snr-inputs-1.json",
        "model_llama3-8b_train_fp8-tensorwise-rowwise.json",
    ]
    readme = " ".join(report.README.read_text().splitlines())
    assert all(f"{runs.HAND_MARK} `{file}` edited by hand: " in readme for file in edited)


def test_a_run_records_and_the_report_shows_the_transformers_and_peers_it_ran_with(monkeypatch):
    """transformers' version sets the graphs its models give, and so their speed, a peer's its columns' kernels; null
    where not installed."""
    import importlib.metadata

    environment = record.environment()
    assert environment["transformers"] == importlib.metadata.version("transformers")
    hide_package(monkeypatch, "transformers")
    assert record.environment()["transformers"] is None
    versions = {**ENVIRONMENT, "transformers": "5.25.0", "torchao": "0.18.0", "liger-kernel": "0.8.5"}
    assert runs.environment_line("x.json", versions, "").endswith(
        ": 1x NVIDIA H200, torch 2.11.0+cu130, triton 3.6.0, transformers 5.25.0, torchao 0.18.0, liger-kernel 0.8.5, "
        "2026-12-01."
    )


def test_the_readme_table_shows_liger_and_the_peak_memory_where_runs_have_them():
    """The README's summary: each model's ratios, then its peak memory per column. Liger's column shows its figure
    where the newest run with it measured one, "failed" where its column failed, and a dash where no run had it."""
    columns = ["inductor", "primus_turbo", "torchao fp8 tensorwise", "liger"]
    results = {}
    for model, liger in (("llama3-8b", "ran"), ("gemma-7b", "failed"), ("phi3-mini", None)):
        rows = [
            {**row, "peak_gib": 10.0 - n}
            for n, row in enumerate(model_rows(model, columns))
            if liger or row["column"] != "liger"
        ]
        if liger == "failed":
            rows[-1] = {"model": model, "column": "liger", "error": "RuntimeError: no"}
        configuration = {"models": {model: {}}, "mode": "train", "autocast": False, "batch": 2, "seq": 16}
        results[f"{model}.json"] = {**result("model", rows), "configuration": configuration}
    summary = performance.summary(results).splitlines()
    assert summary[0] == (
        "| model, training | Inductor ms | bf16 | fp8 tensorwise | fp8 rowwise | torchao tensorwise | torchao rowwise |"
        " liger |"
    )
    assert "| llama3-8b | 20.00 | 1.10x | - | - | 1.20x | - | 1.30x |" in summary
    assert "| gemma-7b | 20.00 | 1.10x | - | - | 1.20x | - | failed |" in summary
    assert "| phi3-mini | 20.00 | 1.10x | - | - | 1.20x | - | - |" in summary
    memory = summary[summary.index("") + 1 :]
    assert memory[0].startswith("| peak GiB | Inductor | bf16 | fp8 tensorwise |") and memory[0].endswith(" liger |")
    assert "| llama3-8b | 10.00 | 9.00 | - | - | 8.00 | - | 7.00 |" in memory
    assert "| gemma-7b | 10.00 | 9.00 | - | - | 8.00 | - | failed |" in memory
    assert "| phi3-mini | 10.00 | 9.00 | - | - | 8.00 | - | - |" in memory
    assert "a dash: no run measured it" in " ".join(summary)


def test_the_readme_shows_each_gpus_tables_from_its_own_runs_only(tmp_path):
    """The H200's runs in the results folder, the H100's in its ``h100`` folder: each GPU's tables of its own runs, the
    H100's under a line naming their folder, a run edited by hand there named by its path; no H100 tables where it
    has no runs."""
    h100 = tmp_path / "h100"
    h100.mkdir()
    ratios = random.sample(range(105, 195), 2)
    for folder, machine, ratio in ((tmp_path, "1x NVIDIA H200", ratios[0]), (h100, "1x NVIDIA H100", ratios[1])):
        rows = [{**row, "speedup_vs_inductor": ratio / 100} for row in model_rows("llama3-8b", ["inductor", "liger"])]
        run = {**result("model", rows), "environment": {**ENVIRONMENT, "machine": machine}}
        run["configuration"] = {"models": {"llama3-8b": {}}, "mode": "train", "autocast": False, "batch": 2, "seq": 16}
        (folder / "model_llama3-8b_train.json").write_text(json.dumps(run | {"hand_edited": f"typed on {machine}"}))
    h200_part, h100_part = performance.section(tmp_path).split(
        "\n\nOne H100's runs, from `benchmarks/results/h100/`:\n\n"
    )
    for part, (mine, other) in ((h200_part, ratios), (h100_part, ratios[::-1])):
        assert f"| llama3-8b{runs.HAND_MARK} | 20.00 | - | - | - | - | - | {mine / 100:.2f}x |" in part
        assert f"{other / 100:.2f}x" not in part
    assert "1x NVIDIA H100" in h100_part and "H100" not in h200_part
    assert h200_part.endswith(
        "`benchmarks/results/model_llama3-8b_train.json` edited by hand: typed on 1x NVIDIA H200."
    )
    assert h100_part.endswith(
        "`benchmarks/results/h100/model_llama3-8b_train.json` edited by hand: typed on 1x NVIDIA H100."
    )
    (h100 / "model_llama3-8b_train.json").unlink()
    assert performance.section(tmp_path) == h200_part


def test_the_report_says_which_memory_goals_missed_and_where_a_peer_holds_less():
    """A GPU run's memory goals held as they stand now, and each peer below ours of its precision with how much less;
    its chart draws the peak memory beside the speedups (a CPU run's has no memory to draw)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = ["inductor", "primus_turbo", "primus_turbo fp8 tensorwise", "torchao fp8 tensorwise", "liger"]
    rows = model_rows("llama3-8b", columns)
    for row, peak in zip(rows, (10.0, 10.0, 11.0, 10.5, 8.0)):
        row["peak_gib"] = peak
    configuration = {"config": "llama3-8b", "models": {"llama3-8b": {"layers": 1}}, "mode": "train", "batch": 2}
    run = {**result("model", rows, goals=[]), "configuration": {**configuration, "seq": 16}}
    text = re.sub(r"\s+", " ", report.render({"m.json": run}))  # the goals' lines unwrapped
    assert "peak memory <= 1.02x Inductor's: 1.100x at most (fp8 tensorwise)" in text
    assert "fp8 peak memory <= torchao's: +0.50 GiB at most (tensorwise)" in text
    assert "Less memory than ours: torchao fp8 tensorwise by 0.50 GiB (4.5%); liger by 2.00 GiB (20.0%)" in text
    figure = chart._speedup_chart(plt, run)
    assert [axes.get_xlabel() for axes in figure.axes] == ["speedup over Inductor", "peak GiB in a step"]
    plt.close(figure)
    cpu = {**result("model", model_rows("llama3-8b", columns, gpu=False)), "configuration": run["configuration"]}
    figure = chart._speedup_chart(plt, cpu)
    assert len(figure.axes) == 1
    plt.close(figure)
    assert "Less memory" not in report.render({"m.json": cpu})
