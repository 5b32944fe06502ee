// Weights holding NaN or Inf compute garbage (and make every training step non-finite), so every
// load scans them once -- a pass over memory already being read, cheap beside the load -- and
// refuses them with one line naming the first tensor, unless allowed for debugging
// (--allow-nonfinite-weights; checkpoint.allow_nonfinite_weights in training).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "titan/core/dtype.h"

namespace titan {

class NonfiniteScan {
 public:
  // Counts the non-finite values of one tensor (`n` values of `dtype` at `data`), read from `file`.
  void add(std::string_view file, std::string_view tensor, const void* data, DType dtype, size_t n);
  // The same for a tensor whose non-finite values are already counted (`count`: a sharded
  // tensor's counts summed over the ranks holding it).
  void add_count(std::string_view file, std::string_view tensor, size_t count);
  // Nothing non-finite: returns. Otherwise a titan::Error naming the file and the first tensor
  // holding any, and the counts; with `allow`, the same as a warning on stderr instead.
  void check(bool allow) const;

 private:
  std::string first_file_, first_;  // the first tensor holding non-finite values
  size_t first_count_ = 0;
  size_t tensors_ = 0;  // tensors holding any
  uint64_t total_ = 0;
};

}  // namespace titan
