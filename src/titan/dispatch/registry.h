// The kernel registry: every primitive op is reached through a named entry holding its forward,
// its backward, the plain fp32 reference, the dtypes it takes and an optional constraint check.
// Modules bind one entry per op slot at build time (defaults, then the config's [overrides],
// dispatch/overrides.h), so a custom kernel replaces a module's computation without touching the
// model code.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include "titan/backend/backend.h"
#include "titan/core/dtype.h"
#include "titan/dispatch/device_ops.h"
#include "titan/dispatch/kernel_fn.h"
#include "titan/ops/attention.h"
#include "titan/ops/cross_entropy.h"
#include "titan/ops/moe.h"
#include "titan/ops/moe_stages.h"
#include "titan/ops/rope.h"
#include "titan/ops/vocab_shard.h"

namespace titan {

// The MoE experts are one `experts` kernel (fused, or `experts_staged`: the block runs the four
// stage kinds after it, ops/moe_stages.h): router, moe_dispatch, grouped_experts, moe_combine.
enum class OpKind {
  embedding,
  rms_norm,
  linear,
  rope,
  attention,
  swiglu,
  lm_head_loss,
  experts,
  router,
  moe_dispatch,
  grouped_experts,
  moe_combine
};
const char* op_kind_name(OpKind kind);

using RmsNormForward = void (*)(float*, float*, const float*, const float*, int64_t, int64_t,
                                float);
using RmsNormBackward = void (*)(float*, float*, const float*, const float*, const float*,
                                 const float*, int64_t, int64_t);
struct RmsNormKernel {
  KernelFn<RmsNormForward, "rms_norm.forward"> forward;
  KernelFn<RmsNormBackward, "rms_norm.backward"> backward;
};

using AttentionForward = void (*)(float*, float*, const float*, const float*, const float*,
                                  const AttentionShape&);
using AttentionBackward = void (*)(float*, float*, float*, const float*, const float*, const float*,
                                   const float*, const float*, const float*, const AttentionShape&);
using AttentionForwardBf16Kv = void (*)(float*, float*, const float*, const uint16_t*,
                                        const uint16_t*, const AttentionShape&);
using AttentionForwardBf16 = void (*)(float*, float*, const uint16_t*, const uint16_t*,
                                      const uint16_t*, const AttentionShape&);
using AttentionBackwardBf16 = void (*)(float*, float*, float*, const float*, const uint16_t*,
                                       const uint16_t*, const uint16_t*, const uint16_t*,
                                       const float*, const AttentionShape&);
struct AttentionKernel {
  KernelFn<AttentionForward, "attention.forward"> forward;
  KernelFn<AttentionBackward, "attention.backward"> backward;
  // Empty when the kernel can run this shape, else the violated constraint in words.
  std::function<std::string(const AttentionShape&)> check;
  // The forward over bf16 keys and values (a bf16 KV cache, ops/attention.h), or null when the
  // kernel reads only fp32 ones.
  KernelFn<AttentionForwardBf16Kv, "attention.forward_bf16_kv"> forward_bf16_kv = nullptr;
  // The backward over bf16 q, k and v with bf16 GEMMs (mixed-precision training, which keeps
  // them rounded), or null: that training then widens them and runs `backward`, in fp32.
  KernelFn<AttentionBackwardBf16, "attention.backward_bf16"> backward_bf16 = nullptr;
  // The forward over bf16 q, k and v with bf16 GEMMs (mixed-precision training), or null: that
  // training then runs `forward` on them widened, in fp32.
  KernelFn<AttentionForwardBf16, "attention.forward_bf16"> forward_bf16 = nullptr;
  // Whether its functions honour AttentionShape::segment_start (packed rows); a kernel that does
  // not is refused for them (require_constraints) rather than let attend across sequences.
  bool packed_rows = false;
};

using SwigluForward = void (*)(float*, const float*, const float*, int64_t);
using SwigluBackward = void (*)(float*, float*, const float*, const float*, const float*, int64_t);
struct SwigluKernel {
  KernelFn<SwigluForward, "swiglu.forward"> forward;
  KernelFn<SwigluBackward, "swiglu.backward"> backward;
  // Mixed-precision training's forms (ops/swiglu.h: the product of the bf16 gate and up rounded
  // for down_proj, in the forward and again in the backward), both or neither: without them that
  // training widens the kept gate and up and runs the fp32 pair on the same values.
  KernelFn<void (*)(uint16_t*, const uint16_t*, const uint16_t*, int64_t), "swiglu.recompute_bf16">
      recompute_bf16 = nullptr;
  KernelFn<void (*)(uint16_t*, uint16_t*, const float*, const uint16_t*, const uint16_t*, int64_t),
           "swiglu.backward_bf16">
      backward_bf16 = nullptr;
};

struct EmbeddingKernel {
  KernelFn<void (*)(float*, const int32_t*, const float*, int64_t, int64_t, int64_t),
           "embedding.forward">
      forward;
  KernelFn<void (*)(float*, const float*, const int32_t*, int64_t, int64_t), "embedding.backward">
      backward;
  // The lookup from a bf16 weight (raw bits, rows widened exactly), or null: bf16 inference then
  // keeps the embedding in fp32 (infer/weights.h).
  KernelFn<void (*)(float*, const int32_t*, const uint16_t*, int64_t, int64_t, int64_t),
           "embedding.forward_bf16">
      forward_bf16 = nullptr;
  // The vocabulary-parallel lookup and scatter (tensor parallel, ops/embedding.h: this rank's
  // rows only), both or neither; without them the kernel cannot serve an embedding cut along the
  // vocabulary (a tensor-parallel model refuses it).
  KernelFn<void (*)(float*, const int32_t*, const float*, int64_t, const VocabShard&, int64_t),
           "embedding.forward_vocab_parallel">
      forward_vocab_parallel = nullptr;
  KernelFn<void (*)(float*, const float*, const int32_t*, int64_t, const VocabShard&, int64_t),
           "embedding.backward_vocab_parallel">
      backward_vocab_parallel = nullptr;
};

struct LinearKernel {
  KernelFn<void (*)(float*, const float*, const float*, int64_t, int64_t, int64_t),
           "linear.forward">
      forward;
  KernelFn<void (*)(float*, float*, const float*, const float*, const float*, int64_t, int64_t,
                    int64_t, bool),
           "linear.backward">
      backward;
  // bf16 x, W and dy, fp32 accumulation and outputs (ops/linear.h): required when the entry's
  // dtypes include bf16, else null.
  KernelFn<void (*)(float*, const uint16_t*, const uint16_t*, int64_t, int64_t, int64_t),
           "linear.forward_bf16">
      forward_bf16 = nullptr;
  KernelFn<void (*)(float*, float*, const uint16_t*, const uint16_t*, const uint16_t*, int64_t,
                    int64_t, int64_t, bool),
           "linear.backward_bf16">
      backward_bf16 = nullptr;
  // The bf16 forward writing y rounded to bf16 (raw bits), or null: mixed-precision training then
  // rounds forward_bf16's fp32 y where it keeps only the rounding (gate_proj's and up_proj's).
  KernelFn<void (*)(uint16_t*, const uint16_t*, const uint16_t*, int64_t, int64_t, int64_t),
           "linear.forward_bf16_to_bf16">
      forward_bf16_to_bf16 = nullptr;
};

struct RopeKernel {
  KernelFn<void (*)(float*, const int32_t*, const RopeCache&, int64_t, int64_t), "rope.forward">
      forward;
  KernelFn<void (*)(float*, const int32_t*, const RopeCache&, int64_t, int64_t), "rope.backward">
      backward;
};

// Forward and backward in one call: the chunked loss computes d loss / d logits as it goes.
struct LmHeadLossKernel {
  KernelFn<CrossEntropyResult (*)(const CrossEntropyArgs&), "lm_head_loss.forward_backward">
      forward_backward;
  // The tokens per chunk it uses for n_tokens rows (CrossEntropyArgs::chunk_tokens; 0 picks its
  // own), and the bytes of the workspace a caller may hand it (CrossEntropyArgs::workspace), or
  // null: it then takes whole rows and allocates what it needs.
  int64_t (*chunk_tokens)(int64_t n_tokens, int64_t vocab, int64_t chunk_tokens) = nullptr;
  int64_t (*workspace_bytes)(int64_t n_tokens, int64_t hidden, int64_t vocab, int64_t chunk_tokens,
                             bool bf16) = nullptr;
  // The vocabulary-parallel loss on this rank's lm_head rows (tensor parallel, torchtitan's
  // loss_parallel; ops/cross_entropy.h) and its workspace's bytes, both or neither; without
  // them the kernel cannot serve an lm_head cut along the vocabulary.
  KernelFn<CrossEntropyResult (*)(const CrossEntropyArgs&, const VocabShard&),
           "lm_head_loss.forward_backward_vocab_parallel">
      forward_backward_vocab_parallel = nullptr;
  int64_t (*vocab_parallel_workspace_bytes)(int64_t n_tokens, int64_t hidden,
                                            const VocabShard& shard, int64_t chunk_tokens,
                                            bool bf16) = nullptr;
};

// A sparse MoE block's experts: every routed (token, slot) through its expert's SwiGLU MLP,
// weighted and summed per token (ops/moe.h).
using ExpertsForward = void (*)(float*, const ExpertsActivations&, const ExpertsScratch&,
                                const float*, const int32_t*, const float*, const ExpertWeights&,
                                const ExpertsShape&);
using ExpertsBackward = void (*)(float*, float*, const ExpertGrads&, const ExpertsScratch&,
                                 const float*, const ExpertsActivations&, const float*,
                                 const int32_t*, const float*, const ExpertWeights&,
                                 const ExpertsShape&);
using ExpertsForwardBf16 = void (*)(float*, const ExpertsActivations&, const ExpertsScratch&,
                                    const float*, const int32_t*, const float*,
                                    const ExpertWeightsBf16&, const ExpertsShape&);
using ExpertsBackwardBf16 = void (*)(float*, float*, const ExpertGrads&, const ExpertsScratch&,
                                     const float*, const ExpertsActivations&, const float*,
                                     const int32_t*, const float*, const ExpertWeightsBf16&,
                                     const ExpertsShape&);
struct ExpertsKernel {
  KernelFn<ExpertsForward, "experts.forward"> forward;
  KernelFn<ExpertsBackward, "experts.backward"> backward;
  // Empty when the kernel can run this shape, else the violated constraint in words.
  std::function<std::string(const ExpertsShape&)> check;
  // bf16 GEMM operands, fp32 accumulation, routing and outputs (ops/moe.h): required when the
  // entry's dtypes include bf16, else null.
  KernelFn<ExpertsForwardBf16, "experts.forward_bf16"> forward_bf16 = nullptr;
  KernelFn<ExpertsBackwardBf16, "experts.backward_bf16"> backward_bf16 = nullptr;
  // experts_staged's: a block bound to it runs its own stage slots (router, moe_dispatch,
  // grouped_experts, moe_combine) instead of these functions, which compose the built-in stages.
  bool runs_stage_slots = false;
};

// The experts in stages (ops/moe_stages.h), each slot bound on its own. The router's softmax and
// top-k after mlp.gate's projection, always fp32.
struct RouterKernel {
  KernelFn<void (*)(int32_t*, float*, float*, const float*, int64_t, int64_t, int64_t, bool),
           "router.forward">
      forward;
  KernelFn<void (*)(float*, const float*, const float*, const float*, const int32_t*, int64_t,
                    int64_t, int64_t, bool),
           "router.backward">
      backward;
};

// Rows grouped by expert (plan) and the tokens' inputs gathered into them (forward; rounded to
// bf16 by forward_bf16, required when the entry declares bf16); the backward sums the dx rows
// per token and puts d weight back in (token, slot) order, fp32 in both dtypes.
struct MoeDispatchKernel {
  KernelFn<void (*)(int32_t*, int32_t*, const int32_t*, const ExpertsShape&), "moe_dispatch.plan">
      plan;
  KernelFn<void (*)(float*, const float*, const int32_t*, const ExpertsShape&),
           "moe_dispatch.forward">
      forward;
  KernelFn<void (*)(float*, float*, const float*, const float*, const int32_t*,
                    const ExpertsShape&),
           "moe_dispatch.backward">
      backward;
  KernelFn<void (*)(uint16_t*, const float*, const int32_t*, const ExpertsShape&),
           "moe_dispatch.forward_bf16">
      forward_bf16 = nullptr;
};

// Every expert's SwiGLU MLP over its rows; bf16 forms required when the entry declares bf16.
struct GroupedExpertsKernel {
  KernelFn<void (*)(float*, const ExpertsActivations&, const ExpertsScratch&, const float*,
                    const int32_t*, const ExpertWeights&, const ExpertsShape&),
           "grouped_experts.forward">
      forward;
  KernelFn<void (*)(float*, float*, const ExpertGrads&, const ExpertsScratch&, const float*,
                    const ExpertsActivations&, const float*, const int32_t*, const ExpertWeights&,
                    const ExpertsShape&),
           "grouped_experts.backward">
      backward;
  KernelFn<void (*)(float*, const ExpertsActivations&, const ExpertsScratch&, const uint16_t*,
                    const int32_t*, const ExpertWeightsBf16&, const ExpertsShape&),
           "grouped_experts.forward_bf16">
      forward_bf16 = nullptr;
  KernelFn<void (*)(float*, float*, const ExpertGrads&, const ExpertsScratch&, const float*,
                    const ExpertsActivations&, const uint16_t*, const int32_t*,
                    const ExpertWeightsBf16&, const ExpertsShape&),
           "grouped_experts.backward_bf16">
      backward_bf16 = nullptr;
};

// The routing-weighted sum back in token order, and its factored backward; fp32 in both dtypes.
struct MoeCombineKernel {
  KernelFn<void (*)(float*, const float*, const int32_t*, const int32_t*, const float*,
                    const ExpertsShape&),
           "moe_combine.forward">
      forward;
  KernelFn<void (*)(float*, float*, const float*, const float*, const int32_t*,
                    const ExpertsShape&),
           "moe_combine.backward">
      backward;
};

struct KernelEntry {
  std::string name;
  OpKind kind;
  // The dtypes its inputs and weights may have; a slot needing another is refused before
  // anything is allocated (apply_overrides).
  std::vector<DType> dtypes;
  std::string description;
  std::variant<EmbeddingKernel, RmsNormKernel, LinearKernel, RopeKernel, AttentionKernel,
               SwigluKernel, LmHeadLossKernel, ExpertsKernel, RouterKernel, MoeDispatchKernel,
               GroupedExpertsKernel, MoeCombineKernel>
      impl;
  // The device its functions run on (what their pointers point into).
  DeviceKind device = DeviceKind::cpu;
};

class KernelRegistry {
 public:
  // Names are unique across kinds; registering a name twice is an error, as is every entry
  // validate() refuses.
  void add(KernelEntry entry);
  // titan::Error naming the kernel unless `entry` could be added: its name is a non-empty
  // identifier not registered yet, its declared kind is its implementation's, it declares f32
  // and/or bf16 only, its forward and backward (an lm_head loss's forward_backward) are not
  // null, and it has the bf16 forms its kind needs for the dtypes it declares.
  void validate(const KernelEntry& entry) const;
  // The entry, or titan::Error naming the closest registered names of that kind.
  const KernelEntry& get(const std::string& name, OpKind kind) const;
  const KernelEntry* find(const std::string& name) const;
  std::vector<const KernelEntry*> entries() const;

  // The kernel a module's slot of `kind` binds on `device` before [overrides]: set once per
  // (kind, device) by whoever registers that device's kernels; titan::Error when none is set.
  void set_default(OpKind kind, DeviceKind device, const std::string& name);
  const std::string& default_kernel(OpKind kind, DeviceKind device) const;
  // A default for slots of one dtype only, over the (kind, device) default (CUDA's bf16
  // attention: cuDNN's SDPA takes half types only); the kernel must declare that dtype.
  void set_dtype_default(OpKind kind, DeviceKind device, DType dtype, const std::string& name);
  // The dtype's default where one is set, else default_kernel(kind, device).
  const std::string& default_kernel(OpKind kind, DeviceKind device, DType dtype) const;

  // The device's table of the ops no override rebinds (dispatch/device_ops.h), one per device.
  void add_device_ops(const DeviceOps& ops);
  const DeviceOps& device_ops(DeviceKind device) const;

 private:
  std::map<std::string, KernelEntry> entries_;
  std::map<std::pair<OpKind, DeviceKind>, std::string> defaults_;
  std::map<std::tuple<OpKind, DeviceKind, DType>, std::string> dtype_defaults_;
  std::map<DeviceKind, DeviceOps> device_ops_;
};

// The CUDA library's kernels and device ops added to `registry` (src/titan/dispatch/cuda/, built
// into titan_cuda); a titan built without CUDA adds none (dispatch/cuda/no_cuda.cpp).
void register_cuda_kernels(KernelRegistry& registry);

// The process-wide registry with every built-in kernel registered.
KernelRegistry& kernel_registry();

// The functions of the default kernel of `kind` on `device` (Kernel: its struct, e.g.
// LmHeadLossKernel).
template <typename Kernel>
const Kernel& default_kernel_impl(OpKind kind, DeviceKind device) {
  const KernelRegistry& registry = kernel_registry();
  return std::get<Kernel>(registry.get(registry.default_kernel(kind, device), kind).impl);
}

// titan::Error "<module>: attention kernel '<name>' requires <what>" when the kernel's check
// refuses `shape` (nothing when it has no check): what a module says at each call and the model
// says for every module at start-up, before the run allocates (titan train, titan plan).
void require_constraints(const std::string& module, const std::string& kernel_name,
                         const AttentionKernel& kernel, const AttentionShape& shape);
// The same for an experts kernel: "<module>: experts kernel '<name>' requires <what>".
void require_constraints(const std::string& module, const std::string& kernel_name,
                         const ExpertsKernel& kernel, const ExpertsShape& shape);

}  // namespace titan
