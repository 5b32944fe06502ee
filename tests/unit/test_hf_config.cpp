// config.json -> ModelArgs -> config.json: what Transformers 4.x and 5.x write is read, every
// field the math depends on is checked, and each bad field ends in one line naming file and field.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "titan/io/atomic_file.h"
#include "titan/models/hf_config.h"
#include "titan/models/param_count.h"
#include "titan/models/qwen3/flavors.h"
#include "titan/models/registry.h"
#include "unit/test_safetensors_util.h"

namespace titan {
namespace {

using json = nlohmann::json;
using test::expect_error;
using test::ScratchDir;

// Qwen3-8B's config.json as published (Transformers 4.51 style).
json qwen3_8b() {
  return json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
    "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})");
}

// Qwen3-30B-A3B's, as Transformers 5 writes it (rope_parameters, num_local_experts).
json qwen3_30b_a3b_v5() {
  return json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
    "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": true, "num_attention_heads": 32, "num_experts_per_tok": 8,
    "num_hidden_layers": 48, "num_key_value_heads": 4, "num_local_experts": 128,
    "output_router_logits": false, "rms_norm_eps": 1e-06,
    "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
    "router_aux_loss_coef": 0.001, "sliding_window": null, "tie_word_embeddings": false,
    "dtype": "bfloat16", "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})");
}

// Llama-3.2-1B-Instruct's config.json as published (Transformers 4.45: rope_scaling llama3).
json llama32_1b() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "head_dim": 64,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": false,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})");
}

// Qwen2.5-0.5B's (no head_dim, no attention_bias key; a sliding window that is switched off).
json qwen25_05b() {
  return json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896,
    "initializer_range": 0.02, "intermediate_size": 4864, "max_position_embeddings": 32768,
    "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
    "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
    "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": true,
    "use_mrope": false, "use_sliding_window": false, "vocab_size": 151936})");
}

// Every field of ModelArgs that a config.json carries, for whole-struct comparisons.
json fields(const ModelArgs& a) {
  return {
      {"architecture", a.architecture},
      {"dims",
       {a.vocab_size, a.hidden_size, a.intermediate_size, a.num_hidden_layers,
        a.num_attention_heads, a.num_key_value_heads, a.head_dim, a.max_position_embeddings}},
      {"rope",
       {a.rope_theta, a.rope_scaling.type, a.rope_scaling.factor,
        a.rope_scaling.original_max_position_embeddings, a.rope_scaling.attention_factor,
        a.rope_scaling.beta_fast, a.rope_scaling.beta_slow, a.rope_scaling.low_freq_factor,
        a.rope_scaling.high_freq_factor}},
      {"norm", {a.rms_norm_eps, a.initializer_range}},
      {"flags", {a.tie_word_embeddings, a.qk_norm, a.attention_bias, a.o_proj_bias, a.mlp_bias}},
      {"ids", {a.bos_token_id, a.eos_token_ids, a.pad_token_id}},
      {"moe",
       {a.num_experts, a.num_experts_per_tok, a.moe_intermediate_size, a.norm_topk_prob,
        a.router_aux_loss_coef, a.output_router_logits, a.decoder_sparse_step, a.mlp_only_layers}}};
}

TEST(HfConfig, ReadsThePublishedQwen3_8B) {
  const ModelArgs a = model_args_from_hf_config(qwen3_8b(), "config.json");
  EXPECT_EQ(fields(a), fields(flavor("8B")));
}

TEST(HfConfig, ReadsTransformers5MoeConfig) {
  const ModelArgs a = model_args_from_hf_config(qwen3_30b_a3b_v5(), "config.json");
  EXPECT_EQ(fields(a), fields(flavor("30B-A3B")));
  json c = qwen3_30b_a3b_v5();
  c["num_experts"] = 128;  // 4.x's name beside 5.x's: fine when they agree
  EXPECT_EQ(model_args_from_hf_config(c, "c").num_experts, 128);
  c["num_experts"] = 64;
  expect_error([&] { (void)model_args_from_hf_config(c, "c.json"); },
               {"c.json", "num_experts and num_local_experts disagree"});
}

TEST(HfConfig, DefaultsFollowTheHfClasses) {
  json c = qwen3_8b();
  for (const char* key :
       {"head_dim", "tie_word_embeddings", "rope_theta", "rope_scaling", "eos_token_id",
        "bos_token_id", "max_position_embeddings", "rms_norm_eps", "architectures"}) {
    c.erase(key);
  }
  const ModelArgs a = model_args_from_hf_config(c, "c");
  EXPECT_EQ(a.architecture, "Qwen3ForCausalLM");  // from model_type
  EXPECT_EQ(a.head_dim, 4096 / 32);
  EXPECT_FALSE(a.tie_word_embeddings);
  EXPECT_EQ(a.rope_theta, 10000.0);
  EXPECT_EQ(a.rope_scaling.type, "default");
  EXPECT_TRUE(a.eos_token_ids.empty());
  EXPECT_EQ(a.bos_token_id, -1);
  EXPECT_EQ(a.max_position_embeddings, 32768);
  EXPECT_EQ(a.rms_norm_eps, 1e-6);
  json m = qwen3_30b_a3b_v5();
  m.erase("norm_topk_prob");
  m.erase("intermediate_size");  // unused when every layer is sparse
  m["mlp_only_layers"] = nullptr;
  const ModelArgs b = model_args_from_hf_config(m, "m");
  EXPECT_FALSE(b.norm_topk_prob);
  EXPECT_EQ(b.intermediate_size, 6144);
  EXPECT_TRUE(b.mlp_only_layers.empty());
}

TEST(HfConfig, EosAsIntListOrNull) {
  json c = qwen3_8b();
  c["eos_token_id"] = {151645, 151643};
  EXPECT_EQ(model_args_from_hf_config(c, "c").eos_token_ids,
            (std::vector<int64_t>{151645, 151643}));
  c["eos_token_id"] = nullptr;
  EXPECT_TRUE(model_args_from_hf_config(c, "c").eos_token_ids.empty());
  c["eos_token_id"] = 200000;
  expect_error([&] { (void)model_args_from_hf_config(c, "c.json"); },
               {"c.json", "eos_token_id 200000", "vocab_size 151936"});
  c["eos_token_id"] = {1, "2"};
  expect_error([&] { (void)model_args_from_hf_config(c, "c.json"); },
               {"c.json", "eos_token_id must be an integer", "\"2\""});
}

TEST(HfConfig, RopeInEveryShapeTransformersWrites) {
  json c = qwen3_8b();
  // 4.x YaRN, with the legacy "type" key.
  c["rope_scaling"] = {
      {"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  ModelArgs a = model_args_from_hf_config(c, "c");
  EXPECT_EQ(a.rope_scaling.type, "yarn");
  EXPECT_EQ(a.rope_scaling.factor, 4.0);
  EXPECT_EQ(a.rope_scaling.original_max_position_embeddings, 32768);
  EXPECT_EQ(a.rope_theta, 1e6);
  // 5.x rope_parameters, also nested under the layer type; theta inside wins.
  c.erase("rope_scaling");
  c["rope_parameters"] = {
      {"full_attention", {{"rope_type", "yarn"}, {"factor", 2.0}, {"rope_theta", 5e6}}}};
  a = model_args_from_hf_config(c, "c");
  EXPECT_EQ(a.rope_theta, 5e6);
  EXPECT_EQ(a.rope_scaling.factor, 2.0);
  EXPECT_EQ(a.rope_scaling.original_max_position_embeddings, 40960);  // HF: max_position_embeddings
  c["rope_parameters"] = {{"rope_type", "default"}};
  EXPECT_EQ(model_args_from_hf_config(c, "c").rope_theta, 1e6);  // the top-level value
  // An empty rope_scaling defers to rope_parameters, as in Transformers 5.
  c["rope_scaling"] = json::object();
  c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 123.0}};
  EXPECT_EQ(model_args_from_hf_config(c, "c").rope_theta, 123.0);
}

TEST(HfConfig, RefusesUnsupportedRope) {
  json c = qwen3_8b();
  for (const char* type : {"linear", "dynamic", "longrope"}) {
    c["rope_scaling"] = {{"rope_type", type}, {"factor", 2.0}};
    expect_error([&] { (void)model_args_from_hf_config(c, "c.json"); },
                 {"c.json", "rope_scaling.rope_type", type, "not supported"});
  }
  c["rope_scaling"] = {{"rope_type", "yarn"}};
  expect_error([&] { (void)model_args_from_hf_config(c, "c.json"); },
               {"rope_scaling.factor is missing"});
  c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"mscale", 1.0}};
  expect_error([&] { (void)model_args_from_hf_config(c, "c.json"); }, {"rope_scaling.mscale"});
  c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 0.5}};
  expect_error([&] { (void)model_args_from_hf_config(c, "c.json"); }, {"rope_scaling.factor"});
  const json llama3 = llama32_1b()["rope_scaling"];
  for (const char* key : {"factor", "low_freq_factor", "high_freq_factor"}) {
    c["rope_scaling"] = llama3;
    c["rope_scaling"].erase(key);
    expect_error([&] { (void)model_args_from_hf_config(c, "c.json"); },
                 {"c.json", std::string("rope_scaling.") + key + " is missing"});
  }
  c["rope_scaling"] = llama3;
  c["rope_scaling"]["high_freq_factor"] = 1.0;
  expect_error([&] { (void)model_args_from_hf_config(c, "c.json"); },
               {"c.json", "high_freq_factor (1) must exceed low_freq_factor (1)"});
  c["rope_scaling"]["low_freq_factor"] = 0;
  expect_error([&] { (void)model_args_from_hf_config(c, "c.json"); },
               {"c.json", "low_freq_factor must be positive"});
  c["rope_scaling"] = "yarn";
  expect_error([&] { (void)model_args_from_hf_config(c, "c.json"); },
               {"rope_scaling must be an object"});
  c["rope_scaling"] = nullptr;
  c["rope_parameters"] = {{"rope_type", "default"}, {"partial_rotary_factor", 0.5}};
  expect_error([&] { (void)model_args_from_hf_config(c, "c.json"); },
               {"rope_parameters.partial_rotary_factor"});
}

TEST(HfConfig, RefusesUnknownArchitecturesByName) {
  json c = qwen3_8b();
  c["architectures"] = {"MistralForCausalLM"};
  expect_error([&] { (void)model_args_from_hf_config(c, "c.json"); },
               {"c.json", "\"MistralForCausalLM\"", "not supported",
                "(Qwen3ForCausalLM, Qwen3MoeForCausalLM, Qwen2ForCausalLM, LlamaForCausalLM)"});
  c["architectures"] = {"Qwen3MoeForCausalLM"};
  expect_error([&] { (void)model_args_from_hf_config(c, "c.json"); },
               {"model_type 'qwen3' does not match architecture Qwen3MoeForCausalLM"});
  c["architectures"] = {"LlamaForCausalLM"};
  expect_error([&] { (void)model_args_from_hf_config(c, "c.json"); },
               {"model_type 'qwen3' does not match architecture LlamaForCausalLM ('llama')"});
  c.erase("architectures");
  c["model_type"] = "mistral";
  expect_error([&] { (void)model_args_from_hf_config(c, "c.json"); },
               {"model_type \"mistral\"", "(qwen3, qwen3_moe, qwen2, llama)"});
  c.erase("model_type");
  expect_error([&] { (void)model_args_from_hf_config(c, "c.json"); },
               {"neither architectures nor model_type"});
}

TEST(HfConfig, MissingFieldsAreNamed) {
  for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "num_key_value_heads"}) {
    json c = qwen3_8b();
    c.erase(key);
    expect_error([&] { (void)model_args_from_hf_config(c, "c.json"); },
                 {"c.json: ", key, "is missing"});
  }
  for (const char* key : {"num_local_experts", "num_experts_per_tok", "moe_intermediate_size"}) {
    json c = qwen3_30b_a3b_v5();
    c.erase(key);
    expect_error([&] { (void)model_args_from_hf_config(c, "c.json"); }, {"c.json: ", "is missing"});
  }
  json c = qwen3_30b_a3b_v5();
  c["mlp_only_layers"] = {0};
  c.erase("intermediate_size");  // now a dense layer needs it
  expect_error([&] { (void)model_args_from_hf_config(c, "c.json"); },
               {"intermediate_size is missing"});
}

TEST(HfConfig, AbsurdFieldsAreNamed) {
  const std::vector<std::pair<std::string, json>> cases = {
      {"hidden_size", "4096"},
      {"hidden_size", -4096},
      {"hidden_size", 4096.5},
      {"hidden_size", 4096.0},
      {"hidden_size", true},
      {"hidden_size", 0},
      {"vocab_size", 1e12},
      {"num_hidden_layers", 1LL << 40},
      {"head_dim", 127},
      {"num_key_value_heads", 5},
      {"rms_norm_eps", "1e-6"},
      {"rms_norm_eps", 0},
      {"rope_theta", -1},
      {"tie_word_embeddings", 1},
      {"hidden_act", "gelu"},
      {"use_sliding_window", true},
      {"attention_dropout", 0.1},
      {"layer_types", {"sliding_attention"}},
      {"num_attention_heads", 18446744073709551615ULL},
  };
  for (const auto& [key, value] : cases) {
    json c = qwen3_8b();
    c[key] = value;
    expect_error([&] { (void)model_args_from_hf_config(c, "c.json"); }, {"c.json: ", key});
  }
  json c = qwen25_05b();
  c["hidden_size"] = 900;
  expect_error([&] { (void)model_args_from_hf_config(c, "c.json"); },
               {"head_dim is absent", "not divisible"});
  json m = qwen3_30b_a3b_v5();
  m["num_experts_per_tok"] = 129;
  expect_error([&] { (void)model_args_from_hf_config(m, "m.json"); },
               {"m.json", "num_experts_per_tok (129) exceeds num_experts (128)"});
  m = qwen3_30b_a3b_v5();
  m["mlp_only_layers"] = {48};
  expect_error([&] { (void)model_args_from_hf_config(m, "m.json"); }, {"mlp_only_layers"});
}

TEST(HfConfig, FilesAndFolders) {
  ScratchDir dir;
  write_file_atomic(dir / "config.json", qwen3_8b().dump());
  EXPECT_EQ(read_hf_config(dir.path().string()).hidden_size, 4096);
  EXPECT_EQ(read_hf_config(dir / "config.json").hidden_size, 4096);
  write_file_atomic(dir / "config.json", "{\"hidden_size\": 1, \"hidden_size\": 2}");
  expect_error([&] { (void)read_hf_config(dir.path().string()); },
               {"config.json", "\"hidden_size\" twice"});
  write_file_atomic(dir / "config.json", "{\"hidden_size\": ");
  expect_error([&] { (void)read_hf_config(dir.path().string()); },
               {"config.json", "not valid JSON"});
  write_file_atomic(dir / "config.json", "[]");
  expect_error([&] { (void)read_hf_config(dir.path().string()); },
               {"config.json", "not an object"});
  expect_error([&] { (void)read_hf_config(dir / "none.json"); }, {"none.json", "cannot open"});
}

TEST(HfConfig, EveryFlavorRoundTripsThroughConfigJson) {
  for (const std::string& name : flavor_names()) {
    const ModelArgs& a = flavor(name);
    const json c = hf_config_json(a, DType::bf16);
    EXPECT_EQ(c["torch_dtype"], "bfloat16");
    EXPECT_EQ(c["dtype"], "bfloat16");
    EXPECT_EQ(fields(model_args_from_hf_config(c, name)), fields(a)) << name;
  }
  ModelArgs yarn = flavor("0.6B");
  yarn.rope_scaling.type = "yarn";
  yarn.rope_scaling.factor = 4.0;
  yarn.rope_scaling.original_max_position_embeddings = 32768;
  yarn.rope_scaling.attention_factor = 1.2;
  yarn.eos_token_ids = {151645, 151643};
  yarn.pad_token_id = 151643;
  const json c = hf_config_json(yarn, DType::f32);
  EXPECT_EQ(c["torch_dtype"], "float32");
  EXPECT_EQ(fields(model_args_from_hf_config(c, "yarn")), fields(yarn));
  // Either key alone still gives the same model (4.x reads rope_scaling, 5.x rope_parameters).
  json only_v5 = c;
  only_v5.erase("rope_scaling");
  only_v5.erase("rope_theta");
  EXPECT_EQ(fields(model_args_from_hf_config(only_v5, "v5")), fields(yarn));
  json only_v4 = c;
  only_v4.erase("rope_parameters");
  EXPECT_EQ(fields(model_args_from_hf_config(only_v4, "v4")), fields(yarn));
}

TEST(HfConfig, WriterRefusesInvalidArgs) {
  ModelArgs a = flavor("0.6B");
  a.num_key_value_heads = 3;
  expect_error([&] { (void)hf_config_json(a, DType::bf16); }, {"num_key_value_heads"});
  expect_error([&] { (void)hf_config_json(flavor("0.6B"), DType::i32); }, {"I32"});
}

TEST(HfConfig, Qwen3FlagsAndTheHeadDimDefaultOfEachClass) {
  ModelArgs a = model_args_from_hf_config(qwen3_8b(), "c");
  EXPECT_TRUE(a.qk_norm);
  EXPECT_FALSE(a.attention_bias || a.o_proj_bias || a.mlp_bias);
  json c = qwen3_8b();
  c["attention_bias"] = true;  // Qwen3Attention: on q, k, v and o_proj
  a = model_args_from_hf_config(c, "c");
  EXPECT_TRUE(a.attention_bias && a.o_proj_bias && a.qk_norm);
  EXPECT_FALSE(a.mlp_bias);
  c.erase("head_dim");
  c["hidden_size"] = 2048;  // hidden / heads = 64, but Qwen3Config's head_dim default is 128
  EXPECT_EQ(model_args_from_hf_config(c, "c").head_dim, 128);
  json m = qwen3_30b_a3b_v5();
  m.erase("head_dim");  // Qwen3MoeConfig has no head_dim: hidden / heads
  EXPECT_EQ(model_args_from_hf_config(m, "m").head_dim, 2048 / 32);
}

TEST(HfConfig, ReadsThePublishedLlama32_1B) {
  const ModelArgs a = model_args_from_hf_config(llama32_1b(), "config.json");
  EXPECT_EQ(a.architecture, "LlamaForCausalLM");
  EXPECT_EQ(
      json({a.vocab_size, a.hidden_size, a.intermediate_size, a.num_hidden_layers,
            a.num_attention_heads, a.num_key_value_heads, a.head_dim, a.max_position_embeddings}),
      json({128256, 2048, 8192, 16, 32, 8, 64, 131072}));
  EXPECT_FALSE(a.qk_norm || a.attention_bias || a.o_proj_bias || a.mlp_bias);
  EXPECT_EQ(a.rope_theta, 500000.0);
  EXPECT_EQ(a.rope_scaling.type, "llama3");
  EXPECT_EQ(a.rope_scaling.factor, 32.0);
  EXPECT_EQ(a.rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(a.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(a.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_TRUE(a.tie_word_embeddings);
  EXPECT_EQ(a.rms_norm_eps, 1e-5);
  EXPECT_EQ(a.bos_token_id, 128000);
  EXPECT_EQ(a.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_EQ(count_parameters(a).total, 1'235'814'400);  // LlamaForCausalLM's, tied
}

TEST(HfConfig, ReadsThePublishedQwen25_05B) {
  const ModelArgs a = model_args_from_hf_config(qwen25_05b(), "config.json");
  EXPECT_EQ(a.architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(a.head_dim, 896 / 14);
  EXPECT_FALSE(a.qk_norm);
  EXPECT_TRUE(a.attention_bias);  // Qwen2Attention's q, k, v always have one
  EXPECT_FALSE(a.o_proj_bias || a.mlp_bias);
  EXPECT_EQ(a.rope_theta, 1e6);
  EXPECT_EQ(a.rope_scaling.type, "default");
  EXPECT_TRUE(a.tie_word_embeddings);
  EXPECT_EQ(a.eos_token_ids, (std::vector<int64_t>{151643}));
  EXPECT_EQ(count_parameters(a).total, 494'032'768);  // Qwen2ForCausalLM's, tied
  json c = qwen25_05b();
  c["attention_bias"] = false;  // not a Qwen2Config key: Transformers ignores it
  EXPECT_TRUE(model_args_from_hf_config(c, "c").attention_bias);
  c["rope_scaling"] = {
      {"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  EXPECT_EQ(model_args_from_hf_config(c, "c").rope_scaling.type, "yarn");  // the 2.5 model cards'
}

TEST(HfConfig, LlamaDefaultsFollowLlamaConfig) {
  json c = llama32_1b();
  for (const char* key :
       {"bos_token_id", "eos_token_id", "num_key_value_heads", "head_dim",
        "max_position_embeddings", "rope_scaling", "rope_theta", "tie_word_embeddings",
        "attention_bias", "mlp_bias", "pretraining_tp", "rms_norm_eps"}) {
    c.erase(key);
  }
  ModelArgs a = model_args_from_hf_config(c, "c");
  EXPECT_EQ(a.bos_token_id, 1);
  EXPECT_EQ(a.eos_token_ids, (std::vector<int64_t>{2}));
  EXPECT_EQ(a.num_key_value_heads, 32);
  EXPECT_EQ(a.head_dim, 2048 / 32);
  EXPECT_EQ(a.max_position_embeddings, 2048);
  EXPECT_EQ(a.rope_theta, 10000.0);
  EXPECT_EQ(a.rope_scaling.type, "default");
  EXPECT_EQ(a.rms_norm_eps, 1e-6);
  EXPECT_FALSE(a.tie_word_embeddings || a.attention_bias || a.o_proj_bias || a.mlp_bias);
  c["bos_token_id"] = nullptr;  // null is "none", not the class default
  c["eos_token_id"] = nullptr;
  c["attention_bias"] = true;
  c["mlp_bias"] = true;
  a = model_args_from_hf_config(c, "c");
  EXPECT_EQ(a.bos_token_id, -1);
  EXPECT_TRUE(a.eos_token_ids.empty());
  EXPECT_TRUE(a.attention_bias && a.o_proj_bias && a.mlp_bias);
  EXPECT_FALSE(a.qk_norm);
}

TEST(HfConfig, RefusesWhatLlamaAndQwen2WouldComputeDifferently) {
  const std::vector<std::pair<std::string, json>> llama_cases = {
      {"pretraining_tp", 2},      {"pretraining_tp", "1"},     {"hidden_act", "gelu"},
      {"attention_dropout", 0.1}, {"num_attention_heads", 24}, {"mlp_bias", "no"},
  };
  for (const auto& [key, value] : llama_cases) {
    json c = llama32_1b();
    c[key] = value;
    expect_error([&] { (void)model_args_from_hf_config(c, "llama.json"); }, {"llama.json: ", key});
  }
  json c = llama32_1b();
  c["num_attention_heads"] = 24;  // head_dim is given, but LlamaConfig refuses the split anyway
  expect_error([&] { (void)model_args_from_hf_config(c, "llama.json"); },
               {"hidden_size 2048 is not a multiple of num_attention_heads 24"});
  const std::vector<std::pair<std::string, json>> qwen2_cases = {
      {"use_sliding_window", true},
      {"layer_types", json(std::vector<std::string>(23, "full_attention"))},
      {"hidden_act", "relu"},
      {"attention_dropout", 0.1},
      {"num_key_value_heads", 3},
  };
  for (const auto& [key, value] : qwen2_cases) {
    json q = qwen25_05b();
    q[key] = value;
    expect_error([&] { (void)model_args_from_hf_config(q, "qwen2.json"); }, {"qwen2.json: ", key});
  }
  json q = qwen25_05b();
  std::vector<std::string> types(24, "full_attention");
  types[23] = "sliding_attention";
  q["layer_types"] = types;
  expect_error([&] { (void)model_args_from_hf_config(q, "qwen2.json"); },
               {"qwen2.json", "layer_types entry \"sliding_attention\""});
}

TEST(HfConfig, LlamaAndQwen2RoundTripThroughConfigJson) {
  ModelArgs llama = model_args_from_hf_config(llama32_1b(), "llama");
  ModelArgs untied = llama;
  untied.tie_word_embeddings = false;
  untied.attention_bias = untied.o_proj_bias = untied.mlp_bias = true;
  untied.rope_scaling = {"llama3", 8.0, 4096, 0.0, 32.0, 1.0, 1.5, 3.0};
  const ModelArgs qwen2 = model_args_from_hf_config(qwen25_05b(), "qwen2");
  for (const ModelArgs& a : {llama, untied, qwen2}) {
    const json c = hf_config_json(a, DType::bf16);
    EXPECT_EQ(fields(model_args_from_hf_config(c, "c")), fields(a)) << c.dump();
    json only_v4 = c;
    only_v4.erase("rope_parameters");
    EXPECT_EQ(fields(model_args_from_hf_config(only_v4, "v4")), fields(a));
    json only_v5 = c;
    only_v5.erase("rope_scaling");
    only_v5.erase("rope_theta");
    EXPECT_EQ(fields(model_args_from_hf_config(only_v5, "v5")), fields(a));
  }
  // What each config class writes, and nothing another family's class has.
  const json l = hf_config_json(untied, DType::bf16);
  EXPECT_EQ(l["model_type"], "llama");
  EXPECT_EQ(l["attention_bias"], true);
  EXPECT_EQ(l["mlp_bias"], true);
  EXPECT_EQ(l["pretraining_tp"], 1);
  EXPECT_EQ(l["rope_parameters"], json({{"rope_type", "llama3"},
                                        {"rope_theta", 500000.0},
                                        {"factor", 8.0},
                                        {"low_freq_factor", 1.5},
                                        {"high_freq_factor", 3.0},
                                        {"original_max_position_embeddings", 4096}}));
  EXPECT_FALSE(l.contains("layer_types") || l.contains("use_sliding_window"));
  const json q = hf_config_json(qwen2, DType::bf16);
  EXPECT_EQ(q["model_type"], "qwen2");
  EXPECT_EQ(q["use_sliding_window"], false);
  EXPECT_EQ(q["layer_types"].size(), 24u);
  EXPECT_FALSE(q.contains("attention_bias") || q.contains("mlp_bias"));
}

TEST(ModelArgsValidation, EachFamilyHasItsOwnFeatures) {
  const auto refused = [](ModelArgs a, std::initializer_list<std::string> parts) {
    expect_error([&] { validate_model_args(a, "args"); }, parts);
    expect_error([&] { (void)hf_config_json(a, DType::bf16); }, parts);
  };
  ModelArgs qwen3 = flavor("tiny");
  qwen3.qk_norm = false;
  refused(qwen3, {"Qwen3ForCausalLM always has q/k norm"});
  qwen3 = flavor("tiny");
  qwen3.o_proj_bias = true;
  refused(qwen3, {"Qwen3ForCausalLM has biases on q, k, v and o_proj together"});
  ModelArgs moe = flavor("tiny_moe");
  moe.mlp_bias = true;
  refused(moe, {"Qwen3MoeForCausalLM has no MLP biases"});
  ModelArgs qwen2 = model_args_from_hf_config(qwen25_05b(), "qwen2");
  for (bool ModelArgs::*flag : {&ModelArgs::qk_norm, &ModelArgs::attention_bias,
                                &ModelArgs::o_proj_bias, &ModelArgs::mlp_bias}) {
    ModelArgs a = qwen2;
    a.*flag = !(a.*flag);
    refused(a, {"Qwen2ForCausalLM has biases on q, k, v only"});
  }
  ModelArgs llama = model_args_from_hf_config(llama32_1b(), "llama");
  llama.qk_norm = true;
  refused(llama, {"LlamaForCausalLM has no q/k norm"});
  llama.qk_norm = false;
  llama.attention_bias = true;
  refused(llama, {"LlamaForCausalLM has biases on q, k, v and o_proj together"});
  llama.attention_bias = false;
  llama.num_experts = 4;
  llama.num_experts_per_tok = 2;
  llama.moe_intermediate_size = 8;
  refused(llama, {"LlamaForCausalLM has no experts"});
  ModelArgs dense_moe = flavor("tiny_moe");
  dense_moe.num_experts = 0;
  refused(dense_moe, {"Qwen3MoeForCausalLM needs experts"});
  ModelArgs unknown = flavor("tiny");
  unknown.architecture = "GPT2LMHeadModel";
  refused(unknown, {"architecture \"GPT2LMHeadModel\" is not supported (Qwen3ForCausalLM, "
                    "Qwen3MoeForCausalLM, Qwen2ForCausalLM, LlamaForCausalLM)"});
}

TEST(ModelRegistry, OneEntryPerArchitecture) {
  std::vector<std::string> entries;
  for (const ModelFamily& f : model_families()) {
    entries.push_back(std::string(f.architecture) + "/" + f.model_type + (f.moe ? "/moe" : ""));
    EXPECT_EQ(&model_family(f.architecture, "x"), &f);
    EXPECT_EQ(model_family_by_type(f.model_type), &f);
  }
  EXPECT_EQ(entries,
            (std::vector<std::string>{"Qwen3ForCausalLM/qwen3", "Qwen3MoeForCausalLM/qwen3_moe/moe",
                                      "Qwen2ForCausalLM/qwen2", "LlamaForCausalLM/llama"}));
  EXPECT_EQ(model_family_by_type("mistral"), nullptr);
  expect_error([] { (void)model_family("qwen2", "here"); },
               {"here: architecture \"qwen2\" is not supported", known_architectures()});
}

TEST(GenerationConfig, WritesAndReadsBack) {
  ScratchDir dir;
  GenerationConfig g = default_generation_config(flavor("0.6B"));
  EXPECT_EQ(g.bos_token_id, 151643);
  EXPECT_FALSE(g.do_sample);
  g.eos_token_ids = {151645, 151643};
  g.pad_token_id = 151643;
  g.do_sample = true;
  g.temperature = 0.6;
  g.top_p = 0.95;
  g.top_k = 20;
  write_hf_generation_config(dir / "generation_config.json", g);
  const GenerationConfig back = read_hf_generation_config(dir / "generation_config.json");
  EXPECT_EQ(back.eos_token_ids, g.eos_token_ids);
  EXPECT_EQ(back.pad_token_id, 151643);
  EXPECT_TRUE(back.do_sample);
  EXPECT_EQ(back.temperature, 0.6);
  EXPECT_EQ(back.top_p, 0.95);
  EXPECT_EQ(back.top_k, 20);
  const json greedy = hf_generation_config_json(default_generation_config(flavor("0.6B")));
  EXPECT_FALSE(greedy.contains("temperature"));
  EXPECT_FALSE(greedy.contains("pad_token_id"));
  write_file_atomic(dir / "g.json", R"({"temperature": 0})");
  expect_error([&] { (void)read_hf_generation_config(dir / "g.json"); }, {"g.json", "temperature"});
}

}  // namespace
}  // namespace titan
