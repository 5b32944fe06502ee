// The experts' data movement between token order and row order (ops/moe_stages.h): dispatch
// (group the routed rows by expert and gather their inputs) and combine (the routing-weighted sum
// back in token order), each beside a plain reference. The fast forms are ops/moe_rows.h's, which
// the fused kernels of ops/moe.cpp run too.
#include <algorithm>
#include <numeric>
#include <vector>

#include "titan/core/dtype.h"
#include "titan/core/error.h"
#include "titan/ops/moe_rows.h"
#include "titan/ops/moe_stages.h"

namespace titan {

using moe_rows::next_slot_by_expert;

void moe_dispatch_plan(int32_t* row_of, int32_t* offsets, const int32_t* index,
                       const ExpertsShape& shape) {
  moe_rows::group_rows_by_expert(row_of, offsets, index, shape);
}

void moe_dispatch_forward(float* x_rows, const float* x, const int32_t* row_of,
                          const ExpertsShape& shape) {
  moe_rows::gather_token_rows(x_rows, x, row_of, shape, shape.hidden);
}

void moe_dispatch_forward_bf16(uint16_t* x_rows, const float* x, const int32_t* row_of,
                               const ExpertsShape& shape) {
  moe_rows::gather_token_rows_bf16(x_rows, x, row_of, shape, shape.hidden);
}

void moe_dispatch_backward(float* dx, float* dweight, const float* dx_rows,
                           const float* dweight_rows, const int32_t* row_of,
                           const ExpertsShape& shape) {
  moe_rows::sum_token_rows(dx, dx_rows, row_of, shape);
  for (int64_t p = 0; p < shape.rows(); ++p) dweight[p] = dweight_rows[row_of[p]];
}

void moe_dispatch_plan_reference(int32_t* row_of, int32_t* offsets, const int32_t* index,
                                 const ExpertsShape& shape) {
  const int64_t E = shape.n_experts, rows = shape.rows();
  // (token, slot) pairs p sorted by expert, stably: row r holds order[r].
  std::vector<int64_t> order(static_cast<size_t>(rows));
  std::iota(order.begin(), order.end(), int64_t{0});
  for (int64_t p = 0; p < rows; ++p) {
    TITAN_CHECK(index[p] >= 0 && index[p] < E, "experts: token ", p / shape.top_k,
                " is routed to expert ", index[p], ", outside [0, ", E, ")");
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return index[a] < index[b]; });
  for (int64_t r = 0; r < rows; ++r) row_of[order[r]] = static_cast<int32_t>(r);
  for (int64_t e = 0; e <= E; ++e) {
    offsets[e] = static_cast<int32_t>(
        std::count_if(index, index + rows, [&](int32_t expert) { return expert < e; }));
  }
}

void moe_dispatch_forward_reference(float* x_rows, const float* x, const int32_t* row_of,
                                    const ExpertsShape& shape) {
  const int64_t h = shape.hidden;
  for (int64_t p = 0; p < shape.rows(); ++p) {
    for (int64_t c = 0; c < h; ++c) x_rows[row_of[p] * h + c] = x[(p / shape.top_k) * h + c];
  }
}

void moe_dispatch_forward_bf16_reference(uint16_t* x_rows, const float* x, const int32_t* row_of,
                                         const ExpertsShape& shape) {
  const int64_t h = shape.hidden;
  for (int64_t p = 0; p < shape.rows(); ++p) {
    for (int64_t c = 0; c < h; ++c) {
      x_rows[row_of[p] * h + c] = f32_to_bf16(x[(p / shape.top_k) * h + c]);
    }
  }
}

void moe_dispatch_backward_reference(float* dx, float* dweight, const float* dx_rows,
                                     const float* dweight_rows, const int32_t* row_of,
                                     const ExpertsShape& shape) {
  const int64_t h = shape.hidden, k = shape.top_k;
  for (int64_t t = 0; t < shape.n_tokens; ++t) {
    for (int64_t c = 0; c < h; ++c) {
      double sum = 0.0;
      for (int64_t j = 0; j < k; ++j) sum += dx_rows[row_of[t * k + j] * h + c];
      dx[t * h + c] = static_cast<float>(sum);
    }
    for (int64_t j = 0; j < k; ++j) dweight[t * k + j] = dweight_rows[row_of[t * k + j]];
  }
}

void moe_combine_forward(float* y, const float* out_rows, const int32_t* row_of,
                         const int32_t* index, const float* weight, const ExpertsShape& shape) {
  moe_rows::sum_weighted_expert_rows(y, out_rows, row_of, index, weight, shape);
}

void moe_combine_backward(float* dy_rows, float* w_rows, const float* dy, const float* weight,
                          const int32_t* row_of, const ExpertsShape& shape) {
  moe_rows::gather_token_rows(dy_rows, dy, row_of, shape, shape.hidden);
  for (int64_t p = 0; p < shape.rows(); ++p) w_rows[row_of[p]] = weight[p];
}

void moe_combine_forward_reference(float* y, const float* out_rows, const int32_t* row_of,
                                   const int32_t* index, const float* weight,
                                   const ExpertsShape& shape) {
  const int64_t h = shape.hidden, k = shape.top_k;
  std::vector<double> sum(static_cast<size_t>(h));
  for (int64_t t = 0; t < shape.n_tokens; ++t) {
    std::fill(sum.begin(), sum.end(), 0.0);
    int32_t last = -1;
    for (int64_t step = 0; step < k; ++step) {
      const int64_t j = next_slot_by_expert(index + t * k, k, last);
      last = index[t * k + j];
      const float* row = out_rows + static_cast<int64_t>(row_of[t * k + j]) * h;
      for (int64_t c = 0; c < h; ++c) sum[c] += static_cast<double>(weight[t * k + j]) * row[c];
    }
    for (int64_t c = 0; c < h; ++c) y[t * h + c] = static_cast<float>(sum[c]);
  }
}

void moe_combine_backward_reference(float* dy_rows, float* w_rows, const float* dy,
                                    const float* weight, const int32_t* row_of,
                                    const ExpertsShape& shape) {
  const int64_t h = shape.hidden, k = shape.top_k;
  for (int64_t p = 0; p < shape.rows(); ++p) {
    for (int64_t c = 0; c < h; ++c) dy_rows[row_of[p] * h + c] = dy[(p / k) * h + c];
    w_rows[row_of[p]] = weight[p];
  }
}

}  // namespace titan
