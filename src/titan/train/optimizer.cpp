#include "titan/train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "titan/backend/backend.h"
#include "titan/core/error.h"
#include "titan/dispatch/device_ops.h"

namespace titan {

AdamWOptimizer::AdamWOptimizer(std::vector<ParamGroup>& groups, const AdamWConfig& config,
                               Communicator* shards, CutModelNorm cut_model)
    : groups_(groups), config_(config), shards_(shards), cut_model_(std::move(cut_model)) {
  for (ParamGroup& g : groups_) {
    TITAN_CHECK(g.grads() != nullptr, "optimizer: group ", g.name(), " has no gradients");
    g.allocate_optimizer_state();
  }
}

double AdamWOptimizer::grad_norm() const {
  double sum = 0.0;
  if (cut_model_.group == nullptr) {
    sum = device_ops().sum_squares_all(arrays());
  } else {
    double cut = 0.0;      // summed over the TP or EP group; `sum` holds the replicated parameters'
    double experts = 0.0;  // under EP x TP without FSDP: summed over the EP group
    for (const ParamGroup& g : groups_) {
      for (const ParamView& v : g.views()) {
        const double squares = device_ops().sum_squares(g.grads() + v.offset, v.numel);
        if (cut_model_.expert_group != nullptr && cut_model_.expert(v)) {
          experts += squares;
        } else {
          (cut_model_.cut(v) ? cut : sum) += squares;
        }
      }
    }
    cut_model_.group->all_reduce_sum(&cut, 1);
    sum += cut;
    if (cut_model_.expert_group != nullptr) {
      cut_model_.expert_group->all_reduce_sum(&experts, 1);
      sum += experts;
    }
  }
  if (shards_ != nullptr) shards_->all_reduce_sum(&sum, 1);
  const double norm = std::sqrt(sum);
  if (std::isfinite(norm)) return norm;
  for (const ParamGroup& g : groups_) {
    for (const ParamView& v : g.views()) {
      const int64_t i = device_ops().find_nonfinite(g.grads() + v.offset, v.numel);
      if (i < 0) continue;
      float value = 0.0f;  // read through the backend: the gradients may be a device's memory
      backend().copy_to_host(&value, g.grads() + v.offset + i, sizeof(float));
      fail("non-finite gradient in ", v.spec.name, " (element ", i, " is ", value, ")");
    }
  }
  TITAN_CHECK((shards_ == nullptr || shards_->size() == 1) && cut_model_.group == nullptr,
              "the gradient norm is not finite: a non-finite gradient, or an overflow, in another "
              "rank's shard");
  fail("gradient norm overflowed (every gradient is finite; their squares are not)");
}

double AdamWOptimizer::clip_grad_norm(double max_norm) {
  const double norm = grad_norm();
  const double coef = max_norm / (norm + 1e-6);
  pending_grad_scale_ = max_norm > 0 && coef < 1.0 ? static_cast<float>(coef) : 1.0f;
  return norm;
}

void AdamWOptimizer::step(double lr) {
  ++step_;
  device_ops().adamw_step_all(arrays(), config_, static_cast<float>(lr), step_,
                              pending_grad_scale_);
  pending_grad_scale_ = 1.0f;
}

std::vector<AdamWArrays> AdamWOptimizer::arrays() const {
  std::vector<AdamWArrays> out;
  out.reserve(groups_.size());
  for (ParamGroup& g : groups_) {
    out.push_back({g.params(), g.grads(), g.exp_avg(), g.exp_avg_sq(), g.numel()});
  }
  return out;
}

}  // namespace titan
