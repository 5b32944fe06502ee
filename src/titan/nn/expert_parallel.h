// Expert parallel inside a sparse MoE block (torchtitan's meaning): the ranks of an EP group are
// data-parallel ranks, each with its own tokens, and each holds E / ep whole experts of every
// sparse layer (rank r experts [r E/ep, (r + 1) E/ep)). After routing and dispatch (rows grouped
// by expert, so by the rank holding it), the ranks exchange their per-expert row counts, each row
// goes to its expert's rank, the grouped-experts kernel runs there on what arrived, and the
// outputs come back the same way (nn/layers.h SparseMoeBlock; ops/moe_stages.h the stages).
//
// The rows that arrive at a rank come in rank order of their senders, each sender's rows grouped
// by the receiver's local experts; the grouped kernel needs each expert's rows together, so they
// are permuted expert-major on arrival (an expert's rows: rank 0's, then rank 1's, ...) and back
// before they return.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "titan/core/dtype.h"
#include "titan/ops/moe.h"

namespace titan {

// The EP group's all-to-all-v (Communicator::all_to_all_v_async and its wait): this rank sends
// send_counts[p] elements of `dtype` (f32, bf16 or i32) to rank p, from `send` after those for the
// ranks before p, and receives recv_counts[p] from rank p into `recv`, likewise in rank order;
// recv_counts[p] is what rank p sends this rank. Returns when `recv` is filled. Every rank of the
// group calls it in the same order.
using AllToAllV =
    std::function<void(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                       const std::vector<int64_t>& recv_counts, DType dtype)>;

// One forward's exchange of one sparse layer: who sends how many rows of which expert to whom,
// kept for the backward, which crosses the same way in reverse.
class ExpertExchange {
 public:
  // Exchanges the row counts per (rank, local expert) over the group: `offsets` (E + 1), the
  // dispatch plan's, expert e owning rows [offsets[e], offsets[e + 1]) of this rank's rows.
  void plan(const int32_t* offsets, int64_t n_experts, int rank, int degree,
            const AllToAllV& all_to_all_v);
  // The rows that arrive at this rank (from every rank, itself included).
  int64_t arrived_rows() const { return static_cast<int64_t>(expert_row_.size()); }
  // (E / ep + 1) the local experts' row ranges over the arrived rows, expert-major.
  const int32_t* expert_offsets() const { return expert_offsets_.data(); }
  // token_rows (R, width) in dispatch order -> expert_rows (arrived, width) expert-major, on every
  // rank of the group at once; `staging` holds the arrived rows as they come (room for them).
  void to_experts(const void* token_rows, void* expert_rows, int64_t width, DType dtype,
                  void* staging, const AllToAllV& all_to_all_v) const;
  // The reverse: expert_rows (arrived, width) back to token_rows (R, width) on their senders.
  void from_experts(const void* expert_rows, void* token_rows, int64_t width, DType dtype,
                    void* staging, const AllToAllV& all_to_all_v) const;

 private:
  std::vector<int64_t> sent_rows_;       // (ep) rows this rank sends each rank
  std::vector<int64_t> arrived_from_;    // (ep) rows each rank sends this one
  std::vector<int32_t> expert_offsets_;  // (E / ep + 1)
  std::vector<int64_t> expert_row_;      // (arrived) each arrived row's expert-major row
};

// The most rows that can arrive at one rank of `degree` in a sparse layer's exchange, each rank
// routing `tokens` tokens to `top_k` distinct experts of `n_experts`: every rank's tokens each
// choosing as many of this rank's n_experts / degree experts as they can. No row is ever dropped,
// so the rooms below hold this many and a step never needs more (the plan counts them).
int64_t most_arrived_rows(int64_t tokens, int64_t top_k, int64_t n_experts, int64_t degree);

// What one sparse layer's forward keeps under expert parallel for its backward: its exchange and
// the grouped kernel's gate and up activations over the rows that arrived, carved from the
// activation arena for the most rows that can arrive (models/decoder_lm_activations.cpp).
struct ExpertParallelRows {
  ExpertExchange exchange;
  float* gate = nullptr;  // (rows, Im) fp32, or under bf16 compute bf16 values
  float* up = nullptr;
  int64_t rows = 0;  // most_arrived_rows
};

// The expert side's room while a sparse layer runs, shared by every layer, carved from the
// activation arena for `rows` = most_arrived_rows: the arrived rows' inputs, outputs and gradients
// and the grouped kernel's scratch (ops/moe.h), and the exchange's staging (rows x h fp32, the
// widest row it moves). Under bf16 compute x (the arrived inputs) and act hold bf16 values, and
// out is there (the staged backward's recomputed outputs, fp32).
struct ExpertParallelScratch {
  float *x = nullptr, *y = nullptr, *act = nullptr, *dgate = nullptr, *dup = nullptr,
        *dact = nullptr, *w_rows = nullptr, *dweight_rows = nullptr, *out = nullptr,
        *staging = nullptr;
  int64_t rows = 0;
  // The grouped kernel's scratch over `arrived` rows; dgate, dup, dact, w_rows, dweight_rows and
  // out only where `like` has them (a forward a backward follows, a backward). `arrived` beyond
  // `rows` is an error naming both (it cannot happen: most_arrived_rows bounds it).
  ExpertsScratch view(int64_t arrived, const ExpertsScratch& like) const;
};

}  // namespace titan
