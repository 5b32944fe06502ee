// AdamW over a model's flat parameter groups, with torch's global-norm gradient clipping.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "titan/distributed/communicator.h"
#include "titan/nn/param_group.h"
#include "titan/ops/adamw.h"

namespace titan {

// A model cut over a tensor-parallel or expert-parallel group (models/parallelize.h): the gradient
// norm sums the squares of the parameters `cut` names over `group`, and counts each replicated
// parameter once (its gradient is the same on every rank of the group). Under EP x TP without
// FSDP the experts' squares are summed over `expert_group` (the EP group) instead, those `expert`
// names, while the TP cuts' are summed over `group` (the TP group).
struct CutModelNorm {
  Communicator* group = nullptr;  // null: no tensor or expert parallel
  std::function<bool(const ParamView&)> cut;
  Communicator* expert_group = nullptr;  // null: the experts, if cut, sum over `group`
  std::function<bool(const ParamView&)> expert;
};

class AdamWOptimizer {
 public:
  // Allocates the AdamW state (exp_avg, exp_avg_sq) of every group. With `shards`, the groups
  // are this rank's FSDP shards (distributed/fsdp.h) and the gradient norm sums over that group's
  // ranks; with `cut_model`, over the TP or EP group as it says.
  AdamWOptimizer(std::vector<ParamGroup>& groups, const AdamWConfig& config,
                 Communicator* shards = nullptr, CutModelNorm cut_model = {});

  // The L2 norm of all gradients (fp64 sum). A non-finite norm is a titan::Error naming the
  // first parameter holding a non-finite gradient (on this rank).
  double grad_norm() const;
  // torch.nn.utils.clip_grad_norm_: scales gradients by max_norm / (norm + 1e-6) when that is
  // below 1 -- in the next step(), fused into AdamW's reading of each gradient (CPU: scaled in
  // place first, as before) -- max_norm 0 disables. Returns the norm before clipping.
  double clip_grad_norm(double max_norm);
  // One AdamW update at `lr`; the step counter (bias correction) advances by one.
  void step(double lr);

  int64_t step_count() const { return step_; }
  void set_step_count(int64_t step) { step_ = step; }

 private:
  std::vector<ParamGroup>& groups_;
  AdamWConfig config_;
  Communicator* shards_ = nullptr;
  CutModelNorm cut_model_;
  int64_t step_ = 0;
  // clip_grad_norm's coefficient, applied by the next step's AdamW (fused there on CUDA); 1 when
  // no clipping is pending.
  float pending_grad_scale_ = 1.0f;

  // Every group's arrays in the groups' order, read afresh (FSDP may move a group's buffers).
  std::vector<AdamWArrays> arrays() const;
};

}  // namespace titan
