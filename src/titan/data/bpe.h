// The byte-level BPE model: a pre-token's bytes become one symbol per byte, then the adjacent pair
// with the lowest merge rank is merged (leftmost first among equal ranks) until no merge applies.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "titan/data/string_map.h"

namespace titan {

struct BpeMerge {
  int32_t left, right, merged;  // token ids; the rank is the merge's position in the list
};

class BpeModel {
 public:
  BpeModel() = default;
  // byte_ids[b]: id of the single-byte token for byte b. whole_words (Llama-3's ignore_merges):
  // raw bytes -> id of vocabulary entries, looked up before merging; empty when merges always
  // apply.
  BpeModel(const std::array<int32_t, 256>& byte_ids, const std::vector<BpeMerge>& merges,
           StringMap<int32_t> whole_words);

  // Appends the ids of one pre-token (raw bytes, non-empty). Thread-safe: each thread keeps its
  // own cache of recently seen words.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

 private:
  struct Slot {
    uint64_t key;  // (left << 32) | right; kEmpty when unused
    int32_t rank, merged;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};

  // (rank, merged id) of the merge of left and right, rank -1 when there is none.
  const Slot* find(int32_t left, int32_t right) const {
    const uint64_t key =
        (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
    for (size_t i = (key * 0x9E3779B97F4A7C15ull) >> shift_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return &s;
      if (s.key == kEmpty) return nullptr;
    }
  }
  void merge_short(std::vector<int32_t>& ids) const;
  void merge_long(std::vector<int32_t>& ids) const;

  std::array<int32_t, 256> byte_ids_{};
  std::vector<Slot> slots_;  // open addressing, load factor <= 1/2
  size_t mask_ = 0;
  int shift_ = 64;
  StringMap<int32_t> whole_words_;
  uint64_t serial_ = 0;  // identifies this model's word cache entries across threads
};

}  // namespace titan
