// The lm_head fused with cross-entropy on CUDA (ops/cross_entropy.h's contract): per chunk of
// tokens the logits GEMM through the backend (cuBLASLt), one block per row for its softmax, loss
// and d loss / d logits in place (cross_entropy_rows.h), then the two backward GEMMs; the full
// logits never exist. With the lm_head's bf16 copy (mixed precision) at the CPU's rounding points:
// x rounded to bf16 once, the GEMMs on bf16 operands with fp32 accumulation, the logits written in
// bf16, d loss / d logits rounded to bf16 in place for the backward's GEMMs. The targets are read
// back and checked on the host first (the CPU's message); the rows' losses are read back per chunk
// and summed on the host in fp64, in token order.
#include <algorithm>
#include <vector>

#include "titan/backend/backend.h"
#include "titan/ops/cuda/cross_entropy_rows.h"
#include "titan/ops/cuda/cuda_ops.h"
#include "titan/ops/cuda/team.cuh"

namespace titan::cuda_ops {
namespace {

using cuda_rows::BlockTeam;

__global__ void rows_kernel(float* logits, float* row_loss, const int32_t* targets, int64_t vocab,
                            bool grad, float grad_scale) {
  const int64_t r = blockIdx.x;
  const float loss = cuda_rows::cross_entropy_row(BlockTeam{}, logits + r * vocab, targets[r],
                                                  kIgnoreIndex, vocab, grad, grad_scale);
  if (threadIdx.x == 0) row_loss[r] = loss;
}

__global__ void rows_bf16_kernel(uint16_t* logits, double* row_loss, const int32_t* targets,
                                 int64_t vocab, bool grad, float grad_scale) {
  const int64_t r = blockIdx.x;
  const double loss = cuda_rows::cross_entropy_row_bf16(BlockTeam{}, logits + r * vocab, targets[r],
                                                        kIgnoreIndex, vocab, grad, grad_scale);
  if (threadIdx.x == 0) row_loss[r] = loss;
}

// The bytes of one chunk's logits, rounded up to a multiple of 8 so the rows' losses after them
// are aligned (fp32 losses beside fp32 logits, fp64 beside bf16 ones).
int64_t chunk_logits_bytes(int64_t chunk, int64_t vocab, bool bf16) {
  const int64_t element = bf16 ? sizeof(uint16_t) : sizeof(float);
  return (chunk * vocab * element + 7) / 8 * 8;
}

}  // namespace

int64_t lm_head_workspace_bytes(int64_t n_tokens, int64_t, int64_t vocab, int64_t chunk_tokens,
                                bool bf16) {
  const int64_t chunk = titan::lm_head_chunk_tokens(n_tokens, vocab, chunk_tokens);
  const int64_t loss_bytes = bf16 ? sizeof(double) : sizeof(float);
  return chunk_logits_bytes(chunk, vocab, bf16) + loss_bytes * chunk;
}

namespace {

// The bf16 chunks (a.x_bf16 already rounded): logits (chunk, V) in bf16, rounded by the GEMM and
// turned into the bf16 d loss / d logits in place; the rows' fp64 losses added to `result`.
void lm_head_chunks_bf16(const CrossEntropyArgs& a, int64_t chunk, uint16_t* logits,
                         double* row_loss, CrossEntropyResult& result) {
  Backend& device = backend();
  const bool grad = a.dx != nullptr;
  std::vector<double> losses(static_cast<size_t>(chunk));
  for (int64_t t0 = 0; t0 < a.n_tokens; t0 += chunk) {
    const int64_t rows = std::min(chunk, a.n_tokens - t0);
    const uint16_t* x = a.x_bf16 + t0 * a.hidden;
    device.gemm_bf16_to_bf16(Trans::no, Trans::yes, rows, a.vocab, a.hidden, 1.0f, x, a.hidden,
                             a.weight_bf16, a.hidden, logits, a.vocab);
    if (a.logits != nullptr) widen_bf16(a.logits + t0 * a.vocab, logits, rows * a.vocab);
    rows_bf16_kernel<<<static_cast<unsigned>(rows), cuda_rows::kRowThreads>>>(
        logits, row_loss, a.targets + t0, a.vocab, grad, a.grad_scale);
    check_launch("cross_entropy rows (bf16)");
    device.copy_to_host(losses.data(), row_loss, sizeof(double) * static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) result.loss_sum += losses[r];
    if (!grad) continue;
    device.gemm_bf16(Trans::no, Trans::no, rows, a.hidden, a.vocab, 1.0f, logits, a.vocab,
                     a.weight_bf16, a.hidden, 0.0f, a.dx + t0 * a.hidden, a.hidden);
    if (a.dweight != nullptr) {
      device.gemm_bf16(Trans::yes, Trans::no, a.vocab, a.hidden, rows, 1.0f, logits, a.vocab, x,
                       a.hidden, 1.0f, a.dweight, a.hidden);
    }
  }
}

}  // namespace

CrossEntropyResult lm_head_cross_entropy(const CrossEntropyArgs& a) {
  TITAN_CHECK(a.n_tokens >= 0 && a.hidden > 0 && a.vocab > 0,
              "CUDA cross-entropy: bad sizes (tokens ", a.n_tokens, ", hidden ", a.hidden,
              ", vocab ", a.vocab, ")");
  TITAN_CHECK(a.dx != nullptr || a.dweight == nullptr,
              "cross-entropy: dweight is requested only with dx");
  const bool bf16 = a.weight_bf16 != nullptr;
  TITAN_CHECK(!bf16 || a.x_bf16 != nullptr, "cross-entropy: bf16 weights need room for x in bf16");
  Backend& device = backend();
  std::vector<int32_t> targets(static_cast<size_t>(a.n_tokens));
  device.copy_to_host(targets.data(), a.targets, sizeof(int32_t) * targets.size());
  CrossEntropyResult result;
  for (int64_t n = 0; n < a.n_tokens; ++n) {
    const int32_t t = targets[n];
    TITAN_CHECK(t == kIgnoreIndex || (t >= 0 && t < a.vocab), "cross-entropy: target ", t,
                " at token ", n, " is outside [0, ", a.vocab, ") and not the ignore index -100");
    if (t != kIgnoreIndex) ++result.n_scored;
  }
  if (a.n_tokens == 0) return result;
  const int64_t chunk = titan::lm_head_chunk_tokens(a.n_tokens, a.vocab, a.chunk_tokens);
  Buffer own;
  void* workspace = a.workspace;
  if (workspace == nullptr) {
    own = Buffer(device.memory(),
                 static_cast<size_t>(
                     lm_head_workspace_bytes(a.n_tokens, a.hidden, a.vocab, a.chunk_tokens, bf16)),
                 MemCategory::activations);
    workspace = own.data();
  }
  void* row_loss = static_cast<char*>(workspace) + chunk_logits_bytes(chunk, a.vocab, bf16);
  const bool grad = a.dx != nullptr;
  if (bf16) {
    round_to_bf16(a.x_bf16, a.x, a.n_tokens * a.hidden);
    lm_head_chunks_bf16(a, chunk, static_cast<uint16_t*>(workspace), static_cast<double*>(row_loss),
                        result);
    return result;
  }
  float* logits = static_cast<float*>(workspace);  // (chunk, V)
  std::vector<float> losses(static_cast<size_t>(chunk));
  for (int64_t t0 = 0; t0 < a.n_tokens; t0 += chunk) {
    const int64_t rows = std::min(chunk, a.n_tokens - t0);
    const float* x = a.x + t0 * a.hidden;
    device.gemm_f32(Trans::no, Trans::yes, rows, a.vocab, a.hidden, 1.0f, x, a.hidden, a.weight,
                    a.hidden, 0.0f, logits, a.vocab);
    if (a.logits != nullptr) {
      device.copy_on_device(a.logits + t0 * a.vocab, logits,
                            sizeof(float) * static_cast<size_t>(rows * a.vocab));
    }
    rows_kernel<<<static_cast<unsigned>(rows), cuda_rows::kRowThreads>>>(
        logits, static_cast<float*>(row_loss), a.targets + t0, a.vocab, grad, a.grad_scale);
    check_launch("cross_entropy rows");
    device.copy_to_host(losses.data(), row_loss, sizeof(float) * static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) result.loss_sum += losses[r];
    if (!grad) continue;
    device.gemm_f32(Trans::no, Trans::no, rows, a.hidden, a.vocab, 1.0f, logits, a.vocab, a.weight,
                    a.hidden, 0.0f, a.dx + t0 * a.hidden, a.hidden);
    if (a.dweight != nullptr) {
      device.gemm_f32(Trans::yes, Trans::no, a.vocab, a.hidden, rows, 1.0f, logits, a.vocab, x,
                      a.hidden, 1.0f, a.dweight, a.hidden);
    }
  }
  return result;
}

}  // namespace titan::cuda_ops
