// `titan generate` end to end on a tiny random model folder with the real Qwen3 tokenizer (and a
// Llama one over a Llama-3-style tokenizer, for the BOS of raw prompts and chats): the
// streamed text equals the library's, batch JSON Lines, interactive chat from stdin, and every
// bad input ending as one line on stderr with a non-zero exit.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <memory>
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
#include "titan_cli_run.h"
#include "unit/test_safetensors_util.h"

namespace titan {
namespace {

using nlohmann::json;
using test::ScratchDir;

using test::run_titan;
using test::TitanRun;

int count_lines(const std::string& s) {
  return static_cast<int>(std::count(s.begin(), s.end(), '\n'));
}

// A tiny model over the real tokenizer's vocabulary, exported with the tokenizer files.
class GenerateCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    folder_ = std::make_unique<ScratchDir>("generate_cli");
    DecoderLM model(test::tiny_generate_args(true, 151936, 64));
    model.initialize(8);
    HfExportOptions options;
    options.dtype = DType::f32;
    options.source_dir = test::qwen3_tokenizer_dir();
    export_hf_folder(model_dir(), model, options);
  }
  static void TearDownTestSuite() { folder_.reset(); }
  static std::string model_dir() { return *folder_ / "model"; }

  // What the library generates (greedy) for `text`.
  static GenerateResult library(const std::string& text, int64_t max_new, DType dtype = DType::f32,
                                DType kv_cache = DType::f32) {
    const Tokenizer tok = Tokenizer::load(model_dir());
    std::unique_ptr<CausalLM> model = load_hf_model(model_dir(), {}, false, dtype);
    GenerateOptions o = generation_defaults(model_dir(), model->args());
    o.sampling.do_sample = false;
    o.max_new_tokens = max_new;
    o.kv_cache_dtype = kv_cache;
    return generate_text(InferenceWeights(*model), tok, tok.encode(text), o);
  }

  ScratchDir dir_;
  static std::unique_ptr<ScratchDir> folder_;  // shared by the suite's tests
};
std::unique_ptr<ScratchDir> GenerateCli::folder_;

TEST_F(GenerateCli, StreamsTheLibrarysTextAndReportsSpeed) {
  const TitanRun r = run_titan(
      "generate --model '" + model_dir() + "' --prompt 'Hello there' --greedy --max-new-tokens 12",
      dir_);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, library("Hello there", 12).text + "\n");
  EXPECT_NE(r.err.find("tokens/s"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("time to first token"), std::string::npos) << r.err;
}

// --dtype bfloat16 takes a bf16 KV cache with it (auto: the weights' dtype) unless
// --kv-cache-dtype says otherwise; either cache dtype goes with either weight dtype.
TEST_F(GenerateCli, Bf16WeightsAndKvCacheOnRequest) {
  const std::string base =
      "generate --model '" + model_dir() + "' --prompt 'Hello there' --greedy --max-new-tokens 12 ";
  const struct {
    std::string flags;
    DType weights, kv_cache;
  } cases[] = {{"--dtype bfloat16", DType::bf16, DType::bf16},
               {"--dtype bfloat16 --kv-cache-dtype float32", DType::bf16, DType::f32},
               {"--kv-cache-dtype bf16", DType::f32, DType::bf16},
               {"--dtype fp32 --kv-cache-dtype auto", DType::f32, DType::f32}};
  for (const auto& c : cases) {
    const TitanRun r = run_titan(base + c.flags, dir_);
    ASSERT_EQ(r.status, 0) << c.flags << ": " << r.err;
    EXPECT_EQ(r.out, library("Hello there", 12, c.weights, c.kv_cache).text + "\n") << c.flags;
  }
}

TEST_F(GenerateCli, ChatTemplateAndSeededSampling) {
  const std::string args = "generate --model '" + model_dir() +
                           "' --prompt 'Hi' --chat --no-think --system 'Be brief' "
                           "--temperature 0.8 --top-k 20 --top-p 0.9 --seed 5 --max-new-tokens 8";
  const TitanRun a = run_titan(args, dir_);
  ASSERT_EQ(a.status, 0) << a.err;
  const TitanRun b = run_titan(args, dir_);
  EXPECT_EQ(a.out, b.out);
}

TEST_F(GenerateCli, BatchJsonLines) {
  const std::string prompts = dir_ / "prompts.jsonl";
  std::ofstream(prompts) << R"({"prompt": "The sky is"})"
                         << "\n\n"
                         << R"({"messages": [{"role": "user", "content": "Hi"}]})"
                         << "\n";
  const TitanRun r = run_titan("generate --model '" + model_dir() + "' --prompts '" + prompts +
                                   "' --greedy --max-new-tokens 6",
                               dir_);
  ASSERT_EQ(r.status, 0) << r.err;
  std::istringstream lines(r.out);
  std::string line;
  std::vector<json> results;
  while (std::getline(lines, line)) results.push_back(json::parse(line));
  ASSERT_EQ(results.size(), 2u);
  const std::string chat =
      ChatTemplate(ChatTemplateKind::qwen3).render({{"user", "Hi", ""}}, true, true);
  const GenerateResult want0 = library("The sky is", 6), want1 = library(chat, 6);
  EXPECT_EQ(results[0]["index"], 0);
  EXPECT_EQ(results[0]["ids"].get<std::vector<int32_t>>(), want0.ids);
  EXPECT_EQ(results[0]["text"], want0.text);
  EXPECT_EQ(results[1]["ids"].get<std::vector<int32_t>>(), want1.ids);
  EXPECT_EQ(results[1]["finish_reason"], want1.finish_reason);
}

TEST_F(GenerateCli, InteractiveChatKeepsHistoryAndResets) {
  const TitanRun r =
      run_titan("generate --model '" + model_dir() + "' --greedy --no-think --max-new-tokens 4",
                dir_, "Hi\nAgain\n/reset\nHi\n");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("(history cleared)"), std::string::npos) << r.err;
  // Three answers; the first and the last saw the same conversation.
  const std::string chat =
      ChatTemplate(ChatTemplateKind::qwen3).render({{"user", "Hi", ""}}, true, false);
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

void expect_one_line_error(const TitanRun& r, const std::string& needle) {
  EXPECT_NE(r.status, 0);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
}

TEST_F(GenerateCli, BadInputs) {
  const std::string m = "generate --model '" + model_dir() + "' ";
  expect_one_line_error(run_titan(m + "--prompt ''", dir_), "--prompt is empty");
  // (This binary is the CPU build's, or a CUDA build's on a machine without a GPU.)
  const TitanRun cuda = run_titan(m + "--prompt hi --device cuda", dir_);
  expect_one_line_error(cuda, "--device cuda: ");
  EXPECT_TRUE(cuda.err.find("this titan was built without CUDA (") != std::string::npos ||
              cuda.err.find("no CUDA device") != std::string::npos)
      << cuda.err;
  expect_one_line_error(run_titan(m + "--prompt hi --device tpu", dir_),
                        "--device tpu: unknown device 'tpu'");
  std::string long_prompt;
  for (int i = 0; i < 80; ++i) long_prompt += " word";
  expect_one_line_error(run_titan(m + "--prompt '" + long_prompt + "'", dir_),
                        "more than the model's max_position_embeddings (64)");
  expect_one_line_error(run_titan(m + "--prompt hi --max-new-tokens 64", dir_),
                        "does not fit the KV cache");
  expect_one_line_error(run_titan(m + "--prompt hi --top-p 1.5", dir_), "top_p");
  expect_one_line_error(run_titan(m + "--prompt hi --dtype float8", dir_),
                        "weight dtype \"float8\" is not one of auto, bfloat16, float32");
  expect_one_line_error(run_titan(m + "--prompt hi --kv-cache-dtype float16", dir_),
                        "KV cache dtype \"float16\" is not one of auto, bfloat16, float32");
  const std::string prompts = dir_ / "bad.jsonl";
  std::ofstream(prompts) << R"({"prompt": "ok"})"
                         << "\n"
                         << R"({"text": "no"})"
                         << "\n";
  expect_one_line_error(run_titan(m + "--max-new-tokens 4 --prompts '" + prompts + "'", dir_),
                        "bad.jsonl:2");
  // Empty dtype values are mistakes, not "auto"; a record with both prompt and messages is
  // refused, not half read.
  expect_one_line_error(run_titan(m + "--prompt hi --dtype ''", dir_),
                        "weight dtype \"\" is not one of auto, bfloat16, float32");
  expect_one_line_error(run_titan(m + "--prompt hi --kv-cache-dtype ''", dir_),
                        "KV cache dtype \"\" is not one of auto, bfloat16, float32");
  std::ofstream(prompts) << R"({"prompt": "ok", "messages": [{"role": "user", "content": "hi"}]})"
                         << "\n";
  expect_one_line_error(run_titan(m + "--max-new-tokens 4 --prompts '" + prompts + "'", dir_),
                        "bad.jsonl:1: the record has both \"prompt\" and \"messages\"; give one");
  // A folder with weights but no tokenizer.
  DecoderLM model(test::tiny_generate_args(true));
  model.initialize(1);
  HfExportOptions options;
  options.dtype = DType::f32;
  export_hf_folder(dir_ / "bare", model, options);
  expect_one_line_error(run_titan("generate --model '" + (dir_ / "bare") + "' --prompt hi", dir_),
                        "no tokenizer.json");
}

// The model folder with another chat template in its tokenizer_config.json (the other files
// linked): the Qwen2.5 Instruct one from tests/fixtures, edited by `edit` if given.
std::string with_qwen25_template(const ScratchDir& dir, const std::string& model,
                                 const std::string& edit = "") {
  const std::filesystem::path out = dir / "qwen25";
  std::filesystem::create_directories(out);
  for (const auto& entry : std::filesystem::directory_iterator(model)) {
    if (entry.path().filename() != "tokenizer_config.json") {
      std::filesystem::create_symlink(entry.path(), out / entry.path().filename());
    }
  }
  json config;
  std::ifstream(std::filesystem::path(model) / "tokenizer_config.json") >> config;
  std::ifstream fixtures(test::env_or_empty("TITAN_SOURCE_DIR") +
                         "/tests/fixtures/chat_templates.json");
  for (const json& f : json::parse(fixtures)) {
    if (f["kind"] == "qwen2_5")
      config["chat_template"] = f["chat_template"].get<std::string>() + edit;
  }
  std::ofstream(out / "tokenizer_config.json") << config.dump();
  return out.string();
}

TEST_F(GenerateCli, ChatUsesTheFoldersTemplate) {
  const std::string folder = with_qwen25_template(dir_, model_dir());
  const TitanRun r = run_titan(
      "generate --model '" + folder + "' --prompt Hi --chat --greedy --max-new-tokens 4", dir_);
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string chat =
      ChatTemplate(ChatTemplateKind::qwen2_5).render({{"user", "Hi", ""}}, true, true);
  EXPECT_NE(chat.find("You are Qwen, created by Alibaba Cloud."), std::string::npos);
  EXPECT_EQ(r.out, library(chat, 4).text + "\n");
  // Only Qwen3's template has a thinking switch: asking for one elsewhere is an error.
  const TitanRun think = run_titan(
      "generate --model '" + folder + "' --prompt Hi --chat --no-think --max-new-tokens 2", dir_);
  EXPECT_EQ(think.status, 1);
  EXPECT_EQ(think.err,
            "titan generate: error: --think/--no-think: the Qwen2.5 Instruct chat "
            "template of " +
                folder + " has no thinking switch (only Qwen3's has)\n");
}

TEST_F(GenerateCli, UnknownTemplateRefusedOnlyForChat) {
  const std::string folder = with_qwen25_template(dir_, model_dir(), "{# edited #}");
  const TitanRun chat =
      run_titan("generate --model '" + folder + "' --prompt Hi --chat --max-new-tokens 2", dir_);
  EXPECT_EQ(chat.status, 1);
  EXPECT_EQ(count_lines(chat.err), 1) << chat.err;
  EXPECT_NE(chat.err.find(folder + "/tokenizer_config.json: not a chat template titan renders"),
            std::string::npos)
      << chat.err;
  const TitanRun interactive =
      run_titan("generate --model '" + folder + "' --max-new-tokens 2", dir_, "Hi\n");
  EXPECT_EQ(interactive.status, 1);
  EXPECT_EQ(interactive.err, chat.err);
  const TitanRun raw =
      run_titan("generate --model '" + folder + "' --prompt Hi --greedy --max-new-tokens 2", dir_);
  ASSERT_EQ(raw.status, 0) << raw.err;
  EXPECT_EQ(raw.out, library("Hi", 2).text + "\n");
}

// A tiny Llama model over the Llama-3-style tokenizer of tests/fixtures (Llama 3.1 template): a
// raw prompt gets the tokenizer's BOS, as HF's tokenizer(prompt) does; a chat holds the
// template's one BOS and no second.
TEST(GenerateCliLlama, RawPromptsGetTheBosChatsHoldTheirOwn) {
  const ScratchDir dir;
  const std::string tokenizer_dir =
      test::env_or_empty("TITAN_SOURCE_DIR") + "/tests/fixtures/llama3-style-tokenizer";
  const Tokenizer tok = Tokenizer::load(tokenizer_dir);
  ModelArgs args = test::tiny_generate_args(true, 512, 128);
  args.architecture = "LlamaForCausalLM";
  args.qk_norm = false;
  DecoderLM model(args);
  model.initialize(3);
  HfExportOptions options;
  options.dtype = DType::f32;
  options.source_dir = tokenizer_dir;
  const std::string folder = dir / "llama";
  export_hf_folder(folder, model, options);
  const auto prompt_tokens = [](const std::string& err) {
    const size_t at = err.find("generate: prompt ");
    return at == std::string::npos ? -1 : std::stoll(err.substr(at + 17));
  };
  const TitanRun raw = run_titan(
      "generate --model '" + folder + "' --prompt 'Hello there' --greedy --max-new-tokens 3", dir);
  ASSERT_EQ(raw.status, 0) << raw.err;
  const std::vector<int32_t> with_bos = tok.encode_with_special_tokens("Hello there");
  ASSERT_EQ(with_bos.size(), tok.encode("Hello there").size() + 1);
  EXPECT_EQ(prompt_tokens(raw.err), static_cast<int64_t>(with_bos.size())) << raw.err;
  std::unique_ptr<CausalLM> loaded = load_hf_model(folder);
  GenerateOptions o = generation_defaults(folder, loaded->args());
  o.sampling.do_sample = false;
  o.max_new_tokens = 3;
  EXPECT_EQ(raw.out, generate_text(InferenceWeights(*loaded), tok, with_bos, o).text + "\n");

  const TitanRun chat = run_titan(
      "generate --model '" + folder + "' --prompt Hi --chat --greedy --max-new-tokens 3", dir);
  ASSERT_EQ(chat.status, 0) << chat.err;
  const std::string text = ChatTemplate::load(folder).render({{"user", "Hi", ""}}, true, true);
  ASSERT_TRUE(text.starts_with("<|begin_of_text|><|start_header_id|>system")) << text;
  EXPECT_EQ(prompt_tokens(chat.err), static_cast<int64_t>(tok.encode(text).size())) << chat.err;
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
  const TitanRun r =
      run_titan("generate --model '" + (dir_ / "deep") + "' --prompt hi --max-new-tokens 2", dir_);
  ASSERT_EQ(r.signal, 0) << "killed by signal " << r.signal;
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err,
            "titan generate: error: " + path + ": tokenizer.json nests deeper than 128 levels\n");
  std::ifstream in(path);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), tokenizer);
}

}  // namespace
}  // namespace titan
