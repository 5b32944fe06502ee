// Trains a byte-level BPE tokenizer the way Qwen's is built: NFC, Qwen2's Split pre-tokenizer, one
// symbol per byte (GPT-2's byte-to-unicode alphabet), then merges of the most frequent adjacent
// pair until the vocabulary is full; special tokens are added after the merged vocabulary.
// Training is deterministic: ties between pairs of equal count go to the smaller (left, right)
// id pair, and nothing depends on hashing or thread count.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "titan/data/pretokenizer.h"
#include "titan/data/string_map.h"

namespace titan {

// Qwen2/Qwen3's Split regex, as written in their tokenizer.json.
inline constexpr std::string_view kQwen2SplitRegex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct BpeTrainerOptions {
  // Total ids, special tokens included (Hugging Face's len(tokenizer)); at least 256 + specials.
  size_t vocab_size = 2048;
  // Added as special tokens after the merged vocabulary, in this order; the first is the EOS and
  // pad token of tokenizer_config.json.
  std::vector<std::string> special_tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  int64_t min_frequency = 2;  // pairs seen fewer times are never merged
};

struct TrainedBpe {
  std::vector<std::string> vocab;                   // id -> token in byte-level form
  std::vector<std::pair<int32_t, int32_t>> merges;  // in rank order
  std::vector<std::string> special_tokens;          // ids vocab.size(), vocab.size() + 1, ...
  size_t total_size() const { return vocab.size() + special_tokens.size(); }
};

class BpeTrainer {
 public:
  explicit BpeTrainer(BpeTrainerOptions options);

  // Counts the pre-tokens of text (invalid UTF-8 replaced, NFC applied; special-token strings
  // are cut out, as the tokenizer matches them before splitting).
  void add_text(std::string_view text);
  // Runs the merges. The vocabulary is smaller than asked when the corpus runs out of pairs.
  TrainedBpe train() const;

 private:
  void add_normalized(std::string_view text);

  BpeTrainerOptions options_;
  PreTokenizer pre_tokenizer_;
  StringMap<int64_t> word_counts_;  // pre-token bytes -> occurrences
};

// Writes dir/tokenizer.json (Qwen3's layout: NFC, Split + ByteLevel, BPE, ByteLevel decoder) and
// dir/tokenizer_config.json (eos and pad = the first special token), each atomically; creates dir.
void write_hf_tokenizer(const TrainedBpe& bpe, const std::string& dir);

}  // namespace titan
