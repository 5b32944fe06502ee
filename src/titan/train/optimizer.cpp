#include "titan/train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "titan/backend/backend.h"
#include "titan/core/error.h"

namespace titan {

AdamWOptimizer::AdamWOptimizer(std::vector<ParamGroup>& groups, const AdamWConfig& config,
                               Communicator* shards)
    : groups_(groups), config_(config), shards_(shards) {
  for (ParamGroup& g : groups_) {
    TITAN_CHECK(g.grads() != nullptr, "optimizer: group ", g.name(), " has no gradients");
    g.allocate_optimizer_state();
  }
}

double AdamWOptimizer::grad_norm() const {
  double sum = 0.0;
  for (const ParamGroup& g : groups_) {
    const float* grads = g.grads();
    double group_sum = 0.0;
#pragma omp parallel for reduction(+ : group_sum) schedule(static)
    for (int64_t i = 0; i < g.numel(); ++i) group_sum += static_cast<double>(grads[i]) * grads[i];
    sum += group_sum;
  }
  if (shards_ != nullptr) shards_->all_reduce_sum(&sum, 1);
  const double norm = std::sqrt(sum);
  if (std::isfinite(norm)) return norm;
  for (const ParamGroup& g : groups_) {
    for (const ParamView& v : g.views()) {
      for (int64_t i = 0; i < v.numel; ++i) {
        const float x = g.grads()[v.offset + i];
        TITAN_CHECK(std::isfinite(x), "non-finite gradient in ", v.spec.name, " (element ", i,
                    " is ", x, ")");
      }
    }
  }
  TITAN_CHECK(shards_ == nullptr || shards_->size() == 1,
              "the gradient norm is not finite: a non-finite gradient, or an overflow, in another "
              "rank's shard");
  fail("gradient norm overflowed (every gradient is finite; their squares are not)");
}

double AdamWOptimizer::clip_grad_norm(double max_norm) {
  const double norm = grad_norm();
  const double coef = max_norm / (norm + 1e-6);
  if (max_norm > 0 && coef < 1.0) {
    constexpr int64_t kChunk = 1 << 16;
    const VecKernels& v = backend().vec();
    for (ParamGroup& g : groups_) {
      float* grads = g.grads();
      const int64_t n = g.numel();
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; i += kChunk) {
        v.scale(grads + i, static_cast<float>(coef), std::min(kChunk, n - i));
      }
    }
  }
  return norm;
}

void AdamWOptimizer::step(double lr) {
  ++step_;
  const AdamWScalars s = adamw_scalars(config_, static_cast<float>(lr), step_);
  for (ParamGroup& g : groups_) {
    adamw_update(g.params(), g.grads(), g.exp_avg(), g.exp_avg_sq(), g.numel(), s);
  }
}

}  // namespace titan
