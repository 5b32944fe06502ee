// The CUDA backend on a machine's first GPU: GEMMs against the reference, copies, Buffers in its
// memory (never run on a GPU yet: written 2026-12-05 on a machine without one), and the vector
// primitives it lacks failing by name. With no GPU (or no driver) it prints the one line
// "no CUDA device (...)" and exits 1; CI accepts exactly that where the build machine has none.
#include <cstdio>
#include <memory>
#include <string>

#include "titan/backend/cuda/cuda_backend.h"
#include "titan/core/error.h"
#include "unit/backend_checks.h"

int main() {
  using namespace titan;
  try {
    const std::unique_ptr<Backend> cuda = make_cuda_backend();
    std::printf("%s\n", cuda->name().c_str());
    for (const std::string& failure : {testing::check_copies(*cuda), testing::check_buffers(*cuda),
                                       testing::check_gemms(*cuda)}) {
      if (!failure.empty()) {
        std::fprintf(stderr, "titan_cuda_smoke: %s\n", failure.c_str());
        return 1;
      }
    }
    try {
      cuda->vec().dot(nullptr, nullptr, 0);
      std::fprintf(stderr, "titan_cuda_smoke: vec().dot ran on CUDA, which has no kernel for it\n");
      return 1;
    } catch (const Error& e) {
      if (std::string(e.what()) != "vector primitive 'dot' is not implemented on CUDA yet") throw;
    }
    std::printf("titan_cuda_smoke: ok\n");
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
