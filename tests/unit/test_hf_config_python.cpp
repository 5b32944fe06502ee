// config.json against the real Transformers (tests/reference/hf_config_roundtrip.py via
// $TITAN_PYTHON; a missing Python fails), for every family: what titan writes, AutoConfig reads
// with the same fields and builds a model with titan's parameter count and feature flags (q/k
// norm, which projections have biases); what Qwen3Config, Qwen3MoeConfig, Qwen2Config and
// LlamaConfig.save_pretrained write, titan reads to the same fields.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "titan/io/safetensors.h"
#include "titan/models/hf_config.h"
#include "titan/models/param_count.h"
#include "titan/models/qwen3/flavors.h"
#include "titan/models/registry.h"
#include "unit/python_runner.h"
#include "unit/test_safetensors_util.h"

namespace titan {
namespace {

using json = nlohmann::json;
using test::ScratchDir;

// ModelArgs in the script's field names.
json fields(const ModelArgs& a) {
  const bool llama3 = a.rope_scaling.type == "llama3";
  json f = {
      {"architecture", a.architecture},
      {"model_type", model_family(a.architecture, "test").model_type},
      {"vocab_size", a.vocab_size},
      {"hidden_size", a.hidden_size},
      {"intermediate_size", a.intermediate_size},
      {"num_hidden_layers", a.num_hidden_layers},
      {"num_attention_heads", a.num_attention_heads},
      {"num_key_value_heads", a.num_key_value_heads},
      {"head_dim", a.head_dim},
      {"max_position_embeddings", a.max_position_embeddings},
      {"rope_theta", a.rope_theta},
      {"rope_type", a.rope_scaling.type},
      {"rope_factor", a.rope_scaling.factor},
      {"rope_original_max_position_embeddings",
       a.rope_scaling.type == "default" ? 0 : a.rope_scaling.original_max_position_embeddings},
      {"rope_low_freq_factor", llama3 ? a.rope_scaling.low_freq_factor : 0.0},
      {"rope_high_freq_factor", llama3 ? a.rope_scaling.high_freq_factor : 0.0},
      {"rms_norm_eps", a.rms_norm_eps},
      {"initializer_range", a.initializer_range},
      {"tie_word_embeddings", a.tie_word_embeddings},
      {"qk_norm", a.qk_norm},
      {"attention_bias", a.attention_bias},
      {"o_proj_bias", a.o_proj_bias},
      {"mlp_bias", a.mlp_bias},
      {"bos_token_id", a.bos_token_id},
      {"eos_token_ids", a.eos_token_ids},
      {"pad_token_id", a.pad_token_id}};
  if (a.is_moe()) {
    f.update({{"num_experts", a.num_experts},
              {"num_experts_per_tok", a.num_experts_per_tok},
              {"moe_intermediate_size", a.moe_intermediate_size},
              {"norm_topk_prob", a.norm_topk_prob},
              {"router_aux_loss_coef", a.router_aux_loss_coef},
              {"output_router_logits", a.output_router_logits},
              {"decoder_sparse_step", a.decoder_sparse_step},
              {"mlp_only_layers", a.mlp_only_layers}});
  }
  return f;
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in);
}

void expect_same_fields(const json& want, const json& got, const std::string& what) {
  for (const auto& [key, value] : want.items()) {
    ASSERT_TRUE(got.contains(key)) << what << ": " << key << " missing";
    EXPECT_EQ(got[key], value) << what << ": " << key;
  }
}

TEST(HfConfigPython, TransformersLoadsWhatTitanWrites) {
  ScratchDir dir;
  std::map<std::string, ModelArgs> models = {{"tiny", flavor("tiny")},
                                             {"tiny_moe", flavor("tiny_moe")}};
  ModelArgs yarn = flavor("tiny");
  yarn.max_position_embeddings = 4096;
  yarn.rope_scaling = {"yarn", 4.0, 1024, 0.0, 32.0, 1.0};
  yarn.rope_theta = 5e6;
  yarn.bos_token_id = 1;
  yarn.eos_token_ids = {2, 3};
  yarn.pad_token_id = 0;
  models["yarn"] = yarn;
  ModelArgs mixed = flavor("tiny_moe");
  mixed.mlp_only_layers = {0, 2};
  mixed.norm_topk_prob = false;
  mixed.output_router_logits = true;
  mixed.eos_token_ids = {7};
  models["mixed"] = mixed;
  // Llama 3.2's shape (tied, llama3 RoPE) and one with every bias Llama has.
  ModelArgs llama = flavor("tiny");
  llama.architecture = "LlamaForCausalLM";
  llama.qk_norm = false;
  llama.max_position_embeddings = 4096;
  llama.rope_theta = 500000.0;
  llama.rope_scaling = {"llama3", 8.0, 1024, 0.0, 32.0, 1.0, 1.0, 4.0};
  llama.bos_token_id = 1;
  llama.eos_token_ids = {2, 3};
  models["llama_tied"] = llama;
  ModelArgs llama_bias = llama;
  llama_bias.tie_word_embeddings = false;
  llama_bias.attention_bias = llama_bias.o_proj_bias = llama_bias.mlp_bias = true;
  llama_bias.rope_scaling = {"llama3", 4.0, 512, 0.0, 32.0, 1.0, 1.5, 3.5};
  models["llama_bias"] = llama_bias;
  // Qwen2.5's: biases on q, k, v; tied as 0.5B is, untied with YaRN as 7B's card has it.
  ModelArgs qwen2 = flavor("tiny");
  qwen2.architecture = "Qwen2ForCausalLM";
  qwen2.qk_norm = false;
  qwen2.attention_bias = true;
  qwen2.rope_theta = 1e6;
  models["qwen2_tied"] = qwen2;
  ModelArgs qwen2_untied = qwen2;
  qwen2_untied.tie_word_embeddings = false;
  qwen2_untied.max_position_embeddings = 8192;
  qwen2_untied.rope_scaling = {"yarn", 4.0, 2048, 0.0, 32.0, 1.0};
  models["qwen2_untied"] = qwen2_untied;
  for (const auto& [name, args] : models) {
    std::filesystem::create_directories(dir / name);
    write_hf_config(dir / name + "/config.json", args, DType::bf16);
  }
  GenerationConfig g = default_generation_config(yarn);
  g.do_sample = true;
  write_hf_generation_config(dir / "yarn/generation_config.json", g);

  const test::PythonRun run =
      test::run_python_script("hf_config_roundtrip.py", {"load", dir.path().string()});
  ASSERT_EQ(run.status, 0) << run.output;
  for (const auto& [name, args] : models) {
    const json seen = read_json(dir / name + "/seen.json");
    expect_same_fields(fields(args), seen, name);
    EXPECT_EQ(seen["dtype"], "bfloat16") << name;
    EXPECT_EQ(seen["class"], args.architecture) << name;
    EXPECT_EQ(seen["n_params"], count_parameters(args).total) << name;
    EXPECT_EQ(seen["q_proj"], json({args.num_attention_heads * args.head_dim, args.hidden_size}));
    EXPECT_EQ(seen["lm_head_tied"], args.tie_word_embeddings) << name;
  }
  const json gen = read_json(dir / "yarn/seen.json")["generation"];
  EXPECT_EQ(gen["eos_token_ids"], json({2, 3}));
  EXPECT_EQ(gen["pad_token_id"], 0);
  EXPECT_EQ(gen["do_sample"], true);
}

TEST(HfConfigPython, TitanReadsWhatTransformersSaves) {
  ScratchDir dir;
  const test::PythonRun run =
      test::run_python_script("hf_config_roundtrip.py", {"save", dir.path().string()});
  ASSERT_EQ(run.status, 0) << run.output;
  for (const char* name : {"py_dense", "py_yarn", "py_moe", "py_llama_tied", "py_llama_bias",
                           "py_qwen2_tied", "py_qwen2_untied"}) {
    const ModelArgs args = read_hf_config(dir / name);
    json expected = read_json(dir / name + "/expected.json");
    const int64_t n_params = expected["n_params"].get<int64_t>();
    expected.erase("n_params");
    expected.erase("dtype");
    expect_same_fields(expected, fields(args), name);
    EXPECT_EQ(count_parameters(args).total, n_params) << name;
  }
}

// The model folders tests/reference/families_reference.py saves (ctest's families_reference
// fixture): titan reads each config.json to the family's flags, and to exactly the parameters
// Transformers' model has (the reference's param.* tensors: named_parameters, a tied lm_head once).
TEST(HfConfigPython, TitanReadsTheFamilyReferenceModels) {
  const char* binary_dir = std::getenv("TITAN_BINARY_DIR");
  ASSERT_NE(binary_dir, nullptr);
  const std::string root = std::string(binary_dir) + "/reference/families/";
  const struct {
    const char* name;
    const char* architecture;
    bool tied, qkv_bias, o_bias, mlp_bias;
    const char* rope;
  } cases[] = {{"llama_tied", "LlamaForCausalLM", true, false, false, false, "llama3"},
               {"llama_untied_bias", "LlamaForCausalLM", false, true, true, true, "default"},
               {"qwen2_tied", "Qwen2ForCausalLM", true, true, false, false, "default"},
               {"qwen2_untied", "Qwen2ForCausalLM", false, true, false, false, "default"}};
  for (const auto& c : cases) {
    const ModelArgs a = read_hf_config(root + c.name + "/model");
    EXPECT_EQ(a.architecture, c.architecture) << c.name;
    EXPECT_FALSE(a.qk_norm) << c.name;
    EXPECT_EQ(json({a.tie_word_embeddings, a.attention_bias, a.o_proj_bias, a.mlp_bias}),
              json({c.tied, c.qkv_bias, c.o_bias, c.mlp_bias}))
        << c.name;
    EXPECT_EQ(a.rope_scaling.type, c.rope) << c.name;
    const SafetensorsFile ref = SafetensorsFile::open(root + c.name + "/reference.safetensors");
    int64_t hf_params = 0;
    for (const SafetensorsEntry& e : ref.entries()) {
      if (e.name.starts_with("param.")) hf_params += e.numel();
    }
    EXPECT_EQ(count_parameters(a).total, hf_params) << c.name;
  }
}

}  // namespace
}  // namespace titan
