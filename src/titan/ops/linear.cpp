#include "titan/ops/linear.h"

#include <vector>

#include "titan/backend/backend.h"
#include "titan/backend/gemm_reference.h"
#include "titan/io/convert.h"

namespace titan {

void linear_forward(float* y, const float* x, const float* weight, int64_t n_rows,
                    int64_t in_features, int64_t out_features) {
  backend().gemm_f32(Trans::no, Trans::yes, n_rows, out_features, in_features, 1.0f, x, in_features,
                     weight, in_features, 0.0f, y, out_features);
}

void linear_backward(float* dx, float* dweight, const float* dy, const float* x,
                     const float* weight, int64_t n_rows, int64_t in_features, int64_t out_features,
                     bool accumulate_dx) {
  backend().gemm_f32(Trans::no, Trans::no, n_rows, in_features, out_features, 1.0f, dy,
                     out_features, weight, in_features, accumulate_dx ? 1.0f : 0.0f, dx,
                     in_features);
  if (dweight == nullptr) return;  // a frozen weight (LoRA's base)
  backend().gemm_f32(Trans::yes, Trans::no, out_features, in_features, n_rows, 1.0f, dy,
                     out_features, x, in_features, 1.0f, dweight, in_features);
}

void linear_forward_bf16(float* y, const uint16_t* x, const uint16_t* weight, int64_t n_rows,
                         int64_t in_features, int64_t out_features) {
  backend().gemm_bf16(Trans::no, Trans::yes, n_rows, out_features, in_features, 1.0f, x,
                      in_features, weight, in_features, 0.0f, y, out_features);
}

void linear_forward_bf16_to_bf16(uint16_t* y, const uint16_t* x, const uint16_t* weight,
                                 int64_t n_rows, int64_t in_features, int64_t out_features) {
  backend().gemm_bf16_to_bf16(Trans::no, Trans::yes, n_rows, out_features, in_features, 1.0f, x,
                              in_features, weight, in_features, y, out_features);
}

void linear_backward_bf16(float* dx, float* dweight, const uint16_t* dy, const uint16_t* x,
                          const uint16_t* weight, int64_t n_rows, int64_t in_features,
                          int64_t out_features, bool accumulate_dx) {
  backend().gemm_bf16(Trans::no, Trans::no, n_rows, in_features, out_features, 1.0f, dy,
                      out_features, weight, in_features, accumulate_dx ? 1.0f : 0.0f, dx,
                      in_features);
  if (dweight == nullptr) return;  // a frozen weight (LoRA's base)
  backend().gemm_bf16(Trans::yes, Trans::no, out_features, in_features, n_rows, 1.0f, dy,
                      out_features, x, in_features, 1.0f, dweight, in_features);
}

void linear_forward_reference(float* y, const float* x, const float* weight, int64_t n_rows,
                              int64_t in_features, int64_t out_features) {
  gemm_f32_reference(Trans::no, Trans::yes, n_rows, out_features, in_features, 1.0f, x, in_features,
                     weight, in_features, 0.0f, y, out_features);
}

void linear_backward_reference(float* dx, float* dweight, const float* dy, const float* x,
                               const float* weight, int64_t n_rows, int64_t in_features,
                               int64_t out_features, bool accumulate_dx) {
  gemm_f32_reference(Trans::no, Trans::no, n_rows, in_features, out_features, 1.0f, dy,
                     out_features, weight, in_features, accumulate_dx ? 1.0f : 0.0f, dx,
                     in_features);
  if (dweight == nullptr) return;  // a frozen weight (LoRA's base)
  gemm_f32_reference(Trans::yes, Trans::no, out_features, in_features, n_rows, 1.0f, dy,
                     out_features, x, in_features, 1.0f, dweight, in_features);
}

namespace {

std::vector<float> widen(const uint16_t* bf16, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  convert_to_f32(bf16, DType::bf16, out.size(), out.data());
  return out;
}

}  // namespace

void linear_forward_bf16_reference(float* y, const uint16_t* x, const uint16_t* weight,
                                   int64_t n_rows, int64_t in_features, int64_t out_features) {
  linear_forward_reference(y, widen(x, n_rows * in_features).data(),
                           widen(weight, out_features * in_features).data(), n_rows, in_features,
                           out_features);
}

void linear_backward_bf16_reference(float* dx, float* dweight, const uint16_t* dy,
                                    const uint16_t* x, const uint16_t* weight, int64_t n_rows,
                                    int64_t in_features, int64_t out_features, bool accumulate_dx) {
  linear_backward_reference(dx, dweight, widen(dy, n_rows * out_features).data(),
                            widen(x, n_rows * in_features).data(),
                            widen(weight, out_features * in_features).data(), n_rows, in_features,
                            out_features, accumulate_dx);
}

}  // namespace titan
