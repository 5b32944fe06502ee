#include "titan/data/bpe_trainer.h"

#include <algorithm>
#include <filesystem>
#include <queue>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "titan/core/error.h"
#include "titan/core/progress.h"
#include "titan/data/byte_level.h"
#include "titan/data/unicode.h"
#include "titan/data/utf8.h"
#include "titan/io/atomic_file.h"

namespace titan {
namespace {

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

struct Word {
  std::vector<int32_t> symbols;
  int64_t count;
};

// A pair's count when it was queued; stale entries (the count changed since) are skipped.
struct QueueEntry {
  int64_t count;
  uint64_t key;
  bool operator<(const QueueEntry& o) const {
    // priority_queue pops the largest: the highest count, then the smallest key.
    return count != o.count ? count < o.count : key > o.key;
  }
};

class MergeState {
 public:
  MergeState(std::vector<Word> words) : words_(std::move(words)) {
    for (size_t w = 0; w < words_.size(); ++w) add_pairs(static_cast<int32_t>(w), +1);
    for (const auto& [key, count] : counts_) queue_.push({count, key});
  }

  // The most frequent pair with at least min_count occurrences; false when none is left.
  bool best(int64_t min_count, uint64_t& key) {
    while (!queue_.empty()) {
      const QueueEntry e = queue_.top();
      const auto it = counts_.find(e.key);
      const int64_t now = it == counts_.end() ? 0 : it->second;
      if (now != e.count) {
        queue_.pop();
        continue;
      }
      if (e.count < min_count) return false;
      key = e.key;
      return true;
    }
    return false;
  }

  // Replaces every occurrence of the pair by `merged` and updates the pair counts.
  void merge(uint64_t key, int32_t merged) {
    const auto left = static_cast<int32_t>(key >> 32);
    const auto right = static_cast<int32_t>(key & 0xffffffffu);
    std::vector<int32_t> affected = std::move(where_[key]);
    where_.erase(key);
    std::sort(affected.begin(), affected.end());
    affected.erase(std::unique(affected.begin(), affected.end()), affected.end());
    changed_.clear();
    for (const int32_t w : affected) {
      std::vector<int32_t>& s = words_[w].symbols;
      bool found = false;
      for (size_t i = 0; i + 1 < s.size(); ++i) found |= s[i] == left && s[i + 1] == right;
      if (!found) continue;
      add_pairs(w, -1);
      size_t out = 0;
      for (size_t i = 0; i < s.size(); ++out) {
        if (i + 1 < s.size() && s[i] == left && s[i + 1] == right) {
          s[out] = merged;
          i += 2;
        } else {
          s[out] = s[i++];
        }
      }
      s.resize(out);
      add_pairs(w, +1);
    }
    for (const uint64_t k : changed_) {
      const auto it = counts_.find(k);
      if (it != counts_.end() && it->second > 0) queue_.push({it->second, k});
    }
  }

 private:
  void add_pairs(int32_t w, int sign) {
    const Word& word = words_[w];
    for (size_t i = 0; i + 1 < word.symbols.size(); ++i) {
      const uint64_t k = pair_key(word.symbols[i], word.symbols[i + 1]);
      int64_t& c = counts_[k];
      c += sign * word.count;
      if (sign > 0) where_[k].push_back(w);
      changed_.push_back(k);
      if (c == 0) counts_.erase(k);
    }
  }

  std::vector<Word> words_;
  std::unordered_map<uint64_t, int64_t> counts_;              // pair -> occurrences
  std::unordered_map<uint64_t, std::vector<int32_t>> where_;  // pair -> words (may repeat)
  std::priority_queue<QueueEntry> queue_;
  std::vector<uint64_t> changed_;
};

}  // namespace

BpeTrainer::BpeTrainer(BpeTrainerOptions options)
    : options_(std::move(options)), pre_tokenizer_(*PreTokenizer::from_regex(kQwen2SplitRegex)) {
  TITAN_CHECK(options_.vocab_size >= 256 + options_.special_tokens.size(),
              "tokenizer training: vocab size ", options_.vocab_size, " is below the 256 byte ",
              "symbols plus ", options_.special_tokens.size(), " special tokens");
  TITAN_CHECK(options_.vocab_size <= size_t{INT32_MAX}, "tokenizer training: vocab size ",
              options_.vocab_size, " is too large");
  for (const std::string& s : options_.special_tokens) {
    TITAN_CHECK(!s.empty() && utf8_is_valid(s), "tokenizer training: special token \"", s,
                "\" must be non-empty UTF-8");
  }
  TITAN_CHECK(options_.min_frequency >= 1, "tokenizer training: min_frequency must be >= 1");
}

void BpeTrainer::add_text(std::string_view text) {
  std::string repaired, normalized;
  if (!utf8_is_valid(text)) {
    repaired = utf8_replace_invalid(text);
    text = repaired;
  }
  // Special tokens are matched in the raw text before normalisation, as in the tokenizer.
  for (size_t pos = 0; pos < text.size();) {
    size_t next = text.size(), len = 0;
    for (const std::string& s : options_.special_tokens) {
      const size_t at = text.find(s, pos);
      if (at < next || (at == next && s.size() > len)) {
        next = at;
        len = s.size();
      }
    }
    std::string_view piece = text.substr(pos, next - pos);
    if (nfc_normalize(piece, normalized)) piece = normalized;
    add_normalized(piece);
    if (next == text.size()) break;
    pos = next + len;
  }
}

void BpeTrainer::add_normalized(std::string_view text) {
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = pre_tokenizer_.next_end(text, pos);
    const std::string_view word = text.substr(pos, end - pos);
    const auto it = word_counts_.find(word);
    if (it != word_counts_.end()) {
      ++it->second;
    } else {
      word_counts_.emplace(std::string(word), 1);
    }
    pos = end;
  }
}

TrainedBpe BpeTrainer::train() const {
  TrainedBpe out;
  out.special_tokens = options_.special_tokens;
  // Id b is byte b's symbol, so the byte-level alphabet is the first 256 ids.
  StringMap<int32_t> ids;
  for (int b = 0; b < 256; ++b) {
    out.vocab.push_back(byte_level_encode(std::string(1, static_cast<char>(b))));
    ids.emplace(out.vocab.back(), b);
  }
  std::vector<Word> words;
  words.reserve(word_counts_.size());
  for (const auto& [bytes, count] : word_counts_) {
    Word w{{}, count};
    for (const char c : bytes) w.symbols.push_back(static_cast<uint8_t>(c));
    words.push_back(std::move(w));
  }
  MergeState state(std::move(words));
  const size_t target = options_.vocab_size - options_.special_tokens.size();
  uint64_t key = 0;
  Progress progress("tokenizer training: merges", static_cast<int64_t>(target - out.vocab.size()),
                    ProgressUnit::items);
  while (out.vocab.size() < target && state.best(options_.min_frequency, key)) {
    const auto left = static_cast<int32_t>(key >> 32);
    const auto right = static_cast<int32_t>(key & 0xffffffffu);
    std::string token = out.vocab[left] + out.vocab[right];
    // Two different pairs can spell the same token ("a"+"bc", "ab"+"c"); it keeps its first id.
    const auto [it, added] = ids.emplace(token, static_cast<int32_t>(out.vocab.size()));
    if (added) out.vocab.push_back(std::move(token));
    out.merges.emplace_back(left, right);
    state.merge(key, it->second);
    progress.advance(1);
  }
  return out;
}

void write_hf_tokenizer(const TrainedBpe& bpe, const std::string& dir) {
  using nlohmann::ordered_json;
  TITAN_CHECK(!bpe.special_tokens.empty(), dir, ": a tokenizer needs at least one special token");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  TITAN_CHECK(!ec, dir, ": cannot create the directory: ", ec.message());
  const ordered_json byte_level = {{"type", "ByteLevel"},
                                   {"add_prefix_space", false},
                                   {"trim_offsets", false},
                                   {"use_regex", false}};
  ordered_json added = ordered_json::array(), decoder_config = ordered_json::object();
  for (size_t i = 0; i < bpe.special_tokens.size(); ++i) {
    const ordered_json token = {{"id", bpe.vocab.size() + i},
                                {"content", bpe.special_tokens[i]},
                                {"single_word", false},
                                {"lstrip", false},
                                {"rstrip", false},
                                {"normalized", false},
                                {"special", true}};
    added.push_back(token);
    ordered_json entry = token;
    entry.erase("id");
    decoder_config[std::to_string(bpe.vocab.size() + i)] = entry;
  }
  ordered_json vocab = ordered_json::object();
  for (size_t id = 0; id < bpe.vocab.size(); ++id) vocab[bpe.vocab[id]] = id;
  ordered_json merges = ordered_json::array();
  for (const auto& [l, r] : bpe.merges) merges.push_back({bpe.vocab[l], bpe.vocab[r]});
  const ordered_json tokenizer = {{"version", "1.0"},
                                  {"truncation", nullptr},
                                  {"padding", nullptr},
                                  {"added_tokens", added},
                                  {"normalizer", {{"type", "NFC"}}},
                                  {"pre_tokenizer",
                                   {{"type", "Sequence"},
                                    {"pretokenizers",
                                     {{{"type", "Split"},
                                       {"pattern", {{"Regex", kQwen2SplitRegex}}},
                                       {"behavior", "Isolated"},
                                       {"invert", false}},
                                      byte_level}}}},
                                  {"post_processor", byte_level},
                                  {"decoder", byte_level},
                                  {"model",
                                   {{"type", "BPE"},
                                    {"dropout", nullptr},
                                    {"unk_token", nullptr},
                                    {"continuing_subword_prefix", ""},
                                    {"end_of_word_suffix", ""},
                                    {"fuse_unk", false},
                                    {"byte_fallback", false},
                                    {"ignore_merges", false},
                                    {"vocab", vocab},
                                    {"merges", merges}}}};
  const ordered_json config = {{"add_bos_token", false},
                               {"add_prefix_space", false},
                               {"added_tokens_decoder", decoder_config},
                               {"bos_token", nullptr},
                               {"clean_up_tokenization_spaces", false},
                               {"eos_token", bpe.special_tokens[0]},
                               {"errors", "replace"},
                               {"pad_token", bpe.special_tokens[0]},
                               {"split_special_tokens", false},
                               {"tokenizer_class", "Qwen2Tokenizer"},
                               {"unk_token", nullptr}};
  const std::filesystem::path d(dir);
  // tokenizer.json last: a folder that has it is complete (ensure_default_tokenizer relies on it).
  write_file_atomic((d / "tokenizer_config.json").string(), config.dump(2) + "\n");
  write_file_atomic((d / "tokenizer.json").string(), tokenizer.dump(2) + "\n");
}

}  // namespace titan
