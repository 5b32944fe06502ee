// Greedy generation against Hugging Face Transformers' generate(do_sample=False) on the same tiny
// random model folders (tests/reference/generate_greedy.py via $TITAN_PYTHON; a missing Python
// fails the test): the generated ids must be equal, token for token, for several prompts; and the
// sampling warpers against HF's logits processors (tests/reference/generate_warpers.py).
//
// The bf16 folders run in titan with bf16 weights (--dtype auto picks them): every matmul but the
// MoE router's takes its input rounded to bf16, fp32 accumulation. Transformers loads
// them in fp32 (the same bf16 weights upcast) with the input of those same linears rounded to
// bf16 -- exactly titan's math, so the ids must be equal. Every folder also runs with a bf16 KV
// cache, against Transformers storing the keys and values rounded to bf16 in its static cache; a
// bf16 folder over a bf16 cache also attends in bf16 (probabilities rounded before they weight
// the values), which the script's eager attention does as titan's does.
// Loaded as torch.bfloat16, Transformers would also round every other activation to bf16, and
// ids may then legitimately diverge after a near tie.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "test_generate_util.h"
#include "test_tokenizer_python.h"
#include "tiny_models.h"
#include "titan/infer/generate.h"
#include "titan/infer/sampling.h"
#include "titan/infer/weights.h"
#include "titan/models/decoder_lm.h"
#include "titan/models/hf_export.h"
#include "unit/test_safetensors_util.h"

namespace titan {
namespace {

using nlohmann::json;
using test::ScratchDir;

TEST(GeneratePython, GreedyIdsEqualTransformers) {
  ScratchDir dir;
  const std::vector<std::vector<int32_t>> prompts = {
      {7}, test::test_ids(5, 97, 11), test::test_ids(12, 97, 12), test::test_ids(33, 97, 13)};
  const int64_t max_new = 20;
  json request = {{"runs", json::array()}, {"prompts", prompts}, {"max_new_tokens", max_new}};
  std::map<std::string, std::vector<std::vector<int32_t>>> titan_ids;
  // A tiny Qwen3-MoE too: layers 0 and 2 sparse (5 experts, 2 per token), layer 1 dense.
  ModelArgs moe = test::with_moe(test::tiny_generate_args(false), 5, 2, 16, {1});
  moe.num_hidden_layers = 3;
  const std::vector<std::pair<std::string, ModelArgs>> models = {
      {"tied", test::tiny_generate_args(true)},
      {"untied", test::tiny_generate_args(false)},
      {"moe", moe}};
  for (const DType dtype : {DType::f32, DType::bf16}) {
    uint64_t seed = 21;
    for (const auto& [name, args] : models) {
      const std::string folder = dir / (name + "_" + std::string(dtype_name(dtype)));
      DecoderLM model(args);
      model.initialize(seed++);
      HfExportOptions export_options;
      export_options.dtype = dtype;
      export_hf_folder(folder, model, export_options);
      // Generate from what was exported, loaded as titan generate loads it (a bf16 folder's
      // matmul weights only in bf16), with the folder's own defaults (greedy, its eos ids) and
      // its dtype.
      ASSERT_EQ(inference_dtype(folder, "auto"), dtype) << folder;
      const std::unique_ptr<InferenceWeights> loaded =
          InferenceWeights::load(folder, inference_dtype(folder, "auto"));
      const InferenceWeights& weights = *loaded;
      GenerateOptions options = generation_defaults(folder, weights.model().args());
      options.sampling.do_sample = false;
      options.max_new_tokens = max_new;
      for (const DType cache : {DType::f32, DType::bf16}) {
        options.kv_cache_dtype = cache;
        const std::string key = folder + " kv " + std::string(dtype_name(cache));
        for (const std::vector<int32_t>& p : prompts) {
          titan_ids[key].push_back(generate_tokens(weights, p, options).ids);
        }
        request["runs"].push_back({{"key", key},
                                   {"folder", folder},
                                   {"bf16_math", dtype == DType::bf16},
                                   {"bf16_kv_cache", cache == DType::bf16}});
      }
    }
  }
  const json response = test::run_reference("generate_greedy.py", {}, request);
  ASSERT_TRUE(response.is_object());
  for (const auto& [key, ids] : titan_ids) {
    ASSERT_TRUE(response.contains(key)) << key;
    const auto hf = response[key].get<std::vector<std::vector<int32_t>>>();
    ASSERT_EQ(hf.size(), ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_EQ(ids[i], hf[i]) << key << " prompt " << i;
      EXPECT_FALSE(ids[i].empty());
    }
  }
}

// The repetition penalty and the warpers (temperature -> top-k -> top-p -> min-p) against HF's
// logits processors on random logits: the same tokens removed, the same values kept.
TEST(GeneratePython, WarpersEqualTransformers) {
  struct Case {
    double repetition_penalty, temperature;
    int64_t top_k;
    double top_p, min_p;
  };
  const std::vector<Case> cases = {{1.0, 0.6, 20, 0.95, 0.0},
                                   {1.3, 1.0, 0, 0.8, 0.0},
                                   {1.0, 0.7, 0, 1.0, 0.05},
                                   {1.1, 1.5, 50, 0.9, 0.02},
                                   {0.9, 0.3, 5, 1.0, 0.0}};
  const int64_t V = 257;
  json request = {{"cases", json::array()}};
  std::vector<std::vector<float>> titan_logits;
  for (size_t c = 0; c < cases.size(); ++c) {
    std::vector<float> logits(static_cast<size_t>(V));
    const std::vector<int32_t> noise = test::test_ids(V, 100000, static_cast<uint32_t>(c));
    for (int64_t i = 0; i < V; ++i) logits[i] = (noise[i] - 50000) * 1e-4f;  // [-5, 5)
    const std::vector<int32_t> context = test::test_ids(30, V, 77 + static_cast<uint32_t>(c));
    const Case& k = cases[c];
    request["cases"].push_back({{"logits", logits},
                                {"context", context},
                                {"repetition_penalty", k.repetition_penalty},
                                {"temperature", k.temperature},
                                {"top_k", k.top_k},
                                {"top_p", k.top_p},
                                {"min_p", k.min_p}});
    apply_repetition_penalty(logits.data(), V, context, k.repetition_penalty);
    apply_temperature(logits.data(), V, k.temperature);
    apply_top_k(logits.data(), V, k.top_k);
    apply_top_p(logits.data(), V, k.top_p);
    apply_min_p(logits.data(), V, k.min_p);
    titan_logits.push_back(logits);
  }
  const json response = test::run_reference("generate_warpers.py", {}, request);
  ASSERT_TRUE(response.contains("logits"));
  for (size_t c = 0; c < cases.size(); ++c) {
    const json& hf = response["logits"][c];
    ASSERT_EQ(static_cast<int64_t>(hf.size()), V);
    int64_t kept = 0;
    for (int64_t i = 0; i < V; ++i) {
      const float got = titan_logits[c][i];
      if (hf[i].is_null()) {
        EXPECT_TRUE(std::isinf(got)) << "case " << c << " token " << i << " kept by titan only";
      } else {
        ++kept;
        EXPECT_NEAR(got, hf[i].get<double>(), 1e-5) << "case " << c << " token " << i;
      }
    }
    EXPECT_GT(kept, 0);
  }
}

}  // namespace
}  // namespace titan
