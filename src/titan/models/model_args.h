// The numbers that define a model of a registered family (models/registry.h). Both routes to a
// model -- a built-in flavor (qwen3/flavors.h) and a Hugging Face config.json (hf_config.h) --
// produce this struct, and the model is built from it alone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "titan/ops/rope.h"

namespace titan {

struct ModelArgs {
  // Hugging Face's architectures[0], the model registry's key (models/registry.h):
  // Qwen3ForCausalLM, Qwen3MoeForCausalLM, Qwen2ForCausalLM, LlamaForCausalLM.
  std::string architecture = "Qwen3ForCausalLM";
  int64_t vocab_size = 151936;
  int64_t hidden_size = 1024;        // h
  int64_t intermediate_size = 3072;  // I (dense SwiGLU width)
  int64_t num_hidden_layers = 28;    // L
  int64_t num_attention_heads = 16;  // H
  int64_t num_key_value_heads = 8;   // KV, divides H
  int64_t head_dim = 128;            // hd, independent of h / H
  int64_t max_position_embeddings = 40960;
  double rope_theta = 1000000.0;
  RopeScaling rope_scaling;
  double rms_norm_eps = 1e-6;
  double initializer_range = 0.02;
  bool tie_word_embeddings = true;
  // What the attention and MLP blocks contain, which is where the families differ.
  bool qk_norm = true;          // per-head RMSNorm of q and k before RoPE (Qwen3)
  bool attention_bias = false;  // q/k/v projections have biases (Qwen2; Llama/Qwen3 attention_bias)
  bool o_proj_bias = false;     // o_proj has a bias (Llama and Qwen3 attention_bias)
  bool mlp_bias = false;        // gate/up/down projections have biases (Llama mlp_bias)
  int64_t bos_token_id = 151643;
  std::vector<int64_t> eos_token_ids = {151645};
  int64_t pad_token_id = -1;  // -1: none

  // MoE (num_experts == 0 for dense models).
  int64_t num_experts = 0;            // E
  int64_t num_experts_per_tok = 0;    // k
  int64_t moe_intermediate_size = 0;  // Im
  bool norm_topk_prob = true;
  double router_aux_loss_coef = 0.001;
  bool output_router_logits = false;  // HF adds the aux loss to the training loss only when set
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;

  // How the model is computed, not what it is: the attention kernel's registry name.
  std::string attn_backend = "blockwise";  // "blockwise" (flash-style) | "reference"

  bool is_moe() const { return num_experts > 0; }
  RopeParams rope() const { return {head_dim, rope_theta, rope_scaling}; }
  // Layer i uses the sparse MoE block (Qwen3-MoE rule: not listed dense, every step-th layer).
  bool layer_is_sparse(int64_t layer) const;
};

// Throws titan::Error naming the first field that is missing, non-positive or inconsistent
// (heads not divisible by kv heads, top-k above the expert count, an unknown architecture, a
// feature flag its family does not have, ...). `where` prefixes the
// message (a file name or "flavor qwen3_0.6b").
void validate_model_args(const ModelArgs& args, const std::string& where);

}  // namespace titan
