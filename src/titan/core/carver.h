// Hands out consecutive 64-byte aligned, typed views of one arena; with a null base it only
// measures, so one table both sizes an allocation and carves it (the model's activations, an
// inference session's scratch). Positions are counted in 4-byte words: a view of n fp32 or int32
// values takes n words, one of n bf16 values (raw bits) ceil(n / 2).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace titan {

class Carver {
 public:
  explicit Carver(void* base) : base_(static_cast<uint32_t*>(base)) {}
  // A view of `count` elements of T (float, int32_t, or uint16_t for bf16 bits); null when
  // measuring or when count is 0.
  template <typename T = float>
  T* take(int64_t count) {
    static_assert(
        std::is_same_v<T, float> || std::is_same_v<T, int32_t> || std::is_same_v<T, uint16_t>,
        "the arena holds fp32, int32 and bf16 views");
    const int64_t words = (count * static_cast<int64_t>(sizeof(T)) + 3) / 4;
    T* p = base_ == nullptr || count <= 0 ? nullptr : reinterpret_cast<T*>(base_ + used_);
    used_ += (words + 15) / 16 * 16;
    return p;
  }
  int64_t used() const { return used_; }  // words
  // Back to `used` words: what is taken next overlaps what was taken after it.
  void rewind(int64_t used) { used_ = used; }
  // Past `used` words, if not already.
  void skip_past(int64_t used) { used_ = std::max(used_, used); }

 private:
  uint32_t* base_;
  int64_t used_ = 0;
};

}  // namespace titan
