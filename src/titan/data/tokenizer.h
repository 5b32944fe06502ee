// Hugging Face tokenizer.json byte-level BPE (Qwen2/Qwen3; Llama-3's variant loads too), giving the
// ids Hugging Face tokenizers gives. Pipeline: added tokens found first in the raw text, NFC on the
// rest, the Split pre-tokenizer, BPE per pre-token; decode maps ids back to bytes and repairs
// invalid UTF-8 with U+FFFD. Anything in tokenizer.json we do not implement is refused by name.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "titan/data/added_tokens.h"
#include "titan/data/bpe.h"
#include "titan/data/pretokenizer.h"
#include "titan/data/string_map.h"

namespace titan {

class Tokenizer {
 public:
  // A model folder holding tokenizer.json (and optionally tokenizer_config.json, for eos/pad), or
  // the path of a tokenizer.json file (its folder's tokenizer_config.json is read if present).
  static Tokenizer load(const std::string& dir_or_json_path);

  // Ids of text; invalid UTF-8 is first replaced as bytes.decode("utf-8", errors="replace") does.
  // No post-processor template is applied: the ids equal HF encode(text, add_special_tokens=False)
  // (for Qwen2/Qwen3 the same as the default; a rendered chat template already holds its BOS).
  // parse_special=false equals HF's encode_special_tokens=True: special tokens in text are encoded
  // as plain text, while added tokens that are not special (<think>, <tool_call>, ...) are still
  // recognised. Thread-safe.
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;
  // encode(text) inside the post-processor's TemplateProcessing "single" template: HF's
  // tokenizer(text), add_special_tokens=True. Llama 3 puts <|begin_of_text|> first; Qwen's
  // tokenizer.json adds nothing. For raw prompts and pre-training documents.
  std::vector<int32_t> encode_with_special_tokens(std::string_view text,
                                                  bool parse_special = true) const;

  // Text of ids, invalid UTF-8 replaced by U+FFFD (errors="replace"). skip_special drops special
  // added tokens only (<think> stays). Ids with no token are dropped, as Hugging Face does.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  // Id of a token string (vocabulary form, e.g. "Ġworld", or an added token); -1 if absent.
  int32_t token_to_id(std::string_view token) const;
  // Token string of id; empty when id has no token.
  std::string id_to_token(int32_t id) const;
  // Number of ids, added tokens included (Hugging Face's len(tokenizer)); max id + 1.
  size_t vocab_size() const { return tokens_.size(); }
  bool is_special(int32_t id) const;

  // From tokenizer_config.json's bos_token / eos_token / pad_token; -1 when absent.
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  int32_t pad_id() const { return pad_id_; }

 private:
  struct Loader;
  void encode_segment(std::string_view text, bool parse_special, std::vector<int32_t>& ids) const;
  void encode_normalized(std::string_view text, std::vector<int32_t>& ids) const;

  std::vector<std::string> tokens_;     // id -> token string; empty for unused ids
  std::vector<std::string> decoded_;    // id -> bytes the decoder emits
  std::vector<bool> special_;           // id -> special added token
  StringMap<int32_t> token_ids_;        // token string -> id (added tokens take precedence)
  AddedTokenMatcher raw_added_;         // added tokens with normalized=false: found in raw text
  AddedTokenMatcher normalized_added_;  // normalized=true: found after normalisation
  bool nfc_ = false;
  std::optional<PreTokenizer> pre_tokenizer_;
  BpeModel bpe_;
  std::vector<int32_t> special_prefix_, special_suffix_;  // the single template around $A
  int32_t bos_id_ = -1, eos_id_ = -1, pad_id_ = -1;
};

}  // namespace titan
