// Hands out consecutive 64-byte aligned views of one arena of floats; with a null base it only
// measures, so one table both sizes an allocation and carves it (the model's activations).
#pragma once

#include <algorithm>
#include <cstdint>

namespace titan {

class Carver {
 public:
  explicit Carver(float* base) : base_(base) {}
  float* take(int64_t n) {
    float* p = base_ == nullptr ? nullptr : base_ + used_;
    used_ += (n + 15) / 16 * 16;
    return p;
  }
  int64_t used() const { return used_; }
  // Back to `used` floats: what is taken next overlaps what was taken after it.
  void rewind(int64_t used) { used_ = used; }
  // Past `used` floats, if not already.
  void skip_past(int64_t used) { used_ = std::max(used_, used); }

 private:
  float* base_;
  int64_t used_ = 0;
};

}  // namespace titan
