#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what is missing, builds with warnings as
# errors, generates the PyTorch / Transformers references, runs every test.
#   scripts/test.sh              Release build (build/)
#   scripts/test.sh --sanitize   AddressSanitizer + UBSan build (build-sanitize/)
# Where nvcc is installed the Release build is the CUDA build (-DTITAN_CUDA=ON, no GPU needed):
# one libtitan with the CUDA backend and kernels (ops/cuda/*.cu, warnings as errors) linked in, the
# titan binary, titan_cuda_smoke, titan_cuda_kernels_test, titan_cuda_step_kernels_check and
# bench_cuda_gemm, so every CPU test runs against the binary a GPU user gets, which without a GPU
# must behave as the CPU-only one for every cpu job. Its ctests add the host-side step kernels
# check, and the GPU checks saying "no CUDA device (...)" where the machine has none
# (tests/cuda/device_or_none.sh). The sanitizer build stays CPU-only: CUDA's runtime under
# AddressSanitizer needs protect_shadow_gap=0 and reports the driver's own allocations as leaks,
# and what it would check there -- the host code -- is the CPU build's (compute-sanitizer checks
# the device side on a GPU, scripts/cuda-device-check.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
sanitize=0
[ "${1:-}" = "--sanitize" ] && sanitize=1
build_dir=build
[ "$sanitize" -eq 1 ] && build_dir=build-sanitize
cuda=()
if [ "$sanitize" -eq 0 ] && { command -v nvcc > /dev/null || [ -x /usr/local/cuda/bin/nvcc ]; }; then
  cuda=(--cuda)
fi
scripts/setup.sh --tests --werror "$@" "${cuda[@]}"

ctest --test-dir "$build_dir" --output-on-failure -j2 --timeout 600
