#include "titan/train/lr_schedule.h"

#include <cmath>

#include "titan/core/error.h"

namespace titan {

LrSchedule LrSchedule::make(double lr, int64_t total_steps, int64_t warmup_steps,
                            double decay_ratio, const std::string& decay_type,
                            double min_lr_factor) {
  LrSchedule s;
  if (warmup_steps > total_steps) {
    s.adjusted = "lr_scheduler.warmup_steps (" + std::to_string(warmup_steps) +
                 ") exceeds training.steps (" + std::to_string(total_steps) +
                 "): warm-up shortened to " + std::to_string(total_steps) +
                 " steps, as torchtitan does";
    warmup_steps = total_steps;
  }
  s.lr = lr;
  s.warmup_steps = warmup_steps;
  s.decay_type = decay_type;
  s.min_lr_factor = min_lr_factor;
  s.decay_steps =
      decay_ratio < 0
          ? total_steps - warmup_steps
          : static_cast<int64_t>(std::round(static_cast<double>(total_steps) * decay_ratio));
  if (warmup_steps + s.decay_steps > total_steps) {
    s.adjusted += (s.adjusted.empty() ? "" : "; ") + std::string("lr_scheduler: warmup_steps (") +
                  std::to_string(warmup_steps) + ") plus decay steps (" +
                  std::to_string(s.decay_steps) + ") exceed training.steps (" +
                  std::to_string(total_steps) + "): decay shortened to " +
                  std::to_string(total_steps - warmup_steps) + " steps, as torchtitan does";
    s.decay_steps = total_steps - warmup_steps;
  }
  s.stable_steps = total_steps - warmup_steps - s.decay_steps;
  return s;
}

double LrSchedule::at(int64_t step) const {
  const int64_t i = step - 1;  // torchtitan's scheduler counts from 0
  double factor = 1.0;
  if (i < warmup_steps) {
    // Linear warmup that never hands out lr 0: (i + 1) / (warmup + 1).
    factor = static_cast<double>(i + 1) / static_cast<double>(warmup_steps + 1);
  } else if (i >= warmup_steps + stable_steps && decay_steps > 0) {
    const double progress =
        static_cast<double>(i - warmup_steps - stable_steps) / static_cast<double>(decay_steps);
    double decayed = 1.0;
    if (decay_type == "linear") decayed = 1.0 - progress;
    if (decay_type == "sqrt") decayed = 1.0 - std::sqrt(progress);
    if (decay_type == "cosine") decayed = 0.5 * (1.0 + std::cos(M_PI * progress));
    factor = min_lr_factor + (1.0 - min_lr_factor) * decayed;
  }
  return lr * factor;
}

}  // namespace titan
