// Tokenizer training: merges chosen as specified, a deterministic result, the vocabulary size asked
// for, and files that Hugging Face tokenizers and transformers load and that give titan.cpp's ids.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "test_dataset_util.h"
#include "test_tokenizer_python.h"
#include "titan/data/bpe_trainer.h"
#include "titan/data/byte_level.h"
#include "titan/data/dataset.h"
#include "titan/data/dataset_read.h"

namespace titan {
namespace {

using nlohmann::json;
using test::error_of;
using test::ScratchDir;

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (const unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) {
    out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  }
  return out;
}

TEST(BpeTrainer, MergesTheMostFrequentPairFirst) {
  BpeTrainerOptions o;
  o.vocab_size = 300;
  BpeTrainer trainer(o);
  // Pre-tokens: "ab" once, " ab" twice, " cd" once. Pairs: (a,b) 3, (Ġ,a) 2, (Ġ,c) 1, (c,d) 1.
  trainer.add_text("ab ab ab cd");
  const TrainedBpe bpe = trainer.train();
  const int32_t a = 'a', b = 'b', space = ' ';
  ASSERT_EQ(bpe.merges.size(), 2u);  // the pairs seen once are below min_frequency 2
  EXPECT_EQ(bpe.merges[0], std::make_pair(a, b));
  EXPECT_EQ(bpe.merges[1], std::make_pair(space, int32_t{256}));
  ASSERT_EQ(bpe.vocab.size(), 258u);
  EXPECT_EQ(bpe.vocab[256], "ab");
  EXPECT_EQ(bpe.vocab[257], byte_level_encode(" ab"));
  EXPECT_EQ(bpe.total_size(), 261u);
}

TEST(BpeTrainer, SpecialTokenStringsAreNotMerged) {
  BpeTrainerOptions o;
  o.vocab_size = 400;
  BpeTrainer trainer(o);
  for (int i = 0; i < 10; ++i) trainer.add_text("x<|endoftext|>x<|im_end|>");
  const TrainedBpe bpe = trainer.train();
  for (const std::string& token : bpe.vocab) {
    EXPECT_EQ(token.find("endoftext"), std::string::npos) << token;
    EXPECT_EQ(token.find("im_end"), std::string::npos) << token;
  }
}

TEST(BpeTrainer, DeterministicWithTheAskedSizeAndSpecialIds) {
  const ScratchDir dir("train_twice");
  DatasetOptions data;
  data.paths = {default_corpus()};
  BpeTrainerOptions o;
  o.vocab_size = 4096;
  const auto start = std::chrono::steady_clock::now();
  const TokenizerTrainStats s = train_tokenizer(data, o, dir / "a");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("trained %zu ids on %lld bytes of the default corpus in %.2f s\n", s.vocab_size,
              static_cast<long long>(s.n_bytes), seconds);
  EXPECT_EQ(s.vocab_size, 4096u);
  EXPECT_GT(s.n_bytes, 1000000);
  train_tokenizer(data, o, dir / "b");
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    EXPECT_EQ(test::read_bytes(dir / ("a/" + std::string(file))),
              test::read_bytes(dir / ("b/" + std::string(file))))
        << file;
  }
  const Tokenizer tok = Tokenizer::load(dir / "a");
  EXPECT_EQ(tok.vocab_size(), 4096u);
  EXPECT_EQ(tok.token_to_id("<|endoftext|>"), 4093);
  EXPECT_EQ(tok.token_to_id("<|im_start|>"), 4094);
  EXPECT_EQ(tok.token_to_id("<|im_end|>"), 4095);
  EXPECT_EQ(tok.eos_id(), 4093);
  EXPECT_EQ(tok.pad_id(), 4093);
  EXPECT_TRUE(tok.is_special(4095));
  // Real English compresses: well under one token per 2 bytes on the corpus it was trained on.
  const DocumentFile corpus = DocumentFile::open(default_corpus(), {});
  size_t bytes = 0, tokens = 0;
  for (size_t i = 0; i < corpus.size(); i += 10) {
    const std::string text = corpus.record(i, DataMode::pretrain).text;
    bytes += text.size();
    tokens += tok.encode(text).size();
  }
  EXPECT_LT(static_cast<double>(tokens), 0.4 * static_cast<double>(bytes));
}

std::vector<std::string> test_corpus() {
  std::vector<std::string> texts = {
      "The quick brown fox jumps over the lazy dog. It's 12:30, isn't it?",
      "int main() {\n\treturn  0;   // tabs,   runs of spaces\n}\n\n\n",
      "Numbers: 3.14159, 1,000,000 and 2024-01-31; 12345678901234567890.",
      "日本語のテキストと中文文本，한국어 문장도 있습니다.",
      "العربية نص قصير. Ελληνικά. Русский текст.",
      "Emoji 🙂👍🏽 and ZWJ 👩‍👩‍👧‍👦 sequences 🏳️‍🌈",
      "Combining: e\xcc\x81 vs \xc3\xa9, A\xcc\x8a vs \xc3\x85 (NFC)",
      "Special <|endoftext|> and <|im_start|>user\nhi<|im_end|> in text",
      "Invalid bytes: \xff\xfe and a cut sequence \xe6\x97 here \xc3",
      "   leading spaces\r\nwindows line\r\n\ttab",
      "",
  };
  // Paragraphs of the corpus itself: the text the tokenizer is for.
  const DocumentFile corpus = DocumentFile::open(default_corpus(), {});
  for (size_t i = 0; i < corpus.size(); i += 37) {
    texts.push_back(corpus.record(i, DataMode::pretrain).text);
  }
  return texts;
}

TEST(BpeTrainerPython, HuggingFaceLoadsItAndGivesTheSameIds) {
  const std::string dir = test::trained_tokenizer_dir();
  const Tokenizer& tok = test::trained_tokenizer();
  const std::vector<std::string> texts = test_corpus();
  json request = {{"dir", dir}, {"texts_hex", json::array()}};
  for (const std::string& t : texts) request["texts_hex"].push_back(hex(t));
  const json response = test::run_reference("data_tokenizer_reference.py", {}, request);
  ASSERT_TRUE(response.contains("ids")) << "no reference response";
  EXPECT_EQ(response["vocab_size"], 2048);
  EXPECT_EQ(response["eos_token"], "<|endoftext|>");
  EXPECT_EQ(response["pad_token"], "<|endoftext|>");
  ASSERT_EQ(response["ids"].size(), texts.size());
  size_t n_tokens = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::vector<int32_t> ids = tok.encode(texts[i]);
    n_tokens += ids.size();
    EXPECT_EQ(ids, response["ids"][i].get<std::vector<int32_t>>())
        << "text " << i << ": " << texts[i];
    EXPECT_EQ(ids, response["auto_ids"][i].get<std::vector<int32_t>>()) << "text " << i;
    EXPECT_EQ(tok.decode(ids), unhex(response["roundtrip_hex"][i].get<std::string>()))
        << "text " << i;
  }
  EXPECT_GT(n_tokens, 10000u);
}

TEST(BpeTrainerBadInput, SizeAndInput) {
  BpeTrainerOptions o;
  o.vocab_size = 258;
  EXPECT_EQ(error_of([&] { BpeTrainer t(o); }),
            "tokenizer training: vocab size 258 is below the 256 byte symbols plus 3 special "
            "tokens");
  const ScratchDir dir("train_bad");
  test::write_text(dir / "ids.jsonl", "{\"ids\": [1, 2]}\n");
  DatasetOptions data;
  data.paths = {dir / "ids.jsonl"};
  EXPECT_EQ(error_of([&] { train_tokenizer(data, {}, dir / "out"); }),
            dir /
                "ids.jsonl:1: already tokenized (\"ids\" or a token file); a tokenizer trains "
                "on text");
  test::write_text(dir / "empty.txt", "\n\n");
  data.paths = {dir / "empty.txt"};
  EXPECT_EQ(error_of([&] { train_tokenizer(data, {}, dir / "out"); }),
            "tokenizer training: the files hold no text");
}

}  // namespace
}  // namespace titan
