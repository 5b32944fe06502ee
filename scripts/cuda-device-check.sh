#!/usr/bin/env bash
# The CUDA backend's checks on a machine with an NVIDIA GPU, in one run: titan_cuda_smoke plainly
# and under compute-sanitizer's memcheck, then bench_cuda_gemm beside PyTorch's matmul on the same
# shapes (bench/cuda_gemm_torch.py), then bench_cuda_gemm again (the clock moves between runs).
# Build the binaries first, where nvcc is (no GPU needed):
#   cmake -S . -B build-cuda -DTITAN_CUDA=ON -DTITAN_BUILD_TESTS=OFF
#   cmake --build build-cuda --target titan_cuda_smoke bench_cuda_gemm
# If they cannot load there (another CUDA or C++ runtime), the script builds them with that
# machine's nvcc. Results also go to $OUT when it is set (the device tool's output folder).
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
out=${OUT:-$(mktemp -d)}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
smoke=build-cuda/titan_cuda_smoke bench=build-cuda/bench/bench_cuda_gemm
if [ ! -x "$smoke" ] || [ ! -x "$bench" ] || ldd "$smoke" "$bench" | grep -q "not found"; then
  echo "== building with this machine's nvcc"
  common=(-std=c++20 -O2 -arch=sm_90 -Isrc src/titan/backend/device_buffer.cpp
          src/titan/backend/cuda/cuda_backend.cu -lcublas)
  nvcc "${common[@]}" -Itests tests/cuda/cuda_smoke.cpp src/titan/backend/gemm_reference.cpp \
    -o /tmp/titan_cuda_smoke || exit 1
  nvcc "${common[@]}" -Ibench bench/bench_cuda_gemm.cpp -o /tmp/bench_cuda_gemm || exit 1
  smoke=/tmp/titan_cuda_smoke bench=/tmp/bench_cuda_gemm
fi
status=0
echo "== titan_cuda_smoke"
"$smoke" || status=1
echo "== titan_cuda_smoke under compute-sanitizer memcheck"
timeout 300 compute-sanitizer --tool memcheck --error-exitcode 1 "$smoke" || status=1
echo "== bench_cuda_gemm"
"$bench" | tee "$out/titan_gemm.txt"
echo "== PyTorch on the same shapes"
timeout 300 python3 bench/cuda_gemm_torch.py | tee "$out/torch_gemm.txt"
echo "== bench_cuda_gemm again"
"$bench" | tee "$out/titan_gemm_2.txt"
exit $status
