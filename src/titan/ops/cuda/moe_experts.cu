// The experts' grouped compute on CUDA (ops/moe_stages.h's grouped_experts_*), the CPU's sequence
// of operations (ops/moe_experts.cpp) operand for operand: per expert its three GEMMs over its
// contiguous rows, one cuBLASLt matmul per call through the backend, the expert's row range read
// from the plan's offsets (E + 1 values copied to the host once per call: that copy waits for the
// stream); SwiGLU through swiglu.cu's kernels; the per-row weights and d weights in row kernels
// (moe_rows.h). A grouped form -- cuBLASLt's grouped GEMM, or one batched call over experts padded
// to a common row count -- would issue one launch per GEMM kind instead of one per expert and
// leave the offsets on the device (no wait), which matters when E is large and each expert's rows
// few; the sums would stay per expert, so the results would not move. Also the four stages
// composed (`experts_staged_cuda`, under the fused kernels' contract).
#include <vector>

#include "titan/backend/backend.h"
#include "titan/core/error.h"
#include "titan/ops/cuda/cuda_ops.h"
#include "titan/ops/cuda/moe_rows.h"
#include "titan/ops/cuda/team.cuh"

namespace titan::cuda_ops {
namespace {

using cuda_rows::BlockTeam;
using cuda_rows::kRowThreads;

constexpr int kThreads = 256;

__device__ int64_t element() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__global__ void weight_grad_kernel(float* dweight_rows, float* dact, const float* act, float* rows,
                                   const float* w_rows, int64_t inter, int64_t hidden) {
  const int64_t r = blockIdx.x;
  cuda_rows::experts_row_weight_grad(BlockTeam{}, dweight_rows + r, dact + r * inter,
                                     act + r * inter, rows + r * hidden, w_rows[r], inter, hidden);
}

__global__ void row_dot_kernel(float* dweight_rows, const float* dy, const float* out,
                               int64_t hidden) {
  const int64_t r = blockIdx.x;
  cuda_rows::experts_row_dot(BlockTeam{}, dweight_rows + r, dy + r * hidden, out + r * hidden,
                             hidden);
}

__global__ void scaled_rows_bf16_kernel(uint16_t* dst, const float* rows, const float* w_rows,
                                        int64_t hidden, int64_t n) {
  const int64_t i = element();
  if (i < n) cuda_rows::scaled_row_element_bf16(dst, rows, w_rows, hidden, i);
}

__global__ void swiglu_forward_bf16_kernel(uint16_t* act, uint16_t* gate_kept, uint16_t* up_kept,
                                           const float* gate, const float* up, int64_t n) {
  const int64_t i = element();
  if (i < n) cuda_rows::swiglu_forward_bf16_element(act, gate_kept, up_kept, gate, up, i);
}

unsigned row_blocks(int64_t rows) {
  TITAN_CHECK(rows <= 0x7fffffff, "CUDA experts: ", rows, " rows need too many blocks");
  return static_cast<unsigned>(rows);
}

// The plan's offsets (E + 1, device memory) on the host.
std::vector<int32_t> host_offsets(const int32_t* offsets, int64_t n_experts) {
  std::vector<int32_t> host(static_cast<size_t>(n_experts) + 1);
  backend().copy_to_host(host.data(), offsets, host.size() * sizeof(int32_t));
  return host;
}

// fn(e, first_row, n_rows) for every expert with rows, in expert order.
template <typename Fn>
void for_each_expert(const std::vector<int32_t>& offsets, const Fn& fn) {
  for (size_t e = 0; e + 1 < offsets.size(); ++e) {
    const int64_t r0 = offsets[e], n_e = offsets[e + 1] - r0;
    if (n_e > 0) fn(static_cast<int64_t>(e), r0, n_e);
  }
}

}  // namespace

void grouped_experts_forward(float* out_rows, const ExpertsActivations& act,
                             const ExpertsScratch& /*s: none needed*/, const float* x_rows,
                             const int32_t* offsets, const ExpertWeights& w,
                             const ExpertsShape& shape) {
  const int64_t h = shape.hidden, Im = shape.inter;
  const std::vector<int32_t> off = host_offsets(offsets, shape.n_experts);
  Backend& b = backend();
  for_each_expert(off, [&](int64_t e, int64_t r0, int64_t n_e) {
    b.gemm_f32(Trans::no, Trans::yes, n_e, Im, h, 1.0f, x_rows + r0 * h, h, w.gate + e * Im * h, h,
               0.0f, act.gate + r0 * Im, Im);
    b.gemm_f32(Trans::no, Trans::yes, n_e, Im, h, 1.0f, x_rows + r0 * h, h, w.up + e * Im * h, h,
               0.0f, act.up + r0 * Im, Im);
  });
  swiglu_forward(act.act, act.gate, act.up, shape.rows() * Im);
  for_each_expert(off, [&](int64_t e, int64_t r0, int64_t n_e) {
    b.gemm_f32(Trans::no, Trans::yes, n_e, h, Im, 1.0f, act.act + r0 * Im, Im, w.down + e * h * Im,
               Im, 0.0f, out_rows + r0 * h, h);
  });
}

void grouped_experts_backward(float* rows, float* dweight_rows, const ExpertGrads& dw,
                              const ExpertsScratch& s, const float* w_rows,
                              const ExpertsActivations& act, const float* x_rows,
                              const int32_t* offsets, const ExpertWeights& w,
                              const ExpertsShape& shape) {
  const int64_t h = shape.hidden, Im = shape.inter, R = shape.rows();
  const std::vector<int32_t> off = host_offsets(offsets, shape.n_experts);
  Backend& b = backend();
  swiglu_forward(act.act, act.gate, act.up, R * Im);
  // g = dy down_e per row, unweighted: d w = <g, act>, and d act = w * g.
  for_each_expert(off, [&](int64_t e, int64_t r0, int64_t n_e) {
    b.gemm_f32(Trans::no, Trans::no, n_e, Im, h, 1.0f, rows + r0 * h, h, w.down + e * h * Im, Im,
               0.0f, s.dact + r0 * Im, Im);
  });
  if (R > 0) {
    weight_grad_kernel<<<row_blocks(R), kRowThreads>>>(dweight_rows, s.dact, act.act, rows, w_rows,
                                                       Im, h);
    check_launch("grouped_experts_backward (d weight)");
  }
  for_each_expert(off, [&](int64_t e, int64_t r0, int64_t n_e) {
    if (dw.down != nullptr)
      b.gemm_f32(Trans::yes, Trans::no, h, Im, n_e, 1.0f, rows + r0 * h, h, act.act + r0 * Im, Im,
                 1.0f, dw.down + e * h * Im, Im);
  });
  swiglu_backward(s.dgate, s.dup, s.dact, act.gate, act.up, R * Im);
  for_each_expert(off, [&](int64_t e, int64_t r0, int64_t n_e) {
    if (dw.gate != nullptr)
      b.gemm_f32(Trans::yes, Trans::no, Im, h, n_e, 1.0f, s.dgate + r0 * Im, Im, x_rows + r0 * h, h,
                 1.0f, dw.gate + e * Im * h, h);
    if (dw.up != nullptr)
      b.gemm_f32(Trans::yes, Trans::no, Im, h, n_e, 1.0f, s.dup + r0 * Im, Im, x_rows + r0 * h, h,
                 1.0f, dw.up + e * Im * h, h);
    // dx rows over the (now unneeded) weighted dy rows.
    b.gemm_f32(Trans::no, Trans::no, n_e, h, Im, 1.0f, s.dgate + r0 * Im, Im, w.gate + e * Im * h,
               h, 0.0f, rows + r0 * h, h);
    b.gemm_f32(Trans::no, Trans::no, n_e, h, Im, 1.0f, s.dup + r0 * Im, Im, w.up + e * Im * h, h,
               1.0f, rows + r0 * h, h);
  });
}

void grouped_experts_forward_bf16(float* out_rows, const ExpertsActivations& act,
                                  const ExpertsScratch& s, const uint16_t* x_rows,
                                  const int32_t* offsets, const ExpertWeightsBf16& w,
                                  const ExpertsShape& shape) {
  const int64_t h = shape.hidden, Im = shape.inter, n = shape.rows() * Im;
  const std::vector<int32_t> off = host_offsets(offsets, shape.n_experts);
  Backend& b = backend();
  // As the CPU's: with a backward to follow (s.dgate set) gate and up are computed in s.dgate and
  // s.dup and kept, with act, in bf16; without one they are computed in act's fp32 rooms.
  const bool keep = s.dgate != nullptr;
  auto* act_bf16 = reinterpret_cast<uint16_t*>(act.act);
  float* gate = keep ? s.dgate : act.gate;
  float* up = keep ? s.dup : act.up;
  for_each_expert(off, [&](int64_t e, int64_t r0, int64_t n_e) {
    b.gemm_bf16(Trans::no, Trans::yes, n_e, Im, h, 1.0f, x_rows + r0 * h, h, w.gate + e * Im * h, h,
                0.0f, gate + r0 * Im, Im);
    b.gemm_bf16(Trans::no, Trans::yes, n_e, Im, h, 1.0f, x_rows + r0 * h, h, w.up + e * Im * h, h,
                0.0f, up + r0 * Im, Im);
  });
  if (n > 0) {
    swiglu_forward_bf16_kernel<<<blocks_for(n, kThreads), kThreads>>>(
        act_bf16, keep ? reinterpret_cast<uint16_t*>(act.gate) : nullptr,
        keep ? reinterpret_cast<uint16_t*>(act.up) : nullptr, gate, up, n);
    check_launch("grouped_experts_forward_bf16 (swiglu)");
  }
  for_each_expert(off, [&](int64_t e, int64_t r0, int64_t n_e) {
    b.gemm_bf16(Trans::no, Trans::yes, n_e, h, Im, 1.0f, act_bf16 + r0 * Im, Im,
                w.down + e * h * Im, Im, 0.0f, out_rows + r0 * h, h);
  });
}

void grouped_experts_backward_bf16(float* rows, float* dweight_rows, const ExpertGrads& dw,
                                   const ExpertsScratch& s, const float* w_rows,
                                   const ExpertsActivations& act, const uint16_t* x_rows,
                                   const int32_t* offsets, const ExpertWeightsBf16& w,
                                   const ExpertsShape& shape) {
  TITAN_CHECK(s.out != nullptr, "grouped_experts_backward_bf16: no room for the outputs (s.out)");
  const int64_t h = shape.hidden, Im = shape.inter, R = shape.rows();
  const std::vector<int32_t> off = host_offsets(offsets, shape.n_experts);
  Backend& b = backend();
  // s.out holds the recomputed outputs (R, h), then w * dy rounded, down_proj's output gradient;
  // s.dgate and s.dup hold d gate and d up (R, Im) rounded.
  auto* dy_down_bf16 = reinterpret_cast<uint16_t*>(s.out);
  auto* dgate_bf16 = reinterpret_cast<uint16_t*>(s.dgate);
  auto* dup_bf16 = reinterpret_cast<uint16_t*>(s.dup);
  auto* act_bf16 = reinterpret_cast<uint16_t*>(act.act);
  const auto* gate_kept = reinterpret_cast<const uint16_t*>(act.gate);
  const auto* up_kept = reinterpret_cast<const uint16_t*>(act.up);
  swiglu_recompute_bf16(act_bf16, gate_kept, up_kept, R * Im);
  // The experts' outputs again: d w is <dy, output>.
  for_each_expert(off, [&](int64_t e, int64_t r0, int64_t n_e) {
    b.gemm_bf16(Trans::no, Trans::yes, n_e, h, Im, 1.0f, act_bf16 + r0 * Im, Im,
                w.down + e * h * Im, Im, 0.0f, s.out + r0 * h, h);
  });
  if (R > 0) {
    row_dot_kernel<<<row_blocks(R), kRowThreads>>>(dweight_rows, rows, s.out, h);
    check_launch("grouped_experts_backward_bf16 (d weight)");
    // A second kernel: the rounded rows overwrite outputs other rows' blocks may still read.
    scaled_rows_bf16_kernel<<<blocks_for(R * h, kThreads), kThreads>>>(dy_down_bf16, rows, w_rows,
                                                                       h, R * h);
    check_launch("grouped_experts_backward_bf16 (w dy)");
  }
  for_each_expert(off, [&](int64_t e, int64_t r0, int64_t n_e) {
    b.gemm_bf16(Trans::no, Trans::no, n_e, Im, h, 1.0f, dy_down_bf16 + r0 * h, h,
                w.down + e * h * Im, Im, 0.0f, s.dact + r0 * Im, Im);
    if (dw.down != nullptr)
      b.gemm_bf16(Trans::yes, Trans::no, h, Im, n_e, 1.0f, dy_down_bf16 + r0 * h, h,
                  act_bf16 + r0 * Im, Im, 1.0f, dw.down + e * h * Im, Im);
  });
  swiglu_backward_bf16(dgate_bf16, dup_bf16, s.dact, gate_kept, up_kept, R * Im);
  for_each_expert(off, [&](int64_t e, int64_t r0, int64_t n_e) {
    if (dw.gate != nullptr)
      b.gemm_bf16(Trans::yes, Trans::no, Im, h, n_e, 1.0f, dgate_bf16 + r0 * Im, Im,
                  x_rows + r0 * h, h, 1.0f, dw.gate + e * Im * h, h);
    if (dw.up != nullptr)
      b.gemm_bf16(Trans::yes, Trans::no, Im, h, n_e, 1.0f, dup_bf16 + r0 * Im, Im, x_rows + r0 * h,
                  h, 1.0f, dw.up + e * Im * h, h);
    // dx rows over the (now unneeded) dy rows.
    b.gemm_bf16(Trans::no, Trans::no, n_e, h, Im, 1.0f, dgate_bf16 + r0 * Im, Im,
                w.gate + e * Im * h, h, 0.0f, rows + r0 * h, h);
    b.gemm_bf16(Trans::no, Trans::no, n_e, h, Im, 1.0f, dup_bf16 + r0 * Im, Im, w.up + e * Im * h,
                h, 1.0f, rows + r0 * h, h);
  });
}

void experts_forward_staged(float* y, const ExpertsActivations& act, const ExpertsScratch& s,
                            const float* x, const int32_t* index, const float* weight,
                            const ExpertWeights& w, const ExpertsShape& shape) {
  moe_dispatch_plan(act.row_of, act.offsets, index, shape);
  moe_dispatch_forward(s.x, x, act.row_of, shape);
  grouped_experts_forward(s.y, act, s, s.x, act.offsets, w, shape);
  moe_combine_forward(y, s.y, act.row_of, index, weight, shape);
}

void experts_backward_staged(float* dx, float* dweight, const ExpertGrads& dw,
                             const ExpertsScratch& s, const float* dy,
                             const ExpertsActivations& act, const float* x,
                             const int32_t* /*index: the forward's act.row_of is reused*/,
                             const float* weight, const ExpertWeights& w,
                             const ExpertsShape& shape) {
  TITAN_CHECK(s.w_rows != nullptr && s.dweight_rows != nullptr,
              "experts_backward_staged: no room for the rows' weights (s.w_rows, s.dweight_rows)");
  moe_combine_backward(s.y, s.w_rows, dy, weight, act.row_of, shape);
  moe_dispatch_forward(s.x, x, act.row_of, shape);
  grouped_experts_backward(s.y, s.dweight_rows, dw, s, s.w_rows, act, s.x, act.offsets, w, shape);
  moe_dispatch_backward(dx, dweight, s.y, s.dweight_rows, act.row_of, shape);
}

void experts_forward_staged_bf16(float* y, const ExpertsActivations& act, const ExpertsScratch& s,
                                 const float* x, const int32_t* index, const float* weight,
                                 const ExpertWeightsBf16& w, const ExpertsShape& shape) {
  auto* x_rows = reinterpret_cast<uint16_t*>(s.x);  // (R, h) in the first half of s.x
  moe_dispatch_plan(act.row_of, act.offsets, index, shape);
  moe_dispatch_forward_bf16(x_rows, x, act.row_of, shape);
  grouped_experts_forward_bf16(s.y, act, s, x_rows, act.offsets, w, shape);
  moe_combine_forward(y, s.y, act.row_of, index, weight, shape);
}

void experts_backward_staged_bf16(float* dx, float* dweight, const ExpertGrads& dw,
                                  const ExpertsScratch& s, const float* dy,
                                  const ExpertsActivations& act, const float* x,
                                  const int32_t* /*index: the forward's act.row_of is reused*/,
                                  const float* weight, const ExpertWeightsBf16& w,
                                  const ExpertsShape& shape) {
  TITAN_CHECK(s.w_rows != nullptr && s.dweight_rows != nullptr,
              "experts_backward_staged_bf16: no room for the rows' weights (s.w_rows, "
              "s.dweight_rows)");
  auto* x_rows = reinterpret_cast<uint16_t*>(s.x);
  moe_combine_backward(s.y, s.w_rows, dy, weight, act.row_of, shape);
  moe_dispatch_forward_bf16(x_rows, x, act.row_of, shape);
  grouped_experts_backward_bf16(s.y, s.dweight_rows, dw, s, s.w_rows, act, x_rows, act.offsets, w,
                                shape);
  moe_dispatch_backward(dx, dweight, s.y, s.dweight_rows, act.row_of, shape);
}

}  // namespace titan::cuda_ops
