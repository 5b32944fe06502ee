// Bounded mutation fuzzing of the JSON inputs a user hands titan: tokenizer.json (with
// tokenizer_config.json), config.json, and dataset files (JSON Lines and JSON lists, plain or
// gzipped). Whatever the bytes, each is read through the same call the CLI uses and either
// accepted (and then usable) or refused with one titan::Error line, naming the file, of bounded
// length -- never a crash, a stack overflow, another exception type, or a message that quotes the
// input whole (the suite also runs under ASan/UBSan). Seeds are generated, mutations
// deterministic; TITAN_FUZZ_SECONDS runs longer (test_fuzz_util.h).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "test_dataset_util.h"
#include "test_fuzz_util.h"
#include "titan/data/bpe_trainer.h"
#include "titan/data/dataset.h"
#include "titan/data/tokenizer.h"
#include "titan/models/hf_config.h"
#include "titan/models/qwen3/flavors.h"

namespace titan {
namespace {

using nlohmann::json;
using test::JsonMutator;
using test::ScratchDir;

// Longer than any real message, far shorter than the inputs the mutator quotes into files.
constexpr size_t kMaxMessageBytes = 1000;

void expect_refusal(const Error& e, const std::string& prefix) {
  const std::string m = e.what();
  ASSERT_EQ(m.find('\n'), std::string::npos) << m;
  ASSERT_EQ(m.rfind(prefix, 0), 0u) << m;
  ASSERT_LE(m.size(), kMaxMessageBytes) << m.substr(0, 2 * kMaxMessageBytes);
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

struct Tally {
  int64_t accepted = 0, refused = 0;
  void print(const char* target, int64_t n) const {
    std::printf("%s: %lld inputs, %lld accepted, %lld refused\n", target, static_cast<long long>(n),
                static_cast<long long>(accepted), static_cast<long long>(refused));
  }
};

TEST(JsonFuzz, TokenizerLoadNeverCrashes) {
  const ScratchDir dir("fuzz_tokenizer");
  // A small tokenizer in Qwen3's layout: the 256 byte symbols, a few merges, three specials.
  BpeTrainerOptions options;
  options.vocab_size = 264;
  options.min_frequency = 1;
  BpeTrainer trainer(options);
  trainer.add_text("the cat sat on the mat; the hat is that");
  write_hf_tokenizer(trainer.train(), dir / "seed");
  json with_sequence = json::parse(test::read_bytes(dir / "seed/tokenizer.json"));
  with_sequence["normalizer"] = {
      {"type", "Sequence"},
      {"normalizers", {{{"type", "NFC"}}, {{"type", "Sequence"}, {"normalizers", json::array()}}}}};
  const std::vector<std::string> tokenizers = {test::read_bytes(dir / "seed/tokenizer.json"),
                                               with_sequence.dump()};
  const std::vector<std::string> configs = {test::read_bytes(dir / "seed/tokenizer_config.json")};

  const test::FuzzBudget budget = test::fuzz_budget();
  JsonMutator m(budget.seed);
  Tally tally;
  const int64_t n = test::run_fuzz(budget, [&](int64_t) {
    std::string tokenizer = tokenizers[m.pick(tokenizers.size())];
    std::string config = configs[0];
    if (m.pick(5) == 0) {
      m.mutate(config, configs);
    } else {
      m.mutate(tokenizer, tokenizers);
    }
    write_file(dir / "tokenizer.json", tokenizer);
    write_file(dir / "tokenizer_config.json", config);
    try {
      const Tokenizer tok = Tokenizer::load(dir.path().string());
      const std::string text = "the cat sat, 42 times";
      const std::vector<int32_t> ids = tok.encode(text);
      for (const int32_t id : ids) ASSERT_LT(static_cast<size_t>(id), tok.vocab_size());
      ASSERT_EQ(tok.decode(ids), text);
      ++tally.accepted;
    } catch (const Error& e) {
      expect_refusal(e, dir.path().string());
      ++tally.refused;
    }
  });
  tally.print("tokenizer", n);
  EXPECT_GT(tally.accepted, 0);
  EXPECT_GT(tally.refused, 0);
}

TEST(JsonFuzz, HfConfigNeverCrashes) {
  const ScratchDir dir("fuzz_config");
  std::vector<std::string> seeds;
  for (const std::string& name : flavor_names()) {
    seeds.push_back(hf_config_json(flavor(name), DType::bf16).dump(1));
  }
  const std::string path = dir / "config.json";
  const test::FuzzBudget budget = test::fuzz_budget();
  JsonMutator m(budget.seed);
  Tally tally;
  const int64_t n = test::run_fuzz(budget, [&](int64_t) {
    std::string text = seeds[m.pick(seeds.size())];
    m.mutate(text, seeds);
    write_file(path, text);
    try {
      const ModelArgs a = read_hf_config(path);
      ASSERT_GE(a.vocab_size, 1);
      ASSERT_GE(a.hidden_size, 1);
      ASSERT_GE(a.num_hidden_layers, 1);
      ASSERT_GE(a.num_key_value_heads, 1);
      ASSERT_EQ(a.num_attention_heads % a.num_key_value_heads, 0);
      ++tally.accepted;
    } catch (const Error& e) {
      expect_refusal(e, path);
      ++tally.refused;
    }
  });
  tally.print("config.json", n);
  EXPECT_GT(tally.accepted, 0);
  EXPECT_GT(tally.refused, 0);
}

TEST(JsonFuzz, DatasetRecordsNeverCrash) {
  const ScratchDir dir("fuzz_dataset");
  const std::vector<json> records = {
      {{"text", "a first document"}},
      {{"text", "b"}, {"meta", {{"url", "x"}, {"n", 3}}}},
      {{"ids", {1, 2, 3, 2147483647}}},
      {{"messages",
        {{{"role", "user"}, {"content", "hi"}},
         {{"role", "assistant"}, {"content", "hello"}, {"reasoning_content", "think"}}}}}};
  std::string lines, list = "[";
  for (const json& r : records) {
    lines += r.dump() + "\n";
    list += (list.size() > 1 ? ",\n" : "\n") + r.dump();
  }
  list += "\n]\n";
  const std::vector<std::string> seeds = {lines, list};

  const test::FuzzBudget budget = test::fuzz_budget();
  JsonMutator m(budget.seed);
  Tally tally;
  int64_t records_read = 0;
  const int64_t n = test::run_fuzz(budget, [&](int64_t) {
    std::string text = seeds[m.pick(seeds.size())];
    m.mutate(text, seeds);
    const bool gzip = m.pick(4) == 0;
    const std::string path =
        dir / (std::string(m.pick(2) ? "a.json" : "a.jsonl") + (gzip ? ".gz" : ""));
    if (gzip) {
      test::write_gzip(path, text);
    } else {
      write_file(path, text);
    }
    try {
      const DocumentFile f = DocumentFile::open(path, {});
      for (size_t i = 0; i < f.size() && i < 64; ++i) {
        for (const DataMode mode : {DataMode::pretrain, DataMode::chat}) {
          try {
            const Record r = f.record(i, mode);
            for (const int32_t id : r.ids) ASSERT_GE(id, 0);
            ++records_read;
          } catch (const Error& e) {
            expect_refusal(e, path);
          }
        }
      }
      ++tally.accepted;
    } catch (const Error& e) {
      expect_refusal(e, path);
      ++tally.refused;
    }
    std::filesystem::remove(path);
  });
  tally.print("dataset files", n);
  std::printf("dataset records read: %lld\n", static_cast<long long>(records_read));
  EXPECT_GT(tally.accepted, 0);
  EXPECT_GT(tally.refused, 0);
  EXPECT_GT(records_read, 0);
}

}  // namespace
}  // namespace titan
