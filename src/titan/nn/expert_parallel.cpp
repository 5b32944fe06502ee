#include "titan/nn/expert_parallel.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "titan/backend/backend.h"
#include "titan/core/error.h"

namespace titan {

void* grow_room(Buffer& buffer, size_t bytes) {
  bytes = std::max<size_t>(bytes, sizeof(float));
  if (buffer.bytes() < bytes) {
    buffer = Buffer();  // the old room first: the peak holds one of them
    buffer = Buffer(backend().memory(), bytes, MemCategory::activations);
  }
  return buffer.data();
}

void ExpertExchange::plan(const int32_t* offsets, int64_t n_experts, int rank, int degree,
                          const AllToAllV& all_to_all_v) {
  TITAN_CHECK(all_to_all_v != nullptr, "expert parallel: the group's all_to_all_v is not set");
  TITAN_CHECK(degree > 1 && rank >= 0 && rank < degree && n_experts % degree == 0,
              "expert parallel: rank ", rank, " of ", degree, " over ", n_experts, " experts");
  const int64_t local = n_experts / degree;
  // counts[p * local + j]: this rank's rows for rank p's local expert j; arrived likewise from p.
  std::vector<int32_t> counts(n_experts), arrived(n_experts);
  for (int64_t e = 0; e < n_experts; ++e) counts[e] = offsets[e + 1] - offsets[e];
  const std::vector<int64_t> per_rank(static_cast<size_t>(degree), local);
  all_to_all_v(counts.data(), per_rank, arrived.data(), per_rank, DType::i32);

  sent_rows_.assign(degree, 0);
  arrived_from_.assign(degree, 0);
  std::vector<int64_t> ends(local + 1, 0);  // the local experts' row ranges, summed in int64
  for (int p = 0; p < degree; ++p) {
    for (int64_t j = 0; j < local; ++j) {
      sent_rows_[p] += counts[p * local + j];
      arrived_from_[p] += arrived[p * local + j];
      ends[j + 1] += arrived[p * local + j];
    }
  }
  for (int64_t j = 0; j < local; ++j) ends[j + 1] += ends[j];
  // Up to ep times this rank's own rows may arrive (every rank's tokens choosing its experts).
  TITAN_CHECK(ends[local] <= INT32_MAX, "expert parallel: ", ends[local], " rows arrive at rank ",
              rank, ", beyond the experts kernels' int32 row numbers (fewer tokens per rank)");
  expert_offsets_.assign(ends.begin(), ends.end());
  // Arrived in (sender, expert) order; expert-major is (expert, sender).
  expert_row_.clear();
  std::vector<int64_t> next(expert_offsets_.begin(), expert_offsets_.end() - 1);
  for (int p = 0; p < degree; ++p) {
    for (int64_t j = 0; j < local; ++j) {
      for (int32_t r = 0; r < arrived[p * local + j]; ++r) expert_row_.push_back(next[j]++);
    }
  }
}

namespace {

std::vector<int64_t> times(const std::vector<int64_t>& rows, int64_t width) {
  std::vector<int64_t> elements(rows.size());
  for (size_t p = 0; p < rows.size(); ++p) elements[p] = rows[p] * width;
  return elements;
}

}  // namespace

void ExpertExchange::to_experts(const void* token_rows, void* expert_rows, int64_t width,
                                DType dtype, Buffer& staging, const AllToAllV& all_to_all_v) const {
  const size_t row_bytes = static_cast<size_t>(width) * dtype_size(dtype);
  auto* arrived = static_cast<std::byte*>(grow_room(staging, expert_row_.size() * row_bytes));
  all_to_all_v(token_rows, times(sent_rows_, width), arrived, times(arrived_from_, width), dtype);
  auto* to = static_cast<std::byte*>(expert_rows);
  for (size_t i = 0; i < expert_row_.size(); ++i) {
    std::memcpy(to + static_cast<size_t>(expert_row_[i]) * row_bytes, arrived + i * row_bytes,
                row_bytes);
  }
}

void ExpertExchange::from_experts(const void* expert_rows, void* token_rows, int64_t width,
                                  DType dtype, Buffer& staging,
                                  const AllToAllV& all_to_all_v) const {
  const size_t row_bytes = static_cast<size_t>(width) * dtype_size(dtype);
  auto* leaving = static_cast<std::byte*>(grow_room(staging, expert_row_.size() * row_bytes));
  const auto* from = static_cast<const std::byte*>(expert_rows);
  for (size_t i = 0; i < expert_row_.size(); ++i) {
    std::memcpy(leaving + i * row_bytes, from + static_cast<size_t>(expert_row_[i]) * row_bytes,
                row_bytes);
  }
  all_to_all_v(leaving, times(arrived_from_, width), token_rows, times(sent_rows_, width), dtype);
}

ExpertsScratch ExpertParallelScratch::view(int64_t rows, int64_t h, int64_t Im,
                                           const ExpertsScratch& like) {
  const auto floats = [](Buffer& b, int64_t count) {
    return static_cast<float*>(grow_room(b, static_cast<size_t>(count) * sizeof(float)));
  };
  const auto floats_if = [&](const float* in_like, Buffer& b, int64_t count) {
    return in_like != nullptr ? floats(b, count) : nullptr;
  };
  ExpertsScratch s;
  s.x = floats(x, rows * h);
  s.y = floats(y, rows * h);
  s.dgate = floats_if(like.dgate, dgate, rows * Im);
  s.dup = floats_if(like.dup, dup, rows * Im);
  s.dact = floats_if(like.dact, dact, rows * Im);
  s.w_rows = floats_if(like.w_rows, w_rows, rows);
  s.dweight_rows = floats_if(like.dweight_rows, dweight_rows, rows);
  s.out = floats_if(like.out, out, rows * h);
  floats(act, rows * Im);
  return s;
}

}  // namespace titan
