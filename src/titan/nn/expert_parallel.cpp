#include "titan/nn/expert_parallel.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "titan/core/error.h"

namespace titan {

int64_t most_arrived_rows(int64_t tokens, int64_t top_k, int64_t n_experts, int64_t degree) {
  return degree * tokens * std::min(top_k, n_experts / degree);
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
                                DType dtype, void* staging, const AllToAllV& all_to_all_v) const {
  const size_t row_bytes = static_cast<size_t>(width) * dtype_size(dtype);
  auto* arrived = static_cast<std::byte*>(staging);
  all_to_all_v(token_rows, times(sent_rows_, width), arrived, times(arrived_from_, width), dtype);
  auto* to = static_cast<std::byte*>(expert_rows);
  for (size_t i = 0; i < expert_row_.size(); ++i) {
    std::memcpy(to + static_cast<size_t>(expert_row_[i]) * row_bytes, arrived + i * row_bytes,
                row_bytes);
  }
}

void ExpertExchange::from_experts(const void* expert_rows, void* token_rows, int64_t width,
                                  DType dtype, void* staging, const AllToAllV& all_to_all_v) const {
  const size_t row_bytes = static_cast<size_t>(width) * dtype_size(dtype);
  auto* leaving = static_cast<std::byte*>(staging);
  const auto* from = static_cast<const std::byte*>(expert_rows);
  for (size_t i = 0; i < expert_row_.size(); ++i) {
    std::memcpy(leaving + i * row_bytes, from + static_cast<size_t>(expert_row_[i]) * row_bytes,
                row_bytes);
  }
  all_to_all_v(leaving, times(arrived_from_, width), token_rows, times(sent_rows_, width), dtype);
}

ExpertsScratch ExpertParallelScratch::view(int64_t arrived, const ExpertsScratch& like) const {
  TITAN_CHECK(arrived <= rows, "expert parallel: ", arrived, " rows arrived, beyond the room for ",
              rows, " (most_arrived_rows)");
  const auto if_like = [](const float* in_like, float* room) {
    return in_like != nullptr ? room : nullptr;
  };
  ExpertsScratch s;
  s.x = x;
  s.y = y;
  s.dgate = if_like(like.dgate, dgate);
  s.dup = if_like(like.dup, dup);
  s.dact = if_like(like.dact, dact);
  s.w_rows = if_like(like.w_rows, w_rows);
  s.dweight_rows = if_like(like.dweight_rows, dweight_rows);
  s.out = if_like(like.out, out);
  return s;
}

}  // namespace titan
