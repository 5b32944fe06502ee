#include "titan/backend/vec_kernels.h"

namespace titan {

void gemv_bf16_split_x(float* x_split, const float* x, int64_t cols) {
  const int64_t blocks = cols / 32 * 32;
  for (int64_t c = 0; c < blocks; c += 32) {
    for (int64_t i = 0; i < 16; ++i) {
      x_split[c + i] = x[c + 2 * i];
      x_split[c + 16 + i] = x[c + 2 * i + 1];
    }
  }
  for (int64_t c = blocks; c < cols; ++c) x_split[c] = x[c];
}

void gemv_bf16_unsplit_x(float* x, const float* x_split, int64_t cols) {
  const int64_t blocks = cols / 32 * 32;
  for (int64_t c = 0; c < blocks; c += 32) {
    for (int64_t i = 0; i < 16; ++i) {
      x[c + 2 * i] = x_split[c + i];
      x[c + 2 * i + 1] = x_split[c + 16 + i];
    }
  }
  for (int64_t c = blocks; c < cols; ++c) x[c] = x_split[c];
}

}  // namespace titan
