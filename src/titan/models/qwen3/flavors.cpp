#include "titan/models/qwen3/flavors.h"

#include <algorithm>
#include <cctype>
#include <utility>

#include "titan/core/error.h"
#include "titan/core/suggest.h"

namespace titan {
namespace {

ModelArgs dense(int64_t h, int64_t inter, int64_t layers, int64_t heads, bool tied) {
  ModelArgs a;
  a.architecture = "Qwen3ForCausalLM";
  a.hidden_size = h;
  a.intermediate_size = inter;
  a.num_hidden_layers = layers;
  a.num_attention_heads = heads;
  a.num_key_value_heads = 8;
  a.head_dim = 128;
  a.tie_word_embeddings = tied;
  return a;
}

// Every layer sparse: `experts` of width `expert_width`, `per_token` routed to each token (top-k
// renormalised, as every Qwen3-MoE config has it).
ModelArgs with_experts(ModelArgs a, int64_t experts, int64_t per_token, int64_t expert_width) {
  a.architecture = "Qwen3MoeForCausalLM";
  a.num_experts = experts;
  a.num_experts_per_tok = per_token;
  a.moe_intermediate_size = expert_width;
  a.norm_topk_prob = true;
  return a;
}

// `inter` is the dense width HF keeps in the config; no layer uses it (all layers are sparse).
ModelArgs moe(int64_t h, int64_t inter, int64_t layers, int64_t heads, int64_t expert_width) {
  ModelArgs a = with_experts(dense(h, inter, layers, heads, false), 128, 8, expert_width);
  a.num_key_value_heads = 4;
  return a;
}

// No fixed special tokens: the default tokenizer titan trains (2048 ids, docs/DATA.md) sets its
// own, and these models read them from it.
ModelArgs small_vocab(ModelArgs a) {
  a.vocab_size = 2048;
  a.bos_token_id = -1;
  a.eos_token_ids = {};
  return a;
}

// torchtitan's Qwen3 debug models (torchtitan/models/qwen3): dim 256, 8 layers, 16 query and 8 kv
// heads of 128, vocab 2048; dense with FFN 3072 and tied embeddings, or 64 experts of 768
// (8 per token) with an untied lm_head.
ModelArgs torchtitan_debug(bool sparse) {
  ModelArgs a = small_vocab(dense(256, 3072, 8, 16, !sparse));
  a.max_position_embeddings = 4096;
  return sparse ? with_experts(a, 64, 8, 768) : a;
}

// titan's own, small enough to train 200 steps in about a minute on two cores (the default run)
// and for the end-to-end tests: 4 layers, 4 query and 2 kv heads of 64, FFN 768; the MoE one 8
// experts of 128, 2 per token.
ModelArgs tiny(bool sparse) {
  ModelArgs a = small_vocab(dense(256, 768, 4, 4, !sparse));
  a.num_key_value_heads = 2;
  a.head_dim = 64;
  a.max_position_embeddings = 2048;
  return sparse ? with_experts(a, 8, 2, 128) : a;
}

const std::vector<std::pair<std::string, ModelArgs>>& registry() {
  static const std::vector<std::pair<std::string, ModelArgs>> flavors = {
      {"tiny", tiny(false)},
      {"tiny_moe", tiny(true)},
      {"debugmodel", torchtitan_debug(false)},
      {"debugmodel_moe", torchtitan_debug(true)},
      {"0.6B", dense(1024, 3072, 28, 16, true)},
      {"1.7B", dense(2048, 6144, 28, 16, true)},
      {"4B", dense(2560, 9728, 36, 32, true)},
      {"8B", dense(4096, 12288, 36, 32, false)},
      {"14B", dense(5120, 17408, 40, 40, false)},
      {"32B", dense(5120, 25600, 64, 64, false)},
      {"30B-A3B", moe(2048, 6144, 48, 32, 768)},
      {"235B-A22B", moe(4096, 12288, 94, 64, 1536)},
  };
  return flavors;
}

}  // namespace

const ModelArgs& flavor(std::string_view name) {
  const auto& flavors = registry();
  for (const auto& [n, args] : flavors) {
    if (n == name) return args;
  }
  std::vector<std::string> names;
  for (const auto& [n, args] : flavors) names.push_back(n);
  fail("unknown model flavor '", name, "'; did you mean '", closest_name(name, names),
       "'? (flavors: ", join_names(names), ")");
}

ModelArgs flavor(std::string_view name, std::string_view attn_backend) {
  ModelArgs args = flavor(name);
  args.attn_backend = attn_backend;
  validate_model_args(args, "flavor " + std::string(name));
  return args;
}

std::vector<std::string> flavor_names() {
  std::vector<std::string> names;
  for (const auto& [n, args] : registry()) names.push_back(n);
  return names;
}

}  // namespace titan
