// Reading tokenizer.json (and tokenizer_config.json) into a Tokenizer. Each component type the
// file names is either implemented exactly or refused with its name; nothing is approximated.
#include <filesystem>
#include <new>
#include <nlohmann/json.hpp>
#include <vector>

#include "titan/core/error.h"
#include "titan/data/byte_level.h"
#include "titan/data/tokenizer.h"
#include "titan/data/utf8.h"
#include "titan/io/json_util.h"

namespace titan {

namespace fs = std::filesystem;
using nlohmann::json;

struct Tokenizer::Loader {
  std::string path;  // for messages
  Tokenizer& tok;
  std::vector<int32_t> special_ids = {};
  size_t model_vocab_entries = 0;
  bool template_seen = false;

  template <typename... Args>
  [[noreturn]] void error(const Args&... args) const {
    fail(path, ": ", args...);
  }

  std::string type_of(const json& j, const char* where) const {
    if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
      error(where, " has no \"type\"");
    }
    return j["type"].get<std::string>();
  }

  bool flag(const json& j, const char* key) const {
    if (!j.contains(key) || j[key].is_null()) return false;
    if (!j[key].is_boolean()) error("\"", key, "\" must be true or false");
    return j[key].get<bool>();
  }

  // Sequences may nest; walked with a stack of the normalizers still to read (in file order), not
  // by recursion, so no nesting the parser lets through can exhaust the call stack.
  void normalizer(const json& j) {
    if (j.is_null()) return;
    std::vector<const json*> pending = {&j};
    while (!pending.empty()) {
      const json& n = *pending.back();
      pending.pop_back();
      const std::string type = type_of(n, "normalizer");
      if (type == "NFC") {
        tok.nfc_ = true;
      } else if (type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
        const json& list = n["normalizers"];
        for (auto it = list.rbegin(); it != list.rend(); ++it) pending.push_back(&*it);
      } else {
        error("normalizer ", json_quote(type), " is not supported (only NFC)");
      }
    }
  }

  // Sequence[Split(regex, Isolated), ByteLevel(use_regex=false)]: the GPT-4-style layout of
  // Qwen2/Qwen3 and Llama-3.
  void pre_tokenizer(const json& j) {
    const std::string type = type_of(j, "pre_tokenizer");
    const bool sequence = type == "Sequence" && j.contains("pretokenizers") &&
                          j["pretokenizers"].is_array() && j["pretokenizers"].size() == 2;
    if (!sequence) {
      error("pre_tokenizer ", json_quote(type),
            " is not supported (only Sequence[Split, ByteLevel], as in Qwen2/Qwen3/Llama-3)");
    }
    const json& split = j["pretokenizers"][0];
    const json& byte_level = j["pretokenizers"][1];
    const std::string split_type = type_of(split, "pre_tokenizer.pretokenizers[0]");
    const std::string byte_type = type_of(byte_level, "pre_tokenizer.pretokenizers[1]");
    if (split_type != "Split" || byte_type != "ByteLevel") {
      error("pre_tokenizer Sequence[", json_quote(split_type), ", ", json_quote(byte_type),
            "] is not supported (only Sequence[Split, ByteLevel])");
    }
    if (split.value("behavior", "") != "Isolated" || flag(split, "invert")) {
      error("Split pre-tokenizer: only behavior \"Isolated\" without invert is supported");
    }
    const json pattern = split.value("pattern", json::object());
    if (!pattern.contains("Regex") || !pattern["Regex"].is_string()) {
      error("Split pre-tokenizer: only a \"Regex\" pattern is supported");
    }
    tok.pre_tokenizer_ = PreTokenizer::from_regex(pattern["Regex"].get<std::string>());
    if (!tok.pre_tokenizer_) {
      error("Split regex is not supported (only the Qwen2 and Llama-3 patterns): ",
            json_quote(pattern["Regex"].get<std::string>()));
    }
    if (flag(byte_level, "add_prefix_space") || flag(byte_level, "use_regex")) {
      error("ByteLevel pre-tokenizer: add_prefix_space and use_regex must be false");
    }
  }

  // ByteLevel only adjusts offsets; TemplateProcessing's "single" template says which special
  // tokens encode_with_special_tokens puts around the text (the "pair" template has no use here).
  // Either alone or in a Sequence, as Llama 3's file has them. Read after the added tokens, whose
  // ids the template names.
  void post_processor(const json& j) {
    if (j.is_null()) return;
    const std::string type = type_of(j, "post_processor");
    if (type == "Sequence") {
      if (!j.contains("processors") || !j["processors"].is_array()) {
        error("post_processor Sequence has no \"processors\" list");
      }
      for (const json& p : j["processors"]) {
        const std::string inner = type_of(p, "post_processor.processors[]");
        if (inner == "Sequence") error("post_processor: nested Sequence is not supported");
        post_processor(p);
      }
    } else if (type == "TemplateProcessing") {
      template_processing(j);
    } else if (type != "ByteLevel") {
      error("post_processor ", json_quote(type),
            " is not supported (only ByteLevel, TemplateProcessing, or a Sequence of them)");
    }
  }

  void template_processing(const json& j) {
    if (template_seen) error("post_processor: more than one TemplateProcessing");
    template_seen = true;
    if (!j.contains("single") || !j["single"].is_array()) {
      error("TemplateProcessing has no \"single\" list");
    }
    const json specials = j.value("special_tokens", json::object());
    if (!specials.is_object()) error("TemplateProcessing \"special_tokens\" is not an object");
    bool seen_a = false;
    for (const json& piece : j["single"]) {
      if (piece.is_object() && piece.size() == 1 && piece.contains("Sequence")) {
        const json& seq = piece["Sequence"];
        if (!seq.is_object() || seq.value("id", json()) != "A" || seen_a) {
          error("TemplateProcessing \"single\" must hold the sequence $A exactly once");
        }
        seen_a = true;
      } else if (piece.is_object() && piece.size() == 1 && piece.contains("SpecialToken") &&
                 piece["SpecialToken"].is_object() && piece["SpecialToken"].contains("id") &&
                 piece["SpecialToken"]["id"].is_string()) {
        const std::string name = piece["SpecialToken"]["id"].get<std::string>();
        std::vector<int32_t>& out = seen_a ? tok.special_suffix_ : tok.special_prefix_;
        for (const int32_t id : template_token_ids(specials, name)) out.push_back(id);
      } else {
        error(
            "TemplateProcessing \"single\": each piece must be {\"SpecialToken\": {\"id\": ...}} "
            "or {\"Sequence\": {\"id\": \"A\"}}");
      }
    }
    if (!seen_a) error("TemplateProcessing \"single\" must hold the sequence $A exactly once");
  }

  // The ids special_tokens gives a template token (Hugging Face takes them from there, not from
  // the vocabulary); each must be a token of this file.
  std::vector<int32_t> template_token_ids(const json& specials, const std::string& name) const {
    if (!specials.contains(name) || !specials[name].is_object() ||
        !specials[name].contains("ids") || !specials[name]["ids"].is_array()) {
      error("TemplateProcessing: special token ", json_quote(name),
            " has no \"ids\" in \"special_tokens\"");
    }
    std::vector<int32_t> ids;
    for (const json& id : specials[name]["ids"]) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() >= static_cast<int64_t>(tok.tokens_.size()) ||
          tok.tokens_[id.get<size_t>()].empty()) {
        error("TemplateProcessing: special token ", json_quote(name), " has id ", json_excerpt(id),
              ", which is not a token of this file");
      }
      ids.push_back(id.get<int32_t>());
    }
    return ids;
  }

  void decoder(const json& j) const {
    const std::string type = j.is_null() ? "null" : type_of(j, "decoder");
    if (type != "ByteLevel") {
      error("decoder ", j.is_null() ? type : json_quote(type),
            " is not supported (only ByteLevel)");
    }
  }

  void set_token(int32_t id, const std::string& token) {
    if (static_cast<size_t>(id) >= tok.tokens_.size()) tok.tokens_.resize(id + 1);
    tok.tokens_[id] = token;
    tok.token_ids_[token] = id;
  }

  int32_t vocab_id(const StringMap<int32_t>& vocab, const std::string& token, size_t index) const {
    const auto it = vocab.find(token);
    if (it == vocab.end()) {
      error("model.merges[", index, "]: ", json_quote(token), " is not in model.vocab");
    }
    return it->second;
  }

  void model(const json& j) {
    const std::string type = j.is_object() && !j.contains("type") && j.contains("merges")
                                 ? std::string("BPE")
                                 : type_of(j, "model");
    if (type != "BPE") error("model type ", json_quote(type), " is not supported (only BPE)");
    if (flag(j, "byte_fallback")) error("BPE byte_fallback is not supported");
    if (j.contains("dropout") && !j["dropout"].is_null()) error("BPE dropout is not supported");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (j.contains(key) && !j[key].is_null() && j[key] != "") {
        error("BPE ", key, " is not supported");
      }
    }
    if (!j.contains("vocab") || !j["vocab"].is_object()) {
      error("model.vocab is missing or not an object");
    }
    StringMap<int32_t> vocab;
    // Ids number the entries: 0 .. n-1, each once (as in every Qwen and Llama file), so the id
    // tables are as long as the vocabulary, never as large as an id a file claims.
    const auto n_entries = static_cast<int64_t>(j["vocab"].size());
    for (const auto& [token, id] : j["vocab"].items()) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= n_entries ||
          id.get<int64_t>() > INT32_MAX) {
        error("model.vocab[", json_quote(token), "]: id must be an integer in [0, ", n_entries,
              "), the number of entries");
      }
      const auto i = id.get<int32_t>();
      if (static_cast<size_t>(i) < tok.tokens_.size() && !tok.tokens_[i].empty()) {
        error("model.vocab: id ", i, " is used by both ", json_quote(tok.tokens_[i]), " and ",
              json_quote(token));
      }
      vocab.emplace(token, i);
      set_token(i, token);
    }
    model_vocab_entries = vocab.size();
    std::array<int32_t, 256> byte_ids{};
    for (int b = 0; b < 256; ++b) {
      std::string symbol;
      utf8_append(symbol, byte_to_code_point(static_cast<uint8_t>(b)));
      const auto it = vocab.find(symbol);
      if (it == vocab.end())
        error("model.vocab has no entry for byte ", b, " (", json_quote(symbol), ")");
      byte_ids[b] = it->second;
    }
    if (!j.contains("merges") || !j["merges"].is_array()) {
      error("model.merges is missing or not a list");
    }
    std::vector<BpeMerge> merges;
    merges.reserve(j["merges"].size());
    for (size_t i = 0; i < j["merges"].size(); ++i) {
      const json& m = j["merges"][i];
      std::string left, right;
      if (m.is_string()) {
        // Older files: "left right", exactly one space.
        const std::string s = m.get<std::string>();
        const size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
          error("model.merges[", i, "]: ", json_quote(s),
                " is not two tokens separated by one space");
        }
        left = s.substr(0, space);
        right = s.substr(space + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        left = m[0].get<std::string>();
        right = m[1].get<std::string>();
      } else {
        error("model.merges[", i, "]: expected \"left right\" or [\"left\", \"right\"]");
      }
      merges.push_back(
          {vocab_id(vocab, left, i), vocab_id(vocab, right, i), vocab_id(vocab, left + right, i)});
    }
    StringMap<int32_t> whole_words;
    if (flag(j, "ignore_merges")) {
      std::string raw;
      for (const auto& [token, id] : vocab) {
        if (byte_level_decode(token, raw)) whole_words.emplace(raw, id);
      }
    }
    tok.bpe_ = BpeModel(byte_ids, merges, std::move(whole_words));
  }

  void added_tokens(const json& j) {
    if (j.is_null()) return;
    if (!j.is_array()) error("added_tokens is not a list");
    std::vector<AddedToken> raw, normalized;
    size_t next_new_id = model_vocab_entries;
    for (size_t i = 0; i < j.size(); ++i) {
      const json& t = j[i];
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
          t["id"].get<int64_t>() < 0 || t["id"].get<int64_t>() > INT32_MAX ||
          !t.contains("content") || !t["content"].is_string() || t["content"] == "") {
        error("added_tokens[", i, "]: needs a non-negative integer \"id\" and a \"content\"");
      }
      for (const char* key : {"lstrip", "rstrip", "single_word"}) {
        if (flag(t, key)) error("added_tokens[", i, "]: \"", key, "\" is not supported");
      }
      AddedToken a{t["content"].get<std::string>(), t["id"].get<int32_t>(), flag(t, "special")};
      // Hugging Face ignores these ids: a token already in the vocabulary keeps its id, a new one
      // gets the next id after the vocabulary. A file that disagrees would silently change ids.
      const int32_t known = tok.token_to_id(a.content);
      const auto expected = known >= 0 ? known : static_cast<int32_t>(next_new_id++);
      if (a.id != expected) {
        error("added_tokens[", i, "] ", json_quote(a.content), ": id ", a.id,
              ", but Hugging Face tokenizers would assign ", expected);
      }
      set_token(a.id, a.content);
      if (a.special) special_ids.push_back(a.id);
      (flag(t, "normalized") ? normalized : raw).push_back(a);
    }
    tok.raw_added_ = AddedTokenMatcher(std::move(raw));
    tok.normalized_added_ = AddedTokenMatcher(std::move(normalized));
  }

  // The bytes the ByteLevel decoder emits per id: the table's inverse when every character of the
  // token is in it, else the token's own UTF-8 (added tokens such as "<|im_end|>" or ones with
  // characters outside the table), as Hugging Face's ByteLevel decoder does.
  void decoded_forms() {
    tok.decoded_.resize(tok.tokens_.size());
    tok.special_.assign(tok.tokens_.size(), false);
    std::string raw;
    for (size_t id = 0; id < tok.tokens_.size(); ++id) {
      const std::string& t = tok.tokens_[id];
      if (!utf8_is_valid(t)) error("token ", id, " is not valid UTF-8");
      tok.decoded_[id] = byte_level_decode(t, raw) ? raw : t;
    }
    for (const int32_t id : special_ids) tok.special_[id] = true;
  }

  // bos_token / eos_token / pad_token: a string, an {"content": ...} object (older files) or null.
  int32_t config_token(const json& config, const char* key, const std::string& file) const {
    if (!config.contains(key) || config[key].is_null()) return -1;
    const json& v = config[key];
    std::string content;
    if (v.is_string()) {
      content = v.get<std::string>();
    } else if (v.is_object() && v.contains("content") && v["content"].is_string()) {
      content = v["content"].get<std::string>();
    } else {
      fail(file, ": \"", key, "\" must be a string or {\"content\": ...}");
    }
    const int32_t id = tok.token_to_id(content);
    TITAN_CHECK(id >= 0, file, ": ", key, " ", json_quote(content), " is not a token of ", path);
    return id;
  }
};

Tokenizer Tokenizer::load(const std::string& dir_or_json_path) {
  fs::path json_path = dir_or_json_path;
  std::error_code ec;
  if (fs::is_directory(json_path, ec)) json_path /= "tokenizer.json";
  TITAN_CHECK(fs::is_regular_file(json_path, ec), json_path.string(), ": no such file");
  try {
    const json j = read_json_file(json_path.string(), "tokenizer.json", kMaxJsonDocumentDepth);
    Tokenizer tok;
    Loader loader{json_path.string(), tok};
    if (!j.is_object()) loader.error("not a tokenizer.json object");
    if (!j.contains("model")) loader.error("no \"model\"");
    if (!j.contains("pre_tokenizer")) loader.error("no \"pre_tokenizer\"");
    loader.model(j["model"]);
    loader.normalizer(j.value("normalizer", json()));
    loader.pre_tokenizer(j["pre_tokenizer"]);
    loader.decoder(j.value("decoder", json()));
    loader.added_tokens(j.value("added_tokens", json()));
    loader.post_processor(j.value("post_processor", json()));
    loader.decoded_forms();
    const fs::path config_path = json_path.parent_path() / "tokenizer_config.json";
    if (fs::is_regular_file(config_path, ec)) {
      const json config =
          read_json_file(config_path.string(), "tokenizer_config.json", kMaxJsonDocumentDepth);
      TITAN_CHECK(config.is_object(), config_path.string(), ": not a JSON object");
      tok.bos_id_ = loader.config_token(config, "bos_token", config_path.string());
      tok.eos_id_ = loader.config_token(config, "eos_token", config_path.string());
      tok.pad_id_ = loader.config_token(config, "pad_token", config_path.string());
    }
    return tok;
  } catch (const std::bad_alloc&) {
    fail(json_path.string(), ": out of memory loading the tokenizer");
  }
}

}  // namespace titan
