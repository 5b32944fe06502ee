// The tokenizer against Hugging Face tokenizers (every id, decode, round trips) and spec §7.2.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "test_tokenizer_python.h"
#include "titan/core/error.h"
#include "titan/data/tokenizer.h"
#include "titan/data/utf8.h"

namespace titan {
namespace {

using nlohmann::json;

const Tokenizer& qwen3() {
  static const Tokenizer tok = Tokenizer::load(test::qwen3_tokenizer_dir());
  return tok;
}

std::string to_hex(std::string_view s) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (char c : s) {
    out += digits[static_cast<uint8_t>(c) >> 4];
    out += digits[static_cast<uint8_t>(c) & 15];
  }
  return out;
}

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  }
  return out;
}

// Hand-picked texts for every kind of input the issue names.
std::vector<std::string> fixed_corpus() {
  return {
      "The quick brown fox jumps over the lazy dog. It's a well-known pangram; don't you think?",
      "def main(argv):\n\tif len(argv) > 1:\n\t\treturn  0\n    x = [1,  2,   3]\n\n\n\treturn "
      "-1\r\n",
      "    indented\n        more    \n\t \t\nend   ",
      "3.14159 1,000,000 2024-01-01 0x1F 12345678901234567890 -42 +7e-10 ١٢٣ ४५६ Ⅻ ½ ² ③",
      "我们今天去公园散步，天气很好。你好，世界！中文文本测试。",
      "안녕하세요, 세계! 한국어 문장입니다. 가나다라마바사",
      "日本語のテキスト、カタカナとひらがな。ｶﾀｶﾅ 全角ＡＢＣ１２３",
      "مرحبا بالعالم، هذه جملة عربية مع تشكيل: مُحَمَّد وَ عَلِيّ",
      "Привет, мир! Ελληνικά κείμενα. नमस्ते दुनिया। สวัสดีชาวโลก",
      "emoji 👨‍👩‍👧‍👦 👍🏽 🏳️‍🌈 ❤️ 🇯🇵🇺🇸 ✊🏿 "
      "🧑‍💻 "
      "😀😃😄",
      "cafe\u0301 o\u030b e\u0301 A\u030A \u212B \u2126 \u0958 q\u0307\u0323 \u1100\u1161\u11A8 "
      "\uAC00\u11A8 o\u0308\u0304 \u0F73 \uF900 n\u0303",
      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nhmm\n</think>\n\nOK",
      "<|endoftext|><|endoftext|> <|im_sta <<|im_end|>> <tool_call>{}</tool_call> <|fim_pad|>",
      "bad \xff\xfe bytes \xc3\x28 \xe2\x82 x \xed\xa0\x80 \xf4\x90\x80\x80 \xc0\xaf end\xe2",
      "I'M he'S we'RE they'Ve you'll 'd x'\u017f '\u017f it'\u017felf don't O'Neil ''s",
      "a  b   \n\n  c\t\t\n \u00a0\u3000 x \u2028y\u0085z \x1c\x1d w\u200bv\ufeff  ",
      "",
      " ",
      "\n",
      "'",
      "\r\n\r\n",
      "   \n",
      "Hello, world!",
  };
}

// Random mixtures of script fragments, code points from tricky ranges and stray bytes; seeded.
std::vector<std::string> random_corpus(size_t n) {
  std::mt19937 rng(1234);
  const std::vector<std::string> fixed = fixed_corpus();
  const std::vector<std::pair<uint32_t, uint32_t>> ranges = {
      {0x20, 0x7E},     {0x09, 0x0D},     {0xA0, 0xFF},       {0x300, 0x36F},   {0x4E00, 0x4FFF},
      {0xAC00, 0xAC80}, {0x1100, 0x11FF}, {0x1F300, 0x1F6FF}, {0x200B, 0x200F}, {0xFE00, 0xFE0F},
      {0x600, 0x6FF},   {0x900, 0x97F},   {0x2000, 0x206F},   {0x3000, 0x303F}, {0xFF00, 0xFFEF},
      {0x0E00, 0x0E7F}, {0x370, 0x3FF},   {0x1D400, 0x1D4FF}, {0xF900, 0xFAFF}};
  const std::vector<std::string> specials = {
      "<|im_start|>",  "<|im_end|>",      "<think>", "</think>",
      "<|endoftext|>", "<tool_response>", "'s",      "'LL"};
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i) {
    std::string s;
    const int pieces = 1 + static_cast<int>(rng() % 12);
    for (int p = 0; p < pieces; ++p) {
      switch (rng() % 5) {
        case 0: {  // a slice of a fixed text, cut at any byte
          const std::string& f = fixed[rng() % fixed.size()];
          if (f.empty()) break;
          const size_t a = rng() % f.size();
          s += f.substr(a, 1 + rng() % 24);
          break;
        }
        case 1:
        case 2: {  // code points from one range
          const auto& [lo, hi] = ranges[rng() % ranges.size()];
          const int count = 1 + static_cast<int>(rng() % 6);
          for (int c = 0; c < count; ++c) utf8_append(s, lo + rng() % (hi - lo + 1));
          break;
        }
        case 3:
          s += specials[rng() % specials.size()];
          break;
        default:
          s += std::string(1 + rng() % 3, " \t\n"[rng() % 3]);
          if (rng() % 4 == 0) s += static_cast<char>(0x80 + rng() % 0x80);  // stray byte
      }
    }
    out.push_back(s);
  }
  return out;
}

std::vector<std::string> full_corpus() {
  std::vector<std::string> corpus = fixed_corpus();
  for (std::string& s : random_corpus(1500)) corpus.push_back(std::move(s));
  return corpus;
}

// Encodes corpus with both special-token settings in titan and in Hugging Face; every id and
// every round trip must agree.
void expect_matches_hf(const Tokenizer& tok, const std::string& json_path,
                       const std::vector<std::string>& corpus) {
  json request = {{"tokenizer", json_path}, {"encode", json::array()}, {"decode", json::array()}};
  for (bool parse_special : {true, false}) {
    for (const std::string& text : corpus) {
      request["encode"].push_back({{"hex", to_hex(text)}, {"parse_special", parse_special}});
    }
  }
  const json response = test::run_reference("tokenizer_reference.py", {}, request);
  ASSERT_TRUE(response.is_object());
  ASSERT_EQ(response["encode"].size(), request["encode"].size());
  int failures = 0;
  for (size_t i = 0; i < request["encode"].size() && failures < 10; ++i) {
    const std::string text = from_hex(request["encode"][i]["hex"]);
    const bool parse_special = request["encode"][i]["parse_special"];
    const std::vector<int32_t> ids = tok.encode(text, parse_special);
    const auto expected = response["encode"][i]["ids"].get<std::vector<int32_t>>();
    const std::string hf_roundtrip = from_hex(response["encode"][i]["roundtrip_hex"]);
    const std::string roundtrip = tok.decode(ids);
    if (ids != expected || roundtrip != hf_roundtrip) ++failures;
    EXPECT_EQ(ids, expected) << "text (hex) " << to_hex(text) << " parse_special " << parse_special;
    EXPECT_EQ(roundtrip, hf_roundtrip) << "text (hex) " << to_hex(text);
    if (hf_roundtrip == text) {
      EXPECT_EQ(roundtrip, text);
    }
  }
}

TEST(Tokenizer, SpecTestVectors) {
  const Tokenizer& tok = qwen3();
  const std::vector<std::pair<std::string, std::vector<int32_t>>> cases = {
      {"Hello, world!", {9707, 11, 1879, 0}},
      {"Hello world", {9707, 1879}},
      {"The quick brown fox jumps over the lazy dog.",
       {785, 3974, 13876, 38835, 34208, 916, 279, 15678, 5562, 13}},
      {"12345", {16, 17, 18, 19, 20}},
      {"  leading spaces\n\nnew paragraph", {220, 6388, 12621, 271, 931, 14311}},
      {"你好，世界", {108386, 3837, 99489}},
      {"I'm here, they'll go", {40, 2776, 1588, 11, 807, 3278, 728}},
      {"café naïve", {924, 58858, 94880, 586}},
      {"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
       {151644, 872, 198, 13048, 151645, 198, 151644, 77091, 198}},
      {"<think>\n\n</think>\n\n", {151667, 271, 151668, 271}},
  };
  for (const auto& [text, ids] : cases) {
    EXPECT_EQ(tok.encode(text), ids) << text;
    EXPECT_EQ(tok.decode(ids), text);
  }
}

TEST(Tokenizer, VocabularyAndConfig) {
  const Tokenizer& tok = qwen3();
  EXPECT_EQ(tok.vocab_size(), 151669u);
  EXPECT_EQ(tok.eos_id(), 151645);
  EXPECT_EQ(tok.pad_id(), 151643);
  EXPECT_EQ(tok.token_to_id("<|im_end|>"), 151645);
  EXPECT_EQ(tok.token_to_id("\xC4\xA0"), 220);  // "Ġ", the space byte
  EXPECT_EQ(tok.token_to_id("no such token"), -1);
  EXPECT_EQ(tok.id_to_token(151667), "<think>");
  EXPECT_EQ(tok.id_to_token(188), "\xC4\x80");  // byte 0x00 is "Ā"
  EXPECT_EQ(tok.id_to_token(151669), "");
  EXPECT_TRUE(tok.is_special(151643));
  EXPECT_FALSE(tok.is_special(151667));
  EXPECT_FALSE(tok.is_special(9707));
}

TEST(Tokenizer, SpecialTokenParsingAndSkipping) {
  const Tokenizer& tok = qwen3();
  const std::vector<int32_t> parsed = tok.encode("<|im_start|>hi<think>x</think><|endoftext|>");
  EXPECT_EQ(parsed.front(), 151644);
  EXPECT_EQ(parsed.back(), 151643);
  const std::vector<int32_t> plain = tok.encode("<|im_start|>hi<think>", false);
  EXPECT_EQ(plain.back(), 151667);  // <think> is not special: recognised either way
  for (size_t i = 0; i + 1 < plain.size(); ++i) EXPECT_LT(plain[i], 151643);
  EXPECT_EQ(tok.decode({151644, 9707, 151667, 151645}, true), "Hello<think>");
  EXPECT_EQ(tok.decode({151644, 9707, 151645}), "<|im_start|>Hello<|im_end|>");
}

TEST(Tokenizer, MatchesHuggingFaceOnMultilingualCorpus) {
  expect_matches_hf(qwen3(), test::qwen3_tokenizer_dir() + "/tokenizer.json", full_corpus());
}

TEST(Tokenizer, DecodeMatchesHuggingFace) {
  const Tokenizer& tok = qwen3();
  std::mt19937 rng(99);
  json request = {{"tokenizer", test::qwen3_tokenizer_dir() + "/tokenizer.json"},
                  {"encode", json::array()},
                  {"decode", json::array()}};
  std::vector<std::vector<int32_t>> lists;
  for (int i = 0; i < 300; ++i) {
    std::vector<int32_t> ids;
    const int n = static_cast<int>(rng() % 20);
    for (int k = 0; k < n; ++k) {
      switch (rng() % 4) {
        case 0:
          ids.push_back(static_cast<int32_t>(rng() % 256));
          break;  // single bytes
        case 1:
          ids.push_back(static_cast<int32_t>(151643 + rng() % 30));
          break;  // added, past end
        default:
          ids.push_back(static_cast<int32_t>(rng() % 151643));
      }
    }
    lists.push_back(ids);
    request["decode"].push_back({{"ids", ids}, {"skip_special", false}});
    request["decode"].push_back({{"ids", ids}, {"skip_special", true}});
  }
  const json response = test::run_reference("tokenizer_reference.py", {}, request);
  ASSERT_TRUE(response.is_object());
  ASSERT_EQ(response["decode"].size(), 2 * lists.size());
  for (size_t i = 0; i < lists.size(); ++i) {
    EXPECT_EQ(tok.decode(lists[i], false), from_hex(response["decode"][2 * i]));
    EXPECT_EQ(tok.decode(lists[i], true), from_hex(response["decode"][2 * i + 1]));
  }
}

// Llama-3's layout: the same file shape with \p{N}{1,3} and ignore_merges.
TEST(Tokenizer, Llama3StyleSplitMatchesHuggingFace) {
  std::ifstream in(test::qwen3_tokenizer_dir() + "/tokenizer.json");
  json j = json::parse(in);
  auto& regex = j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"];
  std::string pattern = regex.get<std::string>();
  const size_t digits = pattern.find("\\p{N}|");
  ASSERT_NE(digits, std::string::npos);
  pattern.replace(digits, 6, "\\p{N}{1,3}|");
  regex = pattern;
  j["model"]["ignore_merges"] = true;
  // Digit merges, which Qwen's vocabulary lacks, make the {1,3} grouping visible in the ids; the
  // added tokens move up by two to stay after the vocabulary.
  j["model"]["vocab"]["12"] = 151643;
  j["model"]["vocab"]["123"] = 151644;
  for (json& t : j["added_tokens"]) t["id"] = t["id"].get<int32_t>() + 2;
  j["model"]["merges"].push_back(json::array({"1", "2"}));
  j["model"]["merges"].push_back(json::array({"12", "3"}));
  const test::ScratchDir dir("llama3_style");
  const std::string path = dir / "tokenizer.json";
  std::ofstream(path) << j.dump();
  const Tokenizer tok = Tokenizer::load(path);
  expect_matches_hf(tok, path, full_corpus());
}

// Added tokens with normalized=true are found after NFC, so "o\u030b" finds the token "\u0151".
TEST(Tokenizer, NormalizedAddedTokensMatchHuggingFace) {
  std::ifstream in(test::qwen3_tokenizer_dir() + "/tokenizer.json");
  json j = json::parse(in);
  for (json& t : j["added_tokens"]) {
    if (t["content"] == "<think>" || t["content"] == "<|im_end|>") t["normalized"] = true;
  }
  j["added_tokens"].push_back({{"id", 151669},
                               {"content", "\u0151"},
                               {"single_word", false},
                               {"lstrip", false},
                               {"rstrip", false},
                               {"normalized", true},
                               {"special", false}});
  const test::ScratchDir dir("normalized_added");
  const std::string path = dir / "tokenizer.json";
  std::ofstream(path) << j.dump();
  const Tokenizer tok = Tokenizer::load(path);
  EXPECT_EQ(tok.encode("o\u030b"), std::vector<int32_t>{151669});
  expect_matches_hf(tok, path, full_corpus());
}

TEST(Tokenizer, EncodeIsThreadSafe) {
  const Tokenizer& tok = qwen3();
  const std::vector<std::string> corpus = full_corpus();
  std::vector<std::vector<int32_t>> expected;
  for (const std::string& s : corpus) expected.push_back(tok.encode(s));
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = 0; i < corpus.size(); ++i) {
        const size_t k = (i * 7 + static_cast<size_t>(t) * 131) % corpus.size();
        if (tok.encode(corpus[k]) != expected[k]) ++mismatches[t];
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

// A small but valid tokenizer.json (the 256 byte symbols and one merge), edited per bad-input case.
json tiny_tokenizer_json() {
  static const json qwen3_json = [] {
    std::ifstream in(test::qwen3_tokenizer_dir() + "/tokenizer.json");
    return json::parse(in);
  }();
  json j = qwen3_json;
  json vocab = json::object();
  for (const auto& [token, id] : j["model"]["vocab"].items()) {
    if (id.get<int32_t>() < 256) vocab[token] = id;
  }
  vocab["\xC4\xA0t"] = 256;  // "Ġt"
  j["model"]["vocab"] = vocab;
  j["model"]["merges"] = json::array({json::array({"\xC4\xA0", "t"})});
  j["added_tokens"] = json::array();
  return j;
}

std::string load_error(const std::string& text) {
  const test::ScratchDir dir("bad_tokenizer");
  const std::string path = dir / "tokenizer.json";
  std::ofstream(path) << text;
  std::string message;
  try {
    Tokenizer::load(dir.path().string());
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("tokenizer.json"), std::string::npos)
      << "message names no file: " << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << "message is not one line: " << message;
  return message;
}

TEST(Tokenizer, TinyTokenizerLoads) {
  const test::ScratchDir dir("tiny_tokenizer");
  std::ofstream(dir / "tokenizer.json") << tiny_tokenizer_json().dump();
  const Tokenizer tok = Tokenizer::load(dir.path().string());
  EXPECT_EQ(tok.encode(" t t"), (std::vector<int32_t>{256, 256}));
  EXPECT_EQ(tok.eos_id(), -1);
}

TEST(Tokenizer, RefusesBadInput) {
  json j = tiny_tokenizer_json();
  j["model"]["type"] = "WordPiece";
  EXPECT_NE(load_error(j.dump()).find("model type \"WordPiece\" is not supported"),
            std::string::npos);

  j = tiny_tokenizer_json();
  j["normalizer"] = {{"type", "Lowercase"}};
  EXPECT_NE(load_error(j.dump()).find("normalizer \"Lowercase\""), std::string::npos);

  j = tiny_tokenizer_json();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  EXPECT_NE(load_error(j.dump()).find("pre_tokenizer \"Whitespace\""), std::string::npos);

  j = tiny_tokenizer_json();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\s+";
  EXPECT_NE(load_error(j.dump()).find("Split regex is not supported"), std::string::npos);

  j = tiny_tokenizer_json();
  j["decoder"] = {{"type", "WordPiece"}};
  EXPECT_NE(load_error(j.dump()).find("decoder \"WordPiece\""), std::string::npos);

  j = tiny_tokenizer_json();
  j["model"]["merges"] = json::array({"\xC4\xA0 t extra"});
  EXPECT_NE(load_error(j.dump()).find("model.merges[0]"), std::string::npos);

  j = tiny_tokenizer_json();
  j["model"]["merges"] = json::array({json::array({"\xC4\xA0", "zzz"})});
  EXPECT_NE(load_error(j.dump()).find("\"zzz\" is not in model.vocab"), std::string::npos);

  j = tiny_tokenizer_json();
  j["model"]["merges"] = json::array({42});
  EXPECT_NE(load_error(j.dump()).find("model.merges[0]"), std::string::npos);

  // An id far past the entries would size the id tables by the id (found by test_json_fuzz).
  j = tiny_tokenizer_json();
  j["model"]["vocab"]["\xC4\xA0t"] = 2147483647;
  EXPECT_NE(
      load_error(j.dump()).find("model.vocab[\"\\u0120t\"]: id must be an integer in [0, 257)"),
      std::string::npos);

  j = tiny_tokenizer_json();
  j["model"].erase("vocab");
  EXPECT_NE(load_error(j.dump()).find("model.vocab is missing"), std::string::npos);

  j = tiny_tokenizer_json();
  j["model"]["vocab"]["zz"] = j["model"]["vocab"]["!"];  // the ids still number the entries
  j["model"]["vocab"].erase("!");
  EXPECT_NE(load_error(j.dump()).find("no entry for byte 33"), std::string::npos);

  j = tiny_tokenizer_json();
  j["added_tokens"] = json::array({{{"id", 257}, {"content", "<x>"}, {"lstrip", true}}});
  EXPECT_NE(load_error(j.dump()).find("\"lstrip\" is not supported"), std::string::npos);

  j = tiny_tokenizer_json();
  j["added_tokens"] = json::array({{{"id", 300}, {"content", "<x>"}}});
  EXPECT_NE(load_error(j.dump()).find("id 300, but Hugging Face tokenizers would assign 257"),
            std::string::npos);

  // The post-processor: Sequence[ByteLevel, TemplateProcessing] as Llama 3 writes it, broken.
  const auto with_template = [](const json& single, const json& specials) {
    json t = tiny_tokenizer_json();
    t["added_tokens"] = json::array({{{"id", 257}, {"content", "<s>"}, {"special", true}}});
    t["post_processor"] = {{"type", "Sequence"},
                           {"processors", json::array({{{"type", "ByteLevel"}},
                                                       {{"type", "TemplateProcessing"},
                                                        {"single", single},
                                                        {"special_tokens", specials}}})}};
    return t;
  };
  const json bos = {{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}};
  const json seq_a = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
  const json bos_ids = {{"<s>", {{"id", "<s>"}, {"ids", {257}}, {"tokens", {"<s>"}}}}};
  EXPECT_NE(load_error(with_template(json::array({bos}), bos_ids).dump())
                .find("must hold the sequence $A exactly once"),
            std::string::npos);
  EXPECT_NE(load_error(with_template(json::array({bos, seq_a}), json::object()).dump())
                .find("special token \"<s>\" has no \"ids\""),
            std::string::npos);
  const json bad_ids = {{"<s>", {{"id", "<s>"}, {"ids", {9999}}, {"tokens", {"<s>"}}}}};
  EXPECT_NE(load_error(with_template(json::array({bos, seq_a}), bad_ids).dump())
                .find("has id 9999, which is not a token of this file"),
            std::string::npos);
  const json seq_b = {{"Sequence", {{"id", "B"}, {"type_id", 1}}}};
  EXPECT_NE(load_error(with_template(json::array({seq_b}), bos_ids).dump())
                .find("must hold the sequence $A exactly once"),
            std::string::npos);
  j = tiny_tokenizer_json();
  j["post_processor"] = {{"type", "RobertaProcessing"}};
  EXPECT_NE(load_error(j.dump()).find("post_processor \"RobertaProcessing\" is not supported"),
            std::string::npos);
  {  // and read right: <s> before the text, nothing after
    const test::ScratchDir dir("template_processing");
    std::ofstream(dir / "tokenizer.json")
        << with_template(json::array({bos, seq_a}), bos_ids).dump();
    const Tokenizer tok = Tokenizer::load(dir.path().string());
    EXPECT_EQ(tok.encode_with_special_tokens(" t"), (std::vector<int32_t>{257, 256}));
    EXPECT_EQ(tok.encode(" t"), (std::vector<int32_t>{256}));
  }

  EXPECT_NE(load_error("{\"model\": [1, 2,").find("not valid JSON"), std::string::npos);
  EXPECT_NE(load_error("[1, 2]").find("not a tokenizer.json object"), std::string::npos);

  EXPECT_THROW(Tokenizer::load("/nonexistent/folder"), Error);
}

}  // namespace
}  // namespace titan
