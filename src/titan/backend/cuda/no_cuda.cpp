// Linked instead of cuda_backend.cu when titan is configured without -DTITAN_CUDA=ON.
#include "titan/backend/cuda/cuda_backend.h"
#include "titan/core/error.h"

namespace titan {

std::unique_ptr<Backend> make_cuda_backend(int) {
  fail(
      "this titan was built without CUDA (configure with -DTITAN_CUDA=ON where nvcc is installed)");
}

void cuda_set_allow_tf32(Backend&, bool) {
  fail("this titan was built without CUDA: no TF32 to allow");
}

size_t cuda_device_memory_in_use() {
  fail("this titan was built without CUDA: no device memory to count");
}

}  // namespace titan
