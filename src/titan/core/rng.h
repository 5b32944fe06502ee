// Deterministic random numbers. Every parameter draws from its own stream, keyed by the run seed
// and the parameter's fully qualified name, so initialisation does not depend on the order
// parameters are built in, on the thread count, or (with FSDP) on which rank owns the shard.
#pragma once

#include <cstdint>
#include <string_view>

namespace titan {

// SplitMix64 / xoshiro256** generator.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  Rng(uint64_t seed, std::string_view stream_name);
  uint64_t next_u64();
  double uniform();  // [0, 1)
  // Standard normal by Box-Muller; fills n values of N(mean, std^2).
  void fill_normal(float* out, int64_t n, float mean, float std);

 private:
  uint64_t state_[4];
};

uint64_t fnv1a_hash(std::string_view text);
// SplitMix64's output function of x + 0x9e3779b97f4a7c15 (its state step): a bijection that mixes
// every input bit into every output bit, so chained on a key's fields it is a counter-based
// generator -- the value at any index computed directly, in any order (LoRA's dropout masks,
// ops/lora_dropout.h).
uint64_t mix64(uint64_t x);

}  // namespace titan
