#include "titan/dispatch/registry.h"

#include <algorithm>
#include <iterator>
#include <type_traits>

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
         EmbeddingKernel{embedding_forward, embedding_backward, embedding_forward_bf16,
                         embedding_forward_vocab_parallel, embedding_backward_vocab_parallel}});
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
         LmHeadLossKernel{lm_head_cross_entropy, lm_head_chunk_tokens, lm_head_workspace_bytes,
                          lm_head_cross_entropy_vocab_parallel,
                          lm_head_vocab_parallel_workspace_bytes}});
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
                         attention_forward_blockwise_bf16,
                         /*packed_rows=*/true}});
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
                         attention_forward_reference_bf16_kv, nullptr, nullptr,
                         /*packed_rows=*/true}});
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

namespace {

// What a kernel's implementation (the variant's alternative) is, in the names OpKind uses: the
// alternatives are listed in OpKind's order.
constexpr OpKind kImplKinds[] = {
    OpKind::embedding, OpKind::rms_norm,     OpKind::linear,          OpKind::rope,
    OpKind::attention, OpKind::swiglu,       OpKind::lm_head_loss,    OpKind::experts,
    OpKind::router,    OpKind::moe_dispatch, OpKind::grouped_experts, OpKind::moe_combine};
static_assert(std::size(kImplKinds) == std::variant_size_v<decltype(KernelEntry::impl)>);

// A name as a message may show it: printable ASCII kept, other bytes as \xNN, at most 64 of them.
std::string shown_name(const std::string& name) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < name.size() && i < 64; ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (name.size() > 64) out += "...";
  return out;
}

bool is_identifier(const std::string& name) {
  if (name.empty() || (name[0] >= '0' && name[0] <= '9')) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

}  // namespace

void KernelRegistry::validate(const KernelEntry& entry) const {
  const OpKind impl_kind = kImplKinds[entry.impl.index()];
  TITAN_CHECK(!entry.name.empty(), "a ", op_kind_name(impl_kind),
              " kernel has an empty name (description: '", shown_name(entry.description), "')");
  const std::string name = shown_name(entry.name);
  TITAN_CHECK(is_identifier(entry.name), "kernel '", name,
              "': a kernel name is letters, digits and '_', not starting with a digit");
  TITAN_CHECK(entries_.count(entry.name) == 0, "kernel '", name, "' is registered twice");
  TITAN_CHECK(entry.kind == impl_kind, "kernel '", name, "': declared kind ",
              op_kind_name(entry.kind), ", but its implementation is of kind ",
              op_kind_name(impl_kind));
  TITAN_CHECK(!entry.dtypes.empty(), "kernel '", name, "' declares no dtype (f32, bf16)");
  for (const DType t : entry.dtypes) {
    TITAN_CHECK(t == DType::f32 || t == DType::bf16, "kernel '", name, "' declares dtype ",
                dtype_name(t), "; kernels take f32 and bf16");
  }
  // Every function a kernel of its kind must have, by name.
  const auto require = [&](bool present, const char* function) {
    TITAN_CHECK(present, "kernel '", name, "': its ", op_kind_name(impl_kind), " implementation's ",
                function, " is null");
  };
  std::visit(
      [&](const auto& k) {
        using K = std::decay_t<decltype(k)>;
        if constexpr (std::is_same_v<K, LmHeadLossKernel>) {
          require(k.forward_backward != nullptr, "forward_backward");
        } else {
          if constexpr (std::is_same_v<K, MoeDispatchKernel>) require(k.plan != nullptr, "plan");
          require(k.forward != nullptr, "forward");
          require(k.backward != nullptr, "backward");
        }
      },
      entry.impl);
  const auto check_bf16_functions = [&](const char* kind, bool has_bf16_functions) {
    const bool takes_bf16 =
        std::find(entry.dtypes.begin(), entry.dtypes.end(), DType::bf16) != entry.dtypes.end();
    TITAN_CHECK(takes_bf16 == has_bf16_functions, "kernel '", name, "': ", kind, " kernel ",
                takes_bf16 ? "that declares bf16 needs" : "that does not declare bf16 has",
                " forward_bf16 and backward_bf16");
  };
  if (const auto* linear = std::get_if<LinearKernel>(&entry.impl)) {
    check_bf16_functions("a linear",
                         linear->forward_bf16 != nullptr && linear->backward_bf16 != nullptr);
    TITAN_CHECK(linear->forward_bf16_to_bf16 == nullptr || linear->forward_bf16 != nullptr,
                "kernel '", name,
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
  if (const auto* embedding = std::get_if<EmbeddingKernel>(&entry.impl)) {
    TITAN_CHECK((embedding->forward_vocab_parallel == nullptr) ==
                    (embedding->backward_vocab_parallel == nullptr),
                "kernel '", name,
                "': an embedding kernel has forward_vocab_parallel and backward_vocab_parallel "
                "together or neither");
  }
  if (const auto* loss = std::get_if<LmHeadLossKernel>(&entry.impl)) {
    TITAN_CHECK((loss->forward_backward_vocab_parallel == nullptr) ==
                    (loss->vocab_parallel_workspace_bytes == nullptr),
                "kernel '", name,
                "': an lm_head loss kernel has forward_backward_vocab_parallel and "
                "vocab_parallel_workspace_bytes together or neither");
  }
  if (const auto* swiglu = std::get_if<SwigluKernel>(&entry.impl)) {
    TITAN_CHECK((swiglu->recompute_bf16 == nullptr) == (swiglu->backward_bf16 == nullptr),
                "kernel '", name,
                "': a swiglu kernel has recompute_bf16 and backward_bf16 together or neither");
  }
}

void KernelRegistry::add(KernelEntry entry) {
  validate(entry);
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

void KernelRegistry::set_dtype_default(OpKind kind, DeviceKind device, DType dtype,
                                       const std::string& name) {
  const KernelEntry& entry = get(name, kind);
  TITAN_CHECK(entry.device == device, "kernel '", name, "' runs on ",
              device_kind_name(entry.device), ", not ", device_kind_name(device));
  TITAN_CHECK(std::find(entry.dtypes.begin(), entry.dtypes.end(), dtype) != entry.dtypes.end(),
              "kernel '", name, "' does not take ", dtype_name(dtype),
              ", so it cannot be that dtype's default");
  dtype_defaults_[{kind, device, dtype}] = name;
}

const std::string& KernelRegistry::default_kernel(OpKind kind, DeviceKind device,
                                                  DType dtype) const {
  const auto it = dtype_defaults_.find({kind, device, dtype});
  return it != dtype_defaults_.end() ? it->second : default_kernel(kind, device);
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
  TITAN_CHECK(shape.segment_start == nullptr || kernel.packed_rows, module, ": attention kernel '",
              kernel_name, "' requires one sequence per row (it does not take packed rows)");
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
