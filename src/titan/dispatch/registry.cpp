#include "titan/dispatch/registry.h"

#include <algorithm>

#include "titan/core/error.h"
#include "titan/ops/embedding.h"
#include "titan/ops/linear.h"
#include "titan/ops/rms_norm.h"
#include "titan/ops/swiglu.h"

namespace titan {
namespace {

void register_builtins(KernelRegistry& r) {
  r.add({"embedding",
         OpKind::embedding,
         {DType::f32},
         "row gather (fp32, or bf16 rows widened); column-blocked scatter-add backward",
         EmbeddingKernel{embedding_forward, embedding_backward, embedding_forward_bf16}});
  r.add({"linear",
         OpKind::linear,
         {DType::f32, DType::bf16},
         "oneDNN sgemm; bf16 operands through oneDNN's matmul",
         LinearKernel{linear_forward, linear_backward, linear_forward_bf16, linear_backward_bf16,
                      linear_forward_bf16_to_bf16}});
  r.add({"linear_reference",
         OpKind::linear,
         {DType::f32, DType::bf16},
         "three loops, fp64 sums",
         LinearKernel{linear_forward_reference, linear_backward_reference,
                      linear_forward_bf16_reference, linear_backward_bf16_reference}});
  r.add({"rope",
         OpKind::rope,
         {DType::f32},
         "rotate_half with a precomputed cos/sin cache",
         RopeKernel{rope_forward, rope_backward}});
  r.add({"cross_entropy_chunked",
         OpKind::lm_head_loss,
         {DType::f32, DType::bf16},
         "lm_head GEMM fused with cross-entropy, chunks of at most 320 MiB of logits",
         LmHeadLossKernel{lm_head_cross_entropy, lm_head_chunk_tokens, lm_head_workspace_bytes}});
  r.add({"cross_entropy_reference",
         OpKind::lm_head_loss,
         {DType::f32},
         "whole logits matrix, fp64 softmax",
         LmHeadLossKernel{lm_head_cross_entropy_reference}});
  r.add({"rms_norm",
         OpKind::rms_norm,
         {DType::f32},
         "fp32 statistics, vectorised, threaded over rows",
         RmsNormKernel{rms_norm_forward, rms_norm_backward}});
  r.add({"rms_norm_reference",
         OpKind::rms_norm,
         {DType::f32},
         "serial fp64-sum reference",
         RmsNormKernel{rms_norm_forward_reference, rms_norm_backward_reference}});
  r.add({"attention_blockwise",
         OpKind::attention,
         {DType::f32},
         "flash-style online softmax over 128x128 blocks, FA2 backward (bf16 GEMMs under bf16)",
         AttentionKernel{attention_forward_blockwise,
                         attention_backward_blockwise,
                         {},
                         attention_forward_blockwise_bf16_kv,
                         attention_backward_blockwise_bf16,
                         attention_forward_blockwise_bf16}});
  r.add({"attention_reference",
         OpKind::attention,
         {DType::f32},
         "full probability matrix per head, fp64 sums (small inputs)",
         AttentionKernel{attention_forward_reference, attention_backward_reference,
                         [](const AttentionShape& s) -> std::string {
                           // O(S^2 hd) serial loops: minutes beyond a few thousand positions.
                           if (s.seq_kv > 8192) return "seq_kv <= 8192";
                           return {};
                         },
                         attention_forward_reference_bf16_kv}});
  r.add(
      {"swiglu",
       OpKind::swiglu,
       {DType::f32},
       "silu(gate) * up, vectorised",
       SwigluKernel{swiglu_forward, swiglu_backward, swiglu_recompute_bf16, swiglu_backward_bf16}});
  r.add({"experts_grouped",
         OpKind::experts,
         {DType::f32, DType::bf16},
         "tokens grouped by expert, three GEMMs per expert over its rows (sgemm; bf16 operands "
         "through oneDNN's matmul)",
         ExpertsKernel{experts_forward_grouped, experts_backward_grouped, experts_check_rows,
                       experts_forward_grouped_bf16, experts_backward_grouped_bf16}});
  r.add({"experts_reference",
         OpKind::experts,
         {DType::f32, DType::bf16},
         "token by token, fp64 sums (small inputs)",
         ExpertsKernel{experts_forward_reference, experts_backward_reference, experts_check_rows,
                       experts_forward_bf16_reference, experts_backward_bf16_reference}});
  r.add({"experts_staged",
         OpKind::experts,
         {DType::f32, DType::bf16},
         "route, dispatch, grouped compute and combine: the block runs its stage slots "
         "(router, moe_dispatch, grouped_experts, moe_combine)",
         ExpertsKernel{experts_forward_staged, experts_backward_staged, experts_check_rows,
                       experts_forward_staged_bf16, experts_backward_staged_bf16, true}});
  r.add({"router_topk",
         OpKind::router,
         {DType::f32},
         "softmax and top-k per token, threaded over tokens",
         RouterKernel{router_topk_forward, router_topk_backward}});
  r.add({"router_topk_reference",
         OpKind::router,
         {DType::f32},
         "fp64 softmax and sums",
         RouterKernel{router_topk_forward_reference, router_topk_backward_reference}});
  r.add({"moe_dispatch",
         OpKind::moe_dispatch,
         {DType::f32, DType::bf16},
         "counting sort of the rows by expert; threaded row gather (rounded under bf16)",
         MoeDispatchKernel{moe_dispatch_plan, moe_dispatch_forward, moe_dispatch_backward,
                           moe_dispatch_forward_bf16}});
  r.add({"moe_dispatch_reference",
         OpKind::moe_dispatch,
         {DType::f32, DType::bf16},
         "stable sort by expert, serial loops, fp64 sums",
         MoeDispatchKernel{moe_dispatch_plan_reference, moe_dispatch_forward_reference,
                           moe_dispatch_backward_reference, moe_dispatch_forward_bf16_reference}});
  r.add({"grouped_experts",
         OpKind::grouped_experts,
         {DType::f32, DType::bf16},
         "three GEMMs per expert over its rows (sgemm; bf16 operands through oneDNN's matmul)",
         GroupedExpertsKernel{grouped_experts_forward, grouped_experts_backward,
                              grouped_experts_forward_bf16, grouped_experts_backward_bf16}});
  r.add({"grouped_experts_reference",
         OpKind::grouped_experts,
         {DType::f32, DType::bf16},
         "row by row, fp64 sums (small inputs)",
         GroupedExpertsKernel{grouped_experts_forward_reference, grouped_experts_backward_reference,
                              grouped_experts_forward_bf16_reference,
                              grouped_experts_backward_bf16_reference}});
  r.add({"moe_combine",
         OpKind::moe_combine,
         {DType::f32},
         "weighted sum per token in ascending expert order, threaded over tokens",
         MoeCombineKernel{moe_combine_forward, moe_combine_backward}});
  r.add({"moe_combine_reference",
         OpKind::moe_combine,
         {DType::f32},
         "fp64 sums",
         MoeCombineKernel{moe_combine_forward_reference, moe_combine_backward_reference}});
  r.add({"swiglu_reference",
         OpKind::swiglu,
         {DType::f32},
         "fp64 reference",
         SwigluKernel{swiglu_forward_reference, swiglu_backward_reference}});

  r.set_default(OpKind::embedding, DeviceKind::cpu, "embedding");
  r.set_default(OpKind::rms_norm, DeviceKind::cpu, "rms_norm");
  r.set_default(OpKind::linear, DeviceKind::cpu, "linear");
  r.set_default(OpKind::rope, DeviceKind::cpu, "rope");
  r.set_default(OpKind::attention, DeviceKind::cpu, "attention_blockwise");
  r.set_default(OpKind::swiglu, DeviceKind::cpu, "swiglu");
  r.set_default(OpKind::lm_head_loss, DeviceKind::cpu, "cross_entropy_chunked");
  r.set_default(OpKind::experts, DeviceKind::cpu, "experts_staged");
  r.set_default(OpKind::router, DeviceKind::cpu, "router_topk");
  r.set_default(OpKind::moe_dispatch, DeviceKind::cpu, "moe_dispatch");
  r.set_default(OpKind::grouped_experts, DeviceKind::cpu, "grouped_experts");
  r.set_default(OpKind::moe_combine, DeviceKind::cpu, "moe_combine");
  r.add_device_ops(cpu_device_ops());
}

}  // namespace

const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::embedding:
      return "embedding";
    case OpKind::rms_norm:
      return "rms_norm";
    case OpKind::linear:
      return "linear";
    case OpKind::rope:
      return "rope";
    case OpKind::attention:
      return "attention";
    case OpKind::swiglu:
      return "swiglu";
    case OpKind::lm_head_loss:
      return "lm_head_loss";
    case OpKind::experts:
      return "experts";
    case OpKind::router:
      return "router";
    case OpKind::moe_dispatch:
      return "moe_dispatch";
    case OpKind::grouped_experts:
      return "grouped_experts";
    case OpKind::moe_combine:
      return "moe_combine";
  }
  return "?";
}

void KernelRegistry::add(KernelEntry entry) {
  TITAN_CHECK(entries_.count(entry.name) == 0, "kernel '", entry.name, "' is registered twice");
  const auto check_bf16_functions = [&](const char* kind, bool has_bf16_functions) {
    const bool takes_bf16 =
        std::find(entry.dtypes.begin(), entry.dtypes.end(), DType::bf16) != entry.dtypes.end();
    TITAN_CHECK(takes_bf16 == has_bf16_functions, "kernel '", entry.name, "': ", kind, " kernel ",
                takes_bf16 ? "that declares bf16 needs" : "that does not declare bf16 has",
                " forward_bf16 and backward_bf16");
  };
  if (const auto* linear = std::get_if<LinearKernel>(&entry.impl)) {
    check_bf16_functions("a linear",
                         linear->forward_bf16 != nullptr && linear->backward_bf16 != nullptr);
    TITAN_CHECK(linear->forward_bf16_to_bf16 == nullptr || linear->forward_bf16 != nullptr,
                "kernel '", entry.name,
                "': a linear kernel with forward_bf16_to_bf16 needs "
                "forward_bf16 and backward_bf16");
  }
  if (const auto* experts = std::get_if<ExpertsKernel>(&entry.impl)) {
    check_bf16_functions("an experts",
                         experts->forward_bf16 != nullptr && experts->backward_bf16 != nullptr);
  }
  if (const auto* grouped = std::get_if<GroupedExpertsKernel>(&entry.impl)) {
    check_bf16_functions("a grouped experts",
                         grouped->forward_bf16 != nullptr && grouped->backward_bf16 != nullptr);
  }
  if (const auto* dispatch = std::get_if<MoeDispatchKernel>(&entry.impl)) {
    // Its backward is fp32 in both dtypes: forward_bf16 alone is its bf16 form.
    check_bf16_functions("a moe_dispatch", dispatch->forward_bf16 != nullptr);
  }
  if (const auto* swiglu = std::get_if<SwigluKernel>(&entry.impl)) {
    TITAN_CHECK((swiglu->recompute_bf16 == nullptr) == (swiglu->backward_bf16 == nullptr),
                "kernel '", entry.name,
                "': a swiglu kernel has recompute_bf16 and backward_bf16 together or neither");
  }
  const std::string name = entry.name;
  entries_.emplace(name, std::move(entry));
}

const KernelEntry* KernelRegistry::find(const std::string& name) const {
  const auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

const KernelEntry& KernelRegistry::get(const std::string& name, OpKind kind) const {
  const KernelEntry* entry = find(name);
  if (entry != nullptr && entry->kind == kind) return *entry;
  std::string known;
  for (const auto& [other, e] : entries_) {
    if (e.kind == kind) known += (known.empty() ? "" : ", ") + other;
  }
  if (entry != nullptr) {
    fail("kernel '", name, "' is a ", op_kind_name(entry->kind), " kernel, not ",
         op_kind_name(kind), " (", op_kind_name(kind), " kernels: ", known, ")");
  }
  fail("no ", op_kind_name(kind), " kernel named '", name, "' (registered: ", known, ")");
}

std::vector<const KernelEntry*> KernelRegistry::entries() const {
  std::vector<const KernelEntry*> out;
  for (const auto& [name, e] : entries_) out.push_back(&e);
  return out;
}

void KernelRegistry::set_default(OpKind kind, DeviceKind device, const std::string& name) {
  const KernelEntry& entry = get(name, kind);
  TITAN_CHECK(entry.device == device, "kernel '", name, "' runs on ",
              device_kind_name(entry.device), ", not ", device_kind_name(device));
  defaults_[{kind, device}] = name;
}

const std::string& KernelRegistry::default_kernel(OpKind kind, DeviceKind device) const {
  const auto it = defaults_.find({kind, device});
  TITAN_CHECK(it != defaults_.end(), "no ", op_kind_name(kind), " kernel is registered for ",
              device_kind_name(device));
  return it->second;
}

void KernelRegistry::add_device_ops(const DeviceOps& ops) {
  TITAN_CHECK(device_ops_.count(ops.device) == 0, "the ops of ", device_kind_name(ops.device),
              " are registered twice");
  device_ops_.emplace(ops.device, ops);
}

const DeviceOps& KernelRegistry::device_ops(DeviceKind device) const {
  const auto it = device_ops_.find(device);
  TITAN_CHECK(it != device_ops_.end(), "no ops are registered for ", device_kind_name(device),
              " (this titan has no kernels for that device yet)");
  return it->second;
}

KernelRegistry& kernel_registry() {
  static KernelRegistry registry = [] {
    KernelRegistry r;
    register_builtins(r);
    register_cuda_kernels(r);
    return r;
  }();
  return registry;
}

void require_constraints(const std::string& module, const std::string& kernel_name,
                         const AttentionKernel& kernel, const AttentionShape& shape) {
  if (!kernel.check) return;
  const std::string broken = kernel.check(shape);
  TITAN_CHECK(broken.empty(), module, ": attention kernel '", kernel_name, "' requires ", broken);
}

void require_constraints(const std::string& module, const std::string& kernel_name,
                         const ExpertsKernel& kernel, const ExpertsShape& shape) {
  if (!kernel.check) return;
  const std::string broken = kernel.check(shape);
  TITAN_CHECK(broken.empty(), module, ": experts kernel '", kernel_name, "' requires ", broken);
}

}  // namespace titan
