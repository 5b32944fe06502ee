// The lm_head projection fused with cross-entropy, chunked over tokens so fp32 logits exist for
// one chunk at a time (a full batch of 151,936-way logits would be gigabytes). With gradients
// requested, each chunk's softmax turns into d loss / d logits in place and is pushed through the
// lm_head GEMMs right away; the logits are never kept.
#pragma once

#include <cstdint>

#include "titan/ops/vocab_shard.h"

namespace titan {

constexpr int32_t kIgnoreIndex = -100;
constexpr int64_t kLogitsChunkBytes = int64_t{320} << 20;

struct CrossEntropyArgs {
  const float* x = nullptr;       // (N, h) final-norm output
  const float* weight = nullptr;  // (V, h) lm_head (the embedding when tied)
  // Mixed precision: weight's bf16 copy (V, h), and room for x rounded to bf16 (N, h). With them
  // the GEMMs take bf16 operands and accumulate in fp32, the logits are kept in bf16 as the
  // lm_head's output is under autocast (half the chunk's bytes), and each row's softmax and loss
  // widen them to fp32 (in registers); d loss / d logits is rounded back into the chunk (at a
  // padded stride, in place) for the backward's bf16 GEMMs.
  const uint16_t* weight_bf16 = nullptr;
  uint16_t* x_bf16 = nullptr;
  const int32_t* targets = nullptr;  // (N) next-token ids, kIgnoreIndex where not scored
  int64_t n_tokens = 0;
  int64_t hidden = 0;
  int64_t vocab = 0;
  // Gradients, optional: dx (N, h) overwritten, dweight (V, h) accumulated (or null with dx: a
  // frozen lm_head, LoRA's base), both for the loss
  // sum(token losses) * grad_scale (grad_scale = 1 / valid tokens of the global batch).
  float* dx = nullptr;
  float* dweight = nullptr;
  float grad_scale = 0.0f;
  float* logits = nullptr;  // optional (N, V) copy of the logits, for tests and evaluation
  // Tokens per chunk; 0 picks the most that keep one chunk's logits within kLogitsChunkBytes
  // (512 tokens for Qwen3's 151,936-entry vocabulary: the lm_head GEMMs run at the ceiling from
  // about that height, and 300 MiB stays a small share of a training step's memory).
  int64_t chunk_tokens = 0;
  // Optional (chunk, V) scratch for one chunk's logits (fp32, or bf16 with weight_bf16) of
  // lm_head_workspace_bytes; null allocates one per call. A caller that runs every step keeps one,
  // so its pages are touched once.
  void* workspace = nullptr;
};

// The tokens per chunk lm_head_cross_entropy uses for n_tokens rows, given args.chunk_tokens.
int64_t lm_head_chunk_tokens(int64_t n_tokens, int64_t vocab, int64_t chunk_tokens);
// The bytes of its workspace: one chunk's logits; in bf16 when the GEMMs take bf16 weights, their
// gradients at a padded stride, and per OpenMP thread (omp_get_max_threads() now) an fp32 row for
// a row's softmax and a bf16 row to set its last row's logits aside; and per OpenMP thread but
// one, a share of the chunk's d x, which the backward's threads compute apart and then sum.
int64_t lm_head_workspace_bytes(int64_t n_tokens, int64_t hidden, int64_t vocab,
                                int64_t chunk_tokens, bool bf16);

struct CrossEntropyResult {
  double loss_sum = 0.0;  // sum of -log p(target) over scored tokens
  int64_t n_scored = 0;
};

CrossEntropyResult lm_head_cross_entropy(const CrossEntropyArgs& args);

// Vocabulary-parallel (tensor parallel; torchtitan's loss_parallel): this rank holds the
// lm_head's rows `shard` (args.weight and weight_bf16 (shard.rows, h), args.vocab = shard.rows),
// x and the targets whole (ids in [0, shard.total)), the same on every rank of the group. Per
// chunk of tokens it computes this rank's logits (chunk, shard.rows) only, and per token takes
// the max logit over the group (shard.all_reduce_max), then the sum of exp(logit - max) and the
// target's logit (zero on the ranks not holding it) over the group (one shard.all_reduce_sum of
// the two, per token): the full logits are never gathered and the loss is the same on every
// rank. Chunks have lm_head_chunk_tokens(n_tokens, shard.total, chunk_tokens) tokens, as the
// gathered loss's, on every rank. The bf16 form rounds where lm_head_cross_entropy's does (bf16
// logits, d loss / d logits rounded from fp32 exp(logit - max) * grad_scale / sum, the target's
// element from its fp32 value less grad_scale). Gradients: dweight (shard.rows, h) accumulated,
// this rank's rows of the whole gradient; dx (N, h) overwritten with this rank's part, G_r W_r:
// the group's sum of the parts is the whole d x, which the caller takes (an all-reduce, or a
// reduce-scatter over the sequence under sequence parallel: the backward of the all-gather that
// gave every rank the whole x). args.logits, optional, gets this rank's (N, shard.rows).
CrossEntropyResult lm_head_cross_entropy_vocab_parallel(const CrossEntropyArgs& args,
                                                        const VocabShard& shard);
// Its workspace's bytes: one chunk's logits of this rank's rows (1 / degree of the gathered
// loss's chunk, in bf16 when the GEMMs take bf16 weights), per OpenMP thread an fp32 row (bf16)
// for exp(logit - max), and the shares of the chunk's d x as lm_head_workspace_bytes counts them.
int64_t lm_head_vocab_parallel_workspace_bytes(int64_t n_tokens, int64_t hidden,
                                               const VocabShard& shard, int64_t chunk_tokens,
                                               bool bf16);

// Reference: whole logits matrix, fp64 softmax; same contract.
CrossEntropyResult lm_head_cross_entropy_reference(const CrossEntropyArgs& args);

}  // namespace titan
