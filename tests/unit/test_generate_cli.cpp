// `titan generate` end to end on a tiny random model folder with the real Qwen3 tokenizer: the
// streamed text equals the library's, batch JSON Lines, interactive chat from stdin, and every
// bad input ending as one line on stderr with a non-zero exit.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_generate_util.h"
#include "test_hostile_inputs.h"
#include "test_tokenizer_python.h"
#include "titan/data/chat_template.h"
#include "titan/infer/generate.h"
#include "titan/models/decoder_lm.h"
#include "titan/models/hf_checkpoint.h"
#include "titan/models/hf_export.h"
#include "unit/test_safetensors_util.h"

namespace titan {
namespace {

using nlohmann::json;
using test::TempDir;

struct CommandResult {
  int status;
  std::string out, err;
};

// Runs titan with `args` (already shell-quoted), stdin from `input`.
CommandResult titan_cli(const std::string& args, const TempDir& dir,
                        const std::string& input = "") {
  const std::string titan = test::env_or_empty("TITAN_BINARY_DIR") + "/titan";
  const std::string in = dir / "stdin", out = dir / "stdout", err = dir / "stderr";
  std::ofstream(in) << input;
  const std::string cmd =
      "'" + titan + "' " + args + " < '" + in + "' > '" + out + "' 2> '" + err + "'";
  const int status = std::system(cmd.c_str());
  const auto slurp = [](const std::string& p) {
    std::ifstream f(p);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  return {status, slurp(out), slurp(err)};
}

int count_lines(const std::string& s) {
  return static_cast<int>(std::count(s.begin(), s.end(), '\n'));
}

// A tiny model over the real tokenizer's vocabulary, exported with the tokenizer files.
class GenerateCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    folder_ = test::scratch_dir("generate_cli");
    DecoderLM model(test::tiny_generate_args(true, 151936, 64));
    model.initialize(8);
    HfExportOptions options;
    options.dtype = DType::f32;
    options.source_dir = test::qwen3_tokenizer_dir();
    export_hf_folder((folder_ / "model").string(), model, options);
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(folder_); }
  static std::string model_dir() { return (folder_ / "model").string(); }

  // What the library generates (greedy) for `text`.
  static GenerateResult library(const std::string& text, int64_t max_new,
                                DType dtype = DType::f32) {
    const Tokenizer tok = Tokenizer::load(model_dir());
    std::unique_ptr<CausalLM> model = load_hf_model(model_dir());
    GenerateOptions o = generation_defaults(model_dir(), model->args());
    o.sampling.do_sample = false;
    o.max_new_tokens = max_new;
    return generate_text(InferenceWeights(*model, dtype), tok, tok.encode(text), o);
  }

  TempDir dir_;
  static std::filesystem::path folder_;  // shared by the suite's tests
};
std::filesystem::path GenerateCli::folder_;

TEST_F(GenerateCli, StreamsTheLibrarysTextAndReportsSpeed) {
  const CommandResult r = titan_cli(
      "generate --model '" + model_dir() + "' --prompt 'Hello there' --greedy --max-new-tokens 12",
      dir_);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, library("Hello there", 12).text + "\n");
  EXPECT_NE(r.err.find("tokens/s"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("time to first token"), std::string::npos) << r.err;
}

TEST_F(GenerateCli, Bf16WeightsOnRequest) {
  const CommandResult r = titan_cli("generate --model '" + model_dir() +
                                        "' --prompt 'Hello there' --greedy --max-new-tokens 12 "
                                        "--dtype bfloat16",
                                    dir_);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, library("Hello there", 12, DType::bf16).text + "\n");
}

TEST_F(GenerateCli, ChatTemplateAndSeededSampling) {
  const std::string args = "generate --model '" + model_dir() +
                           "' --prompt 'Hi' --chat --no-think --system 'Be brief' "
                           "--temperature 0.8 --top-k 20 --top-p 0.9 --seed 5 --max-new-tokens 8";
  const CommandResult a = titan_cli(args, dir_);
  ASSERT_EQ(a.status, 0) << a.err;
  const CommandResult b = titan_cli(args, dir_);
  EXPECT_EQ(a.out, b.out);
}

TEST_F(GenerateCli, BatchJsonLines) {
  const std::string prompts = dir_ / "prompts.jsonl";
  std::ofstream(prompts) << R"({"prompt": "The sky is"})"
                         << "\n\n"
                         << R"({"messages": [{"role": "user", "content": "Hi"}]})"
                         << "\n";
  const CommandResult r = titan_cli("generate --model '" + model_dir() + "' --prompts '" + prompts +
                                        "' --greedy --max-new-tokens 6",
                                    dir_);
  ASSERT_EQ(r.status, 0) << r.err;
  std::istringstream lines(r.out);
  std::string line;
  std::vector<json> results;
  while (std::getline(lines, line)) results.push_back(json::parse(line));
  ASSERT_EQ(results.size(), 2u);
  const std::string chat =
      apply_qwen3_chat_template({{"user", "Hi", ""}}, /*add_generation_prompt=*/true, true);
  const GenerateResult want0 = library("The sky is", 6), want1 = library(chat, 6);
  EXPECT_EQ(results[0]["index"], 0);
  EXPECT_EQ(results[0]["ids"].get<std::vector<int32_t>>(), want0.ids);
  EXPECT_EQ(results[0]["text"], want0.text);
  EXPECT_EQ(results[1]["ids"].get<std::vector<int32_t>>(), want1.ids);
  EXPECT_EQ(results[1]["finish_reason"], want1.finish_reason);
}

TEST_F(GenerateCli, InteractiveChatKeepsHistoryAndResets) {
  const CommandResult r =
      titan_cli("generate --model '" + model_dir() + "' --greedy --no-think --max-new-tokens 4",
                dir_, "Hi\nAgain\n/reset\nHi\n");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("(history cleared)"), std::string::npos) << r.err;
  // Three answers; the first and the last saw the same conversation.
  const std::string chat = apply_qwen3_chat_template({{"user", "Hi", ""}}, true, false);
  const std::string first = library(chat, 4).text + "\n";
  EXPECT_EQ(r.out.substr(0, first.size()), first);
  EXPECT_EQ(r.out.substr(r.out.size() - first.size()), first);
  // Turns two and three reuse the cached keys and values of the prefix their rendered
  // conversation shares with the one before (at least "<|im_start|>user\nHi..." up to the
  // assistant header), and say so in their stats line.
  size_t cached_turns = 0;
  for (size_t at = r.err.find(" cached, "); at != std::string::npos;
       at = r.err.find(" cached, ", at + 1)) {
    ++cached_turns;
  }
  EXPECT_EQ(cached_turns, 2u) << r.err;
}

void expect_one_line_error(const CommandResult& r, const std::string& needle) {
  EXPECT_NE(r.status, 0);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
}

TEST_F(GenerateCli, BadInputs) {
  const std::string m = "generate --model '" + model_dir() + "' ";
  expect_one_line_error(titan_cli(m + "--prompt ''", dir_), "--prompt is empty");
  expect_one_line_error(titan_cli(m + "--prompt hi --device cuda", dir_),
                        "'cuda' is not available");
  expect_one_line_error(titan_cli(m + "--prompt hi --device tpu", dir_), "unknown device 'tpu'");
  std::string long_prompt;
  for (int i = 0; i < 80; ++i) long_prompt += " word";
  expect_one_line_error(titan_cli(m + "--prompt '" + long_prompt + "'", dir_),
                        "more than the model's max_position_embeddings (64)");
  expect_one_line_error(titan_cli(m + "--prompt hi --max-new-tokens 64", dir_),
                        "does not fit the KV cache");
  expect_one_line_error(titan_cli(m + "--prompt hi --top-p 1.5", dir_), "top_p");
  expect_one_line_error(titan_cli(m + "--prompt hi --dtype float8", dir_),
                        "weight dtype \"float8\" is not one of auto, bfloat16, float32");
  const std::string prompts = dir_ / "bad.jsonl";
  std::ofstream(prompts) << R"({"prompt": "ok"})"
                         << "\n"
                         << R"({"text": "no"})"
                         << "\n";
  expect_one_line_error(titan_cli(m + "--max-new-tokens 4 --prompts '" + prompts + "'", dir_),
                        "bad.jsonl:2");
  // A folder with weights but no tokenizer.
  DecoderLM model(test::tiny_generate_args(true));
  model.initialize(1);
  HfExportOptions options;
  options.dtype = DType::f32;
  export_hf_folder(dir_ / "bare", model, options);
  expect_one_line_error(titan_cli("generate --model '" + (dir_ / "bare") + "' --prompt hi", dir_),
                        "no tokenizer.json");
}

// Issue 12: a normalizer nested 200,000 deep used to overflow the stack while the tokenizer was
// read; now the parser's depth limit refuses the file, which is left as it was.
TEST_F(GenerateCli, DeeplyNestedNormalizerIsRefused) {
  DecoderLM model(test::tiny_generate_args(true));
  model.initialize(1);
  HfExportOptions options;
  options.dtype = DType::f32;
  export_hf_folder(dir_ / "deep", model, options);
  std::string qwen3;
  {
    std::ifstream in(test::qwen3_tokenizer_dir() + "/tokenizer.json");
    qwen3.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string tokenizer =
      test::with_normalizer(qwen3, test::nested_sequence_normalizer(200'000));
  const std::string path = dir_ / "deep/tokenizer.json";
  std::ofstream(path) << tokenizer;
  const CommandResult r =
      titan_cli("generate --model '" + (dir_ / "deep") + "' --prompt hi --max-new-tokens 2", dir_);
  ASSERT_TRUE(WIFEXITED(r.status)) << "killed by signal " << WTERMSIG(r.status);
  EXPECT_EQ(WEXITSTATUS(r.status), 1);
  EXPECT_EQ(r.err,
            "titan generate: error: " + path + ": tokenizer.json nests deeper than 128 levels\n");
  std::ifstream in(path);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), tokenizer);
}

}  // namespace
}  // namespace titan
