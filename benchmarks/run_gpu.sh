#!/usr/bin/env bash
# What the GPU machine checks, in one call (device tool): install, GPU tests, op and model benchmarks.
#   bash benchmarks/run_gpu.sh [tests] [rmsnorm] [glu] [fp8] [fp8_quant] [grouped_mm] [model] [convergence] [profile] [gemm_ar] [gemm_push] [fsdp2]   (default: tests rmsnorm glu model)   logs and JSON land in $OUT
#   TESTS="lowering_tests/test_gpu.py ..." limits the tests step to those files; MODEL_ARGS="--kernels 12 ..." (GEMM_AR_ARGS, GEMM_PUSH_ARGS, FSDP2_ARGS) adds
#   arguments to the model (gemm_ar, fsdp2) step; MAX_JOBS sets the native build's jobs; INSTALLED=1 skips the install.
set -o pipefail
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/turbo_out}
mkdir -p "$OUT"
steps=${*:-tests rmsnorm glu model}
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
# torchao (the FP8 peer's columns in the model benchmark), where its wheel was carried along: device tool
# carry=["wheels"], the wheel from `pip download --no-deps --only-binary=:all: --python-version 3.12 torchao==0.18.0 -d wheels`
for wheel in wheels/torchao-*.whl; do [ -e "$wheel" ] && python3 -m pip install -q --no-deps "$wheel" >> "$OUT/install.log" 2>&1; done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
# pytest workers: 8 (16 cores, one H200) left the suite at 380 s; on the two-GPU kind (32 cores) 8 took over 480 s
test_jobs=${TEST_JOBS:-$(( $(nproc) >= 32 ? 12 : 8 ))}
for step in $steps; do
  case $step in
    tests)   timeout 500 python3 -m pytest ${TESTS:-lowering_tests} -q -n "$test_jobs" --dist worksteal 2>&1 | tee "$OUT/tests.log" | tail -25 ;;
    rmsnorm) (cd benchmarks && python3 bench_rmsnorm.py) 2>&1 | tee "$OUT/bench_rmsnorm.log" | grep -v Warning ;;
    model)   python3 -m benchmarks.run_model --out "$OUT" ${MODEL_ARGS:-} 2>&1 | tee "$OUT/run_model.log" | tail -8 ;;
    profile) (cd benchmarks && python3 profile_compiled.py) 2>&1 | tee "$OUT/profile.log" | grep -v Warning ;;
    convergence) python3 -m benchmarks.convergence --out "$OUT" 2>&1 | tee "$OUT/convergence.log" | grep -v Warning ;;
    fp8)     (cd benchmarks && python3 bench_fp8.py) 2>&1 | tee "$OUT/bench_fp8.log" | grep -v Warning ;;
    fp8_quant) (cd benchmarks && python3 bench_fp8_quant.py) 2>&1 | tee "$OUT/bench_fp8_quant.log" | grep -v Warning ;;
    grouped_mm) (cd benchmarks && python3 bench_grouped_mm.py ${GROUPED_MM_ARGS:-}) 2>&1 | tee "$OUT/bench_grouped_mm.log" | grep -v Warning ;;
    gemm_ar) (cd benchmarks && torchrun --nproc-per-node "$(nvidia-smi -L | wc -l)" bench_gemm_allreduce.py ${GEMM_AR_ARGS:-}) 2>&1 | tee "$OUT/bench_gemm_allreduce.log" | grep -v Warning ;;  # kind nvidia-h200-x2
    gemm_push) (cd benchmarks && PYTHONPATH=.. timeout 300 torchrun --nproc-per-node "$(nvidia-smi -L | wc -l)" probe_gemm_push.py ${GEMM_PUSH_ARGS:-}) 2>&1 | tee "$OUT/probe_gemm_push.log" | grep -v -i "warn\|return func" ;;  # kind nvidia-h200-x2
    glu)     (cd benchmarks && python3 bench_glu.py) 2>&1 | tee "$OUT/bench_glu.log" | grep -v Warning ;;
    fsdp2)   torchrun --nproc-per-node "$(nvidia-smi -L | wc -l)" -m benchmarks.bench_fsdp2 --out "$OUT" ${FSDP2_ARGS:-} 2>&1 | tee "$OUT/bench_fsdp2.log" | grep -v Warning ;;  # kind nvidia-h200-x2
    *)       echo "unknown step $step"; exit 2 ;;
  esac
done
