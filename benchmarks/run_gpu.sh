#!/usr/bin/env bash
# The GPU machine's work in one call (device tool): install, then each step; each benchmark's log and JSON land in $OUT.
#   bash benchmarks/run_gpu.sh [STEP...]   (default: all)
#   all = model rmsnorm glu fp8_quant convergence fp8: every single-GPU benchmark, the main job first (nvidia-h200);
#   grouped_mm: MoE expert GEMMs; grouped_mm_heuristics: the FP8 GEMMs' launch-heuristic variants (rowwise, at
#   run_model's routed rows, with kernel tables); per_group: torch's grouped GEMMs against a cuBLAS GEMM per group
#   after a host sync, per pass; fp8_quant_moe: their operands' quantization kernels against a copy,
#   with the grouped kernel's launch-heuristic variants; gemm_ar, fsdp2: on every GPU of the host (kind nvidia-h200-x2);
#   quick: the tests marked gpu_quick, every GPU session's first step; tests: the test suite (lowering_tests,
#   benchmarks/tests), less the gpu_quick tests where the quick step ran before it in the same call; profile: profiler
#   tables; costs: the FP8 cost table of this GPU (benchmarks/cost_table.py), from grouped GEMMs (at the bench's and
#   run_model's routed rows) and linears measured fwd+bwd, merged into the package's table here (later steps decide by
#   it) and copied to $OUT; memory: the main job beside each FP8 recipe with W^T kept for the backward by every linear
#   (save_weight_t true; by default only concatenated ones keep it): its time against the memory it holds; moe: transformers' Mixtral and Qwen3-MoE with their kernel lists, FP8 experts forced
#   beside auto's choice and bf16 experts by one GEMM per group (vendor_per_group), then their quantization kernels
#   and the floor of the FP8 step (benchmarks/floor.py); autocast: Llama-3-8B in bf16 and under autocast (fp32
#   parameters), whose ratios to Inductor are to be within 3%, with their kernel tables; these three without the
#   peers' columns.
#   TESTS="lowering_tests/system/test_gpu.py ..." limits the tests; MODEL_ARGS, GEMM_AR_ARGS, FSDP2_ARGS add arguments
#   to that step; TESTS_TIMEOUT bounds the tests (s); MAX_JOBS sets the native build's jobs; INSTALLED=1 skips the
#   install. BUNDLE=DIR: after the install and after each step, DIR/bundle.tgz holds all of $OUT so far (the device
#   tool brings back a few files, and a command stopped at its time limit keeps what its last step bundled):
#   BUNDLE=$OUT OUT=/tmp/stage bash benchmarks/run_gpu.sh ...
set -o pipefail
# PYTHONFAULTHANDLER: a process that crashes (a peer's kernel) prints where, in Python, it was.
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 OUT=${OUT:-/tmp/turbo_out}
mkdir -p "$OUT"
# The install builds the native kernels (csrc/) for this GPU, required here (TURBO_INDUCTOR_NATIVE=1) so that a
# failed build is shown; then the package is installed without them. TURBO_INDUCTOR_NATIVE=0 skips the build.
export MAX_JOBS=${MAX_JOBS:-$(nproc)} TURBO_INDUCTOR_NATIVE=${TURBO_INDUCTOR_NATIVE:-1}
if [ -n "${INSTALLED:-}" ]; then :  # INSTALLED=1: an earlier run_gpu.sh in the same command installed it
elif ! python3 -m pip install -v --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1; then
  grep -E -m 40 "error|Error" "$OUT/install.log"
  echo "native build failed: installing without the native kernels"
  TURBO_INDUCTOR_NATIVE=0 python3 -m pip install -q --no-deps --no-build-isolation -e . >> "$OUT/install.log" 2>&1 || { tail -30 "$OUT/install.log"; exit 1; }
fi
[ -e "$OUT/install.log" ] && grep -E "turbo_inductor: (native|building)" "$OUT/install.log"
# Without the install's entry point every primus_turbo column and test fails with InvalidBackend: stop here instead.
python3 -c "import torch; assert 'primus_turbo' in torch._dynamo.list_backends()" 2> /dev/null || {
  echo "primus_turbo is no registered backend: the install failed (install.log)"; exit 1; }
# The peers' columns in the model benchmark, torchao's (FP8) and Liger-Kernel's, where their wheels were carried along
# (the GPU machine has no index): device tool carry=["wheels"], the wheels from `pip download --no-deps
# --only-binary=:all: --python-version 3.12 torchao==0.18.0 liger-kernel==0.8.5 -d wheels` (requirements.txt's pins)
for wheel in wheels/torchao-*.whl wheels/liger_kernel-*.whl; do
  [ -e "$wheel" ] && python3 -m pip install -q --no-deps "$wheel" >> "$OUT/install.log" 2>&1
done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
gpus=$(nvidia-smi -L | wc -l)
# pytest workers: 8 (16 cores, one H200) left the suite at 380 s; on the two-GPU kind (32 cores) 8 took over 480 s
test_jobs=${TEST_JOBS:-$(( $(nproc) >= 32 ? 12 : 8 ))}

# bench LOG COMMAND...: runs a benchmark (its JSON goes to $OUT), appends its log to $OUT/LOG.log (a second run of
# the same step in one call keeps the first's), prints its wall time.
bench() {
  local log=$1 start=$SECONDS
  shift
  "$@" 2>&1 | tee -a "$OUT/$log.log" | grep -v -i "warn"
  echo "== $log: $(( SECONDS - start )) s"
}

# bundle: $OUT so far into $BUNDLE/bundle.tgz, where BUNDLE is set (replaced whole, never half written).
bundle() {
  [ -n "${BUNDLE:-}" ] || return 0
  tar czf "$BUNDLE/bundle.tgz.part" -C "$OUT" . && mv "$BUNDLE/bundle.tgz.part" "$BUNDLE/bundle.tgz"
}
bundle

steps=()
for step in ${*:-all}; do
  if [ "$step" = all ]; then steps+=(model rmsnorm glu fp8_quant convergence fp8); else steps+=("$step"); fi
done
for step in "${steps[@]}"; do
  case $step in
    quick) timeout 300 python3 -m pytest lowering_tests -m gpu_quick -q -n "$test_jobs" --dist worksteal \
             --junitxml="$OUT/quick.xml" 2>&1 | tee "$OUT/quick.log" | tail -25
           quick_ran=1 ;;
    # After the quick step of the same call, the suite leaves out what it ran (about 100 s): the two logs together
    # are the whole suite.
    tests) python3 -c "import torchao" 2> /dev/null ||
             echo "no torchao here (device tool carry=[\"wheels\"]): the fuzzer's torchao blocks will fail"
           # -v names each test as it ends, so a run stopped by the timeout (no summary) still names its failures.
           timeout "${TESTS_TIMEOUT:-500}" python3 -m pytest ${TESTS:-lowering_tests benchmarks/tests} -v \
             ${quick_ran:+-m "not gpu_quick"} -n "$test_jobs" --dist worksteal --junitxml="$OUT/tests.xml" \
             > "$OUT/tests.log" 2>&1
           grep -E "^\[gw[0-9]+\].* (FAILED|ERROR) " "$OUT/tests.log" | head -40
           grep -E "^(FAILED|ERROR) |^=+ .*(passed|failed|error).* =+$" "$OUT/tests.log" | tail -42 ;;
    rmsnorm) bench bench_rmsnorm python3 -m benchmarks.bench_rmsnorm ;;
    glu) bench bench_glu python3 -m benchmarks.bench_glu ;;
    fp8) bench bench_fp8 python3 -m benchmarks.bench_fp8 ;;
    fp8_quant) bench bench_fp8_quant python3 -m benchmarks.bench_fp8_quant ;;
    fp8_quant_moe) bench bench_fp8_quant python3 -m benchmarks.bench_fp8_quant --shapes '' \
                     --moe mixtral-8x7b,qwen3-30b-a3b --heuristics all ;;
    grouped_mm) bench bench_grouped_mm python3 -m benchmarks.bench_grouped_mm ${GROUPED_MM_ARGS:-} ;;
    grouped_mm_heuristics) bench bench_grouped_mm python3 -m benchmarks.bench_grouped_mm --modes fwd+bwd --tokens 4096 \
                             --kernels --heuristics all \
                             --columns 'bf16 torch._grouped_mm,fp8 rowwise auto,fp8 rowwise triton GEMMs,fp8 rowwise:' ;;
    per_group) bench bench_grouped_per_group python3 -m benchmarks.bench_grouped_per_group ;;
    costs) bench bench_grouped_mm python3 -m benchmarks.bench_grouped_mm --modes fwd+bwd
           bench bench_grouped_mm python3 -m benchmarks.bench_grouped_mm --modes fwd+bwd --tokens 4096
           bench bench_fp8 python3 -m benchmarks.bench_fp8
           # Into the package's table on this machine, so that later steps of this call decide by it; a copy to $OUT.
           python3 -m benchmarks.cost_table "$OUT"/grouped_mm*.json "$OUT"/fp8*.json && cp turbo_inductor/costs/*.json "$OUT"/ ;;
    model) bench run_model python3 -m benchmarks.run_model ${MODEL_ARGS:-} ;;
    moe) bench run_model python3 -m benchmarks.run_model --hf mixtral-8x7b,qwen3-30b-a3b --kernels 30 --snr-inputs 1 --peers '' \
           --column 'fp8 rowwise experts={"fp8": {"recipe": "rowwise", "experts": true}}' \
           --column 'bf16 per group={"impl": {"grouped_gemm": "vendor_per_group", "grouped_gemm_wgrad": "vendor_per_group"}}'
         bench bench_fp8_quant python3 -m benchmarks.bench_fp8_quant --shapes '' --moe mixtral-8x7b,qwen3-30b-a3b
         python3 -m benchmarks.floor "$(ls -t "$OUT"/model_*.json | head -1)" --out "$OUT/floor_moe.json" \
           --quant "$OUT/fp8_quant_shapes-none_moe-mixtral-8x7b-qwen3-30b-a3b.json" ;;
    autocast) bench run_model python3 -m benchmarks.run_model --hf llama3-8b --snr-inputs 1 --peers '' --kernels 30
              bench run_model python3 -m benchmarks.run_model --hf llama3-8b --snr-inputs 1 --peers '' --autocast \
                --kernels 30 ;;
    memory) bench run_model python3 -m benchmarks.run_model --hf llama3-8b,phi3-mini,gemma-7b --snr-inputs 1 \
              --peers '' --column 'fp8 tensorwise W^T={"fp8": {"recipe": "tensorwise", "save_weight_t": true}}' \
              --column 'fp8 rowwise W^T={"fp8": {"recipe": "rowwise", "save_weight_t": true}}' ;;
    convergence) bench convergence python3 -m benchmarks.convergence ;;
    profile) bench profile python3 -m benchmarks.profile_compiled ;;
    gemm_ar) bench bench_gemm_allreduce torchrun --nproc-per-node "$gpus" -m benchmarks.bench_gemm_allreduce ${GEMM_AR_ARGS:-} ;;
    fsdp2) bench bench_fsdp2 torchrun --nproc-per-node "$gpus" -m benchmarks.bench_fsdp2 ${FSDP2_ARGS:-} ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
  bundle
done
