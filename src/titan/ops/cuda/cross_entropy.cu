// The lm_head fused with cross-entropy on CUDA (fp32; ops/cross_entropy.h's contract): per chunk
// of tokens the logits GEMM through the backend (cuBLASLt), one block per row for its softmax, loss
// and d loss / d logits in place (cross_entropy_rows.h), then the two backward GEMMs; the full
// logits never exist. The targets are read back and checked on the host first (the CPU's message);
// the rows' losses are read back per chunk and summed on the host in fp64, in token order.
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

}  // namespace

int64_t lm_head_workspace_bytes(int64_t n_tokens, int64_t, int64_t vocab, int64_t chunk_tokens,
                                bool) {
  const int64_t chunk = titan::lm_head_chunk_tokens(n_tokens, vocab, chunk_tokens);
  return static_cast<int64_t>(sizeof(float)) * chunk * (vocab + 1);
}

CrossEntropyResult lm_head_cross_entropy(const CrossEntropyArgs& a) {
  TITAN_CHECK(a.n_tokens >= 0 && a.hidden > 0 && a.vocab > 0,
              "CUDA cross-entropy: bad sizes (tokens ", a.n_tokens, ", hidden ", a.hidden,
              ", vocab ", a.vocab, ")");
  TITAN_CHECK(a.dx != nullptr || a.dweight == nullptr,
              "cross-entropy: dweight is requested only with dx");
  TITAN_CHECK(a.weight_bf16 == nullptr,
              "CUDA cross-entropy: bf16 lm_head weights are not implemented on CUDA yet");
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
                     lm_head_workspace_bytes(a.n_tokens, a.hidden, a.vocab, a.chunk_tokens, false)),
                 MemCategory::activations);
    workspace = own.data();
  }
  float* logits = static_cast<float*>(workspace);  // (chunk, V)
  float* row_loss = logits + chunk * a.vocab;      // (chunk)
  const bool grad = a.dx != nullptr;
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
        logits, row_loss, a.targets + t0, a.vocab, grad, a.grad_scale);
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
