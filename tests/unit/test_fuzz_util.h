// Bounded mutation fuzzing (test_safetensors_fuzz.cpp, test_json_fuzz.cpp): the time budget of a
// run, and a mutator that edits JSON text the ways hostile or broken files differ from good ones.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace titan::test {

// A few seconds per target in the suite; TITAN_FUZZ_SECONDS runs longer by hand (and lifts the
// iteration cap), TITAN_FUZZ_SEED explores another sequence of inputs.
struct FuzzBudget {
  std::chrono::seconds time{3};
  int64_t max_iterations = 400'000;
  uint64_t seed = 20240601;
};

inline FuzzBudget fuzz_budget() {
  FuzzBudget b;
  if (const char* s = std::getenv("TITAN_FUZZ_SECONDS")) {
    b.time = std::chrono::seconds(std::strtoll(s, nullptr, 10));
    b.max_iterations = INT64_MAX;
  }
  if (const char* s = std::getenv("TITAN_FUZZ_SEED")) b.seed = std::strtoull(s, nullptr, 10);
  return b;
}

// Runs `one(iteration)` until the budget is spent; returns how many ran.
template <typename F>
int64_t run_fuzz(const FuzzBudget& budget, F&& one) {
  const auto start = std::chrono::steady_clock::now();
  int64_t i = 0;
  for (; i < budget.max_iterations && std::chrono::steady_clock::now() - start < budget.time; ++i) {
    one(i);
  }
  return i;
}

class JsonMutator {
 public:
  explicit JsonMutator(uint64_t seed) : rng_(seed) {}

  size_t pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }

  // One to three edits of `text`; `others` supplies splices from the rest of the corpus.
  void mutate(std::string& text, const std::vector<std::string>& others) {
    const size_t rounds = 1 + pick(3);
    for (size_t r = 0; r < rounds; ++r) mutate_once(text, others);
  }

 private:
  void mutate_once(std::string& t, const std::vector<std::string>& others) {
    const size_t at = pick(t.size() + 1);
    switch (pick(11)) {
      case 0:  // flip a bit
        if (!t.empty()) t[pick(t.size())] ^= static_cast<char>(1u << pick(8));
        break;
      case 1:  // insert a token
      case 2:
        t.insert(at, kTokens[pick(kTokens.size())]);
        break;
      case 3:  // delete a short range
        if (at < t.size()) t.erase(at, 1 + pick(16));
        break;
      case 4:  // truncate
        t.resize(pick(t.size() + 1));
        break;
      case 5: {  // duplicate a range somewhere else (repeated keys, elements, nesting)
        if (t.empty()) break;
        const size_t from = pick(t.size());
        const std::string piece = t.substr(from, 1 + pick(64));
        t.insert(pick(t.size() + 1), piece);
        break;
      }
      case 6:  // replace a run of digits with an edge-case number
        replace_run(t, at, "0123456789.-+eE", kNumbers[pick(kNumbers.size())]);
        break;
      case 7: {  // nest a value deeply: mostly past the parser's limits, at times far past
        static constexpr size_t kDepths[] = {2, 8, 127, 128, 129, 130, 1000, 200'000};
        const size_t depth = kDepths[pick(std::size(kDepths))];
        const bool object = pick(2) == 0;
        std::string open, close;
        for (size_t d = 0; d < depth; ++d) open += object ? "{\"a\":" : "[";
        close.assign(depth, object ? '}' : ']');
        const size_t end = std::min(t.size(), at + pick(32));
        t.insert(end, close);
        t.insert(at, open);
        break;
      }
      case 8: {  // a long string (message quoting must stay short)
        const std::string s(pick(2) ? 300 : 100'000, "x\xc3\xa9\n\""[pick(5)]);
        t.insert(at, "\"" + s + "\"");
        break;
      }
      case 9:  // splice: this text's head, another's tail
        if (!others.empty()) {
          const std::string& o = others[pick(others.size())];
          t = t.substr(0, at) + o.substr(std::min(o.size(), pick(o.size() + 1)));
        }
        break;
      default:  // replace a quoted string's contents with a token from the schemas
        replace_string(t, at);
    }
  }

  void replace_run(std::string& t, size_t at, const char* chars, const std::string& with) {
    const size_t begin = t.find_first_of(chars, at);
    if (begin == std::string::npos) return;
    const size_t end = t.find_first_not_of(chars, begin);
    t.replace(begin, (end == std::string::npos ? t.size() : end) - begin, with);
  }

  void replace_string(std::string& t, size_t at) {
    const size_t open = t.find('"', at);
    if (open == std::string::npos) return;
    const size_t close = t.find('"', open + 1);
    if (close == std::string::npos) return;
    t.replace(open + 1, close - open - 1, kNames[pick(kNames.size())]);
  }

  inline static const std::vector<std::string> kTokens = {
      "{",
      "}",
      "[",
      "]",
      ",",
      ":",
      "\"",
      "null",
      "true",
      "false",
      "0",
      "-1",
      "1e999",
      " ",
      "\"\\u0000\"",
      "\"\\ud800\"",
      "\xff",
      "\n",
      "{}",
      "[]",
      "\"type\":",
      "\"Sequence\"",
      "{\"type\":\"Sequence\",\"normalizers\":[]}",
      "\"ids\":",
      "\"text\":",
      "\"messages\":"};
  inline static const std::vector<std::string> kNumbers = {"0",
                                                           "1",
                                                           "-1",
                                                           "2",
                                                           "3",
                                                           "255",
                                                           "256",
                                                           "257",
                                                           "2147483647",
                                                           "2147483648",
                                                           "-2147483649",
                                                           "4294967296",
                                                           "9223372036854775807",
                                                           "9223372036854775808",
                                                           "18446744073709551616",
                                                           "1.5",
                                                           "1e308",
                                                           "-0",
                                                           "1e-400"};
  inline static const std::vector<std::string> kNames = {"type",
                                                         "Sequence",
                                                         "NFC",
                                                         "NFD",
                                                         "Split",
                                                         "ByteLevel",
                                                         "BPE",
                                                         "Regex",
                                                         "normalizers",
                                                         "pretokenizers",
                                                         "vocab",
                                                         "merges",
                                                         "added_tokens",
                                                         "content",
                                                         "special",
                                                         "id",
                                                         "normalized",
                                                         "eos_token",
                                                         "pad_token",
                                                         "hidden_size",
                                                         "num_hidden_layers",
                                                         "num_attention_heads",
                                                         "num_key_value_heads",
                                                         "head_dim",
                                                         "vocab_size",
                                                         "rope_scaling",
                                                         "rope_parameters",
                                                         "yarn",
                                                         "full_attention",
                                                         "architectures",
                                                         "Qwen3ForCausalLM",
                                                         "Qwen3MoeForCausalLM",
                                                         "num_experts",
                                                         "text",
                                                         "ids",
                                                         "messages",
                                                         "role",
                                                         "user",
                                                         "assistant",
                                                         "system",
                                                         "<|im_start|>",
                                                         "<|endoftext|>",
                                                         ""};

  std::mt19937_64 rng_;
};

}  // namespace titan::test
