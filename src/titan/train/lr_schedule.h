// torchtitan's warmup-stable-decay schedule: a linear warmup, a constant stretch, then a decay
// (linear, sqrt or cosine) to min_lr_factor * lr over the last decay_ratio of the steps.
#pragma once

#include <cstdint>
#include <string>

namespace titan {

struct LrSchedule {
  double lr = 0.0;
  int64_t warmup_steps = 0;
  int64_t stable_steps = 0;
  int64_t decay_steps = 0;
  std::string decay_type = "linear";  // linear | sqrt | cosine | none
  double min_lr_factor = 0.0;

  // decay_ratio < 0: every step after warmup decays (torchtitan's default).
  // Warm-up longer than the run, or warm-up plus decay, is shortened as torchtitan does
  // (warm-up to the run, then decay to what is left), said in `adjusted`.
  static LrSchedule make(double lr, int64_t total_steps, int64_t warmup_steps, double decay_ratio,
                         const std::string& decay_type, double min_lr_factor);
  std::string adjusted;  // "" unless make shortened warm-up or decay
  // The learning rate of update number `step` (1-based, as logged).
  double at(int64_t step) const;
};

}  // namespace titan
