#include "titan/ops/lora_experts.h"

#include <cstring>
#include <vector>

#include "titan/backend/backend.h"

namespace titan {
namespace {

// Expert e's B_e (out, rank), contiguous, from B's strided columns j E + e.
void gather_b(float* b_e, const float* b, int64_t e, const ExpertLoraShape& s) {
  const int64_t stride = s.rank * s.n_experts;
  for (int64_t o = 0; o < s.out; ++o) {
    for (int64_t j = 0; j < s.rank; ++j) b_e[o * s.rank + j] = b[o * stride + j * s.n_experts + e];
  }
}

}  // namespace

void expert_lora_merge(float* w_merged, const float* w, const float* a, const float* b,
                       const ExpertLoraShape& s) {
  std::vector<float> b_e(static_cast<size_t>(s.out * s.rank));
  const int64_t size = s.out * s.in;
  for (int64_t e = 0; e < s.n_experts; ++e) {
    gather_b(b_e.data(), b, e, s);
    std::memcpy(w_merged + e * size, w + e * size, static_cast<size_t>(size) * sizeof(float));
    backend().gemm_f32(Trans::no, Trans::no, s.out, s.in, s.rank, s.scaling, b_e.data(), s.rank,
                       a + e * s.rank * s.in, s.in, 1.0f, w_merged + e * size, s.in);
  }
}

void expert_lora_backward(float* da, float* db, const float* dw, const float* a, const float* b,
                          const ExpertLoraShape& s) {
  std::vector<float> b_e(static_cast<size_t>(s.out * s.rank));
  std::vector<float> db_e(static_cast<size_t>(s.out * s.rank));
  const int64_t size = s.out * s.in, stride = s.rank * s.n_experts;
  for (int64_t e = 0; e < s.n_experts; ++e) {
    gather_b(b_e.data(), b, e, s);
    // dA_e (rank, in) += scaling * B_e^T dW_e; dB_e (out, rank) = scaling * dW_e A_e^T.
    backend().gemm_f32(Trans::yes, Trans::no, s.rank, s.in, s.out, s.scaling, b_e.data(), s.rank,
                       dw + e * size, s.in, 1.0f, da + e * s.rank * s.in, s.in);
    backend().gemm_f32(Trans::no, Trans::yes, s.out, s.rank, s.in, s.scaling, dw + e * size, s.in,
                       a + e * s.rank * s.in, s.in, 0.0f, db_e.data(), s.rank);
    for (int64_t o = 0; o < s.out; ++o) {
      for (int64_t j = 0; j < s.rank; ++j)
        db[o * stride + j * s.n_experts + e] += db_e[o * s.rank + j];
    }
  }
}

void expert_lora_merge_reference(float* w_merged, const float* w, const float* a, const float* b,
                                 const ExpertLoraShape& s) {
  const int64_t stride = s.rank * s.n_experts;
  for (int64_t e = 0; e < s.n_experts; ++e) {
    for (int64_t o = 0; o < s.out; ++o) {
      for (int64_t i = 0; i < s.in; ++i) {
        double sum = 0.0;
        for (int64_t j = 0; j < s.rank; ++j) {
          sum += static_cast<double>(b[o * stride + j * s.n_experts + e]) *
                 a[(e * s.rank + j) * s.in + i];
        }
        const int64_t at = (e * s.out + o) * s.in + i;
        w_merged[at] = static_cast<float>(w[at] + s.scaling * sum);
      }
    }
  }
}

void expert_lora_backward_reference(float* da, float* db, const float* dw, const float* a,
                                    const float* b, const ExpertLoraShape& s) {
  const int64_t stride = s.rank * s.n_experts;
  for (int64_t e = 0; e < s.n_experts; ++e) {
    const float* dw_e = dw + e * s.out * s.in;
    for (int64_t j = 0; j < s.rank; ++j) {
      for (int64_t i = 0; i < s.in; ++i) {
        double sum = 0.0;
        for (int64_t o = 0; o < s.out; ++o) {
          sum += static_cast<double>(b[o * stride + j * s.n_experts + e]) * dw_e[o * s.in + i];
        }
        da[(e * s.rank + j) * s.in + i] += static_cast<float>(s.scaling * sum);
      }
      for (int64_t o = 0; o < s.out; ++o) {
        double sum = 0.0;
        for (int64_t i = 0; i < s.in; ++i) {
          sum += static_cast<double>(dw_e[o * s.in + i]) * a[(e * s.rank + j) * s.in + i];
        }
        db[o * stride + j * s.n_experts + e] += static_cast<float>(s.scaling * sum);
      }
    }
  }
}

}  // namespace titan
