#include "titan/models/nonfinite_weights.h"

#include <cstdio>

#include "titan/core/error.h"
#include "titan/io/convert.h"
#include "titan/io/json_util.h"

namespace titan {

void NonfiniteScan::add(std::string_view file, std::string_view tensor, const void* data,
                        DType dtype, size_t n) {
  add_count(file, tensor, count_nonfinite(data, dtype, n));
}

void NonfiniteScan::add_count(std::string_view file, std::string_view tensor, size_t count) {
  if (count == 0) return;
  if (tensors_++ == 0) {
    first_file_ = file;
    first_ = tensor;
    first_count_ = count;
  }
  total_ += count;
}

void NonfiniteScan::check(bool allow) const {
  if (tensors_ == 0) return;
  const std::string what = first_file_ + ": " + std::to_string(total_) +
                           " non-finite weight(s) (NaN or Inf) in " + std::to_string(tensors_) +
                           " tensor(s), the first " + json_quote(first_) + " with " +
                           std::to_string(first_count_);
  TITAN_CHECK(allow, what,
              "; such weights compute garbage (--allow-nonfinite-weights, or "
              "checkpoint.allow_nonfinite_weights in training, loads them for debugging)");
  std::fprintf(stderr, "warning: %s; loaded anyway (non-finite weights allowed)\n", what.c_str());
}

}  // namespace titan
