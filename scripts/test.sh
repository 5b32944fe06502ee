#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what is missing, builds with warnings as
# errors, generates the PyTorch / Transformers references, runs every test.
#   scripts/test.sh              Release build (build/)
#   scripts/test.sh --sanitize   AddressSanitizer + UBSan build (build-sanitize/)
# Where nvcc is installed, the Release run also builds the CUDA backend (build-cuda/).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=build
[ "${1:-}" = "--sanitize" ] && build_dir=build-sanitize
scripts/setup.sh --tests --werror "$@"

# The CUDA backend compiles and links wherever nvcc is (no GPU needed): only what -DTITAN_CUDA=ON
# adds (titan_cuda -- the backend and every CUDA kernel, ops/cuda/*.cu, with warnings as errors --,
# titan_cuda_smoke, bench_cuda_gemm and titan_cudnn_attention_graphs_check), not a second libtitan:
# titan_cuda_kernels_test, which links one, is built for a GPU run (scripts/cuda-device-check.sh).
# The smoke binary then checks the backend on a GPU, or says exactly "no CUDA device (...)" without
# one; the graphs check validates cuDNN attention's graphs for SM 90 on any host. The kernels'
# bodies run on the host in test_cuda_rows, with the CPU tests.
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2> /dev/null || true)
if [ "$build_dir" = build ] && [ -n "$nvcc" ]; then
  cmake -S . -B build-cuda -DTITAN_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" -DTITAN_WERROR=ON \
    -DTITAN_BUILD_TESTS=OFF -DTITAN_BUILD_BENCH=ON > /dev/null
  cmake --build build-cuda -j"$(nproc)" --target titan_cuda_smoke bench_cuda_gemm \
    titan_cudnn_attention_graphs_check
  build-cuda/titan_cudnn_attention_graphs_check
  smoke_rc=0
  smoke=$(build-cuda/titan_cuda_smoke 2>&1) || smoke_rc=$?
  echo "$smoke"
  if [ "$smoke_rc" -ne 0 ] && ! { [ "$smoke_rc" -eq 1 ] && [[ "$smoke" == "no CUDA device ("* ]]; }; then
    echo "test.sh: titan_cuda_smoke failed (exit $smoke_rc)" >&2
    exit 1
  fi
fi

ctest --test-dir "$build_dir" --output-on-failure -j2 --timeout 600
