#!/usr/bin/env bash
# One command on an AMD GPU (MI300 / MI350), with a ROCm build of torch and turbo_inductor installed with its rocm
# extra (docs/rocm.md): what runs where, the GPU tests of the kernels aiter implements and of ours, then each of
# those kernels timed under aiter, Triton, native and the vendor BLAS.
#   bash benchmarks/rocm_check.sh      logs in $OUT (default /tmp/turbo_rocm); TEST_JOBS: pytest workers (default 8)
# The tests need pytest, pytest-xdist, hypothesis and transformers.
set -o pipefail
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/turbo_rocm}
mkdir -p "$OUT"
cd "$(dirname "$0")/.." || exit 1
python3 -c "import sys, torch; sys.exit(None if torch.version.hip and torch.cuda.is_available() else
  f'needs a ROCm build of torch and an AMD GPU; this is torch {torch.__version__}')" || exit 1
python3 -m turbo_inductor.info | tee "$OUT/info.log"
# aiter's tests first, in one process: aiter builds each kernel family at its first call (minutes, then cached).
python3 -m pytest lowering_tests/kernels/test_aiter.py lowering_tests/kernels/test_aiter_source.py -q 2>&1 \
  | tee "$OUT/tests_aiter.log" | tail -15
aiter_status=$?
python3 -m pytest lowering_tests/kernels/test_rmsnorm.py lowering_tests/kernels/test_fp8_quant.py \
  lowering_tests/kernels/test_fp8_gemm.py lowering_tests/kernels/test_native.py lowering_tests/system/test_gpu.py \
  -q -n "${TEST_JOBS:-8}" 2>&1 | tee "$OUT/tests.log" | tail -25
tests_status=$?
python3 -m benchmarks.bench_impls 2>&1 | tee "$OUT/bench_impls.log"
echo "logs and impls.json in $OUT"
exit $(( aiter_status || tests_status ))
