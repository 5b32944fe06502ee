#include "titan/models/decoder_lm_slots.h"

#include <string>
#include <variant>

#include "titan/backend/backend.h"
#include "titan/core/error.h"
#include "titan/dispatch/registry.h"
#include "titan/models/decoder_lm.h"
#include "titan/nn/layers.h"

namespace titan {
namespace {

std::string layer_name(int64_t i) {
  return "model.layers." + std::to_string(i);
}

}  // namespace

// `compute`: the dtype of the matmuls' operands (the experts' GEMMs included); the router,
// norms, RoPE and SwiGLU stay fp32. Each slot starts on the running device's default kernel of
// its kind (dispatch/registry.h), attention on the CPU on the one `attn_backend` names. Attention
// is fp32 on the CPU (a CPU kernel without bf16 forms widens the kept bf16 q, k and v); on another
// device it runs in `compute`, on that dtype's default: CUDA's bf16 attention is cuDNN's, which
// takes half types only, so its kernel declares bf16 alone and an fp32 slot refuses it.
std::vector<KernelSlot> decoder_lm_default_slots(const ModelArgs& a, DType compute,
                                                 DeviceKind device) {
  const KernelRegistry& registry = kernel_registry();
  const auto slot = [&](std::string module, OpKind kind, DType dtype = DType::f32) {
    return KernelSlot{std::move(module), kind, registry.default_kernel(kind, device), dtype,
                      device};
  };
  std::vector<KernelSlot> slots = {slot("model.embed_tokens", OpKind::embedding)};
  for (int64_t i = 0; i < a.num_hidden_layers; ++i) {
    const std::string p = layer_name(i);
    slots.push_back(slot(p + ".input_layernorm", OpKind::rms_norm));
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
      slots.push_back(slot(p + ".self_attn." + proj, OpKind::linear, compute));
    }
    if (a.qk_norm) {
      slots.push_back(slot(p + ".self_attn.q_norm", OpKind::rms_norm));
      slots.push_back(slot(p + ".self_attn.k_norm", OpKind::rms_norm));
    }
    slots.push_back(slot(p + ".self_attn", OpKind::rope));
    if (device == DeviceKind::cpu) {
      slots.push_back(
          {p + ".self_attn", OpKind::attention, "attention_" + a.attn_backend, DType::f32, device});
    } else {
      slots.push_back({p + ".self_attn", OpKind::attention,
                       registry.default_kernel(OpKind::attention, device, compute), compute,
                       device});
    }
    slots.push_back(slot(p + ".post_attention_layernorm", OpKind::rms_norm));
    if (a.layer_is_sparse(i)) {
      slots.push_back(slot(p + ".mlp.gate", OpKind::linear));
      slots.push_back(slot(p + ".mlp.gate", OpKind::router));
      // experts_staged (the default): the block runs the three stage slots that follow
      // (ops/moe_stages.h); a fused experts kernel bound here instead replaces all three.
      slots.push_back(slot(p + ".mlp.experts", OpKind::experts, compute));
      slots.push_back(slot(p + ".mlp.experts", OpKind::moe_dispatch, compute));
      slots.push_back(slot(p + ".mlp.experts", OpKind::grouped_experts, compute));
      slots.push_back(slot(p + ".mlp.experts", OpKind::moe_combine));
      continue;
    }
    for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
      slots.push_back(slot(p + ".mlp." + proj, OpKind::linear, compute));
    }
    slots.push_back(slot(p + ".mlp", OpKind::swiglu));
  }
  slots.push_back(slot("model.norm", OpKind::rms_norm));
  slots.push_back(slot("lm_head", OpKind::lm_head_loss, compute));
  return slots;
}

void check_decoder_lm_slot_constraints(const std::vector<KernelSlot>& slots, const ModelArgs& a,
                                       int64_t batch, int64_t seq) {
  require_slot_constraints(
      slots, kernel_registry(),
      {batch, seq, seq, a.num_attention_heads, a.num_key_value_heads, a.head_dim},
      {batch * seq, a.hidden_size, a.moe_intermediate_size, a.num_experts, a.num_experts_per_tok});
}

void DecoderLM::check_kernel_constraints(int64_t batch, int64_t seq) const {
  check_decoder_lm_slot_constraints(slots_, args_, batch, seq);
}

DecoderLMOverrides decoder_lm_overrides(const ModelArgs& args,
                                        const std::vector<OverrideRule>& overrides,
                                        DType compute_dtype, int64_t batch, int64_t seq) {
  std::vector<KernelSlot> slots = decoder_lm_default_slots(args, compute_dtype, backend().kind());
  DecoderLMOverrides bound;
  bound.report = apply_overrides(slots, overrides, kernel_registry());
  check_decoder_lm_slot_constraints(slots, args, batch, seq);
  bound.lm_head_loss = &KernelBinder(slots).bind("lm_head", OpKind::lm_head_loss);
  return bound;
}

const LmHeadLossKernel& bound_lm_head_loss(const LmHeadLossKernel* bound) {
  return bound != nullptr
             ? *bound
             : default_kernel_impl<LmHeadLossKernel>(OpKind::lm_head_loss, backend().kind());
}

void require_vocab_parallel_loss(const KernelEntry& loss) {
  const LmHeadLossKernel& k = std::get<LmHeadLossKernel>(loss.impl);
  TITAN_CHECK(k.forward_backward_vocab_parallel != nullptr, "model: lm_head loss kernel '",
              loss.name, "' has no vocabulary-parallel form ",
              "(tensor parallel cuts the lm_head along the vocabulary)");
  // The group reduces per chunk: the plan counts the chunks.
  TITAN_CHECK(k.chunk_tokens != nullptr, "model: lm_head loss kernel '", loss.name,
              "' has no chunk_tokens (tensor parallel's loss reduces over the group per chunk, ",
              "which titan plan counts)");
}

}  // namespace titan
