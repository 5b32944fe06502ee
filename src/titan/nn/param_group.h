// Parameters, gradients and AdamW state of one transformer block (or of the embedding / final
// norm / lm_head group) live in flat buffers, one per kind, all with the same layout and carved
// into named views. Zeroing gradients, the optimizer step, checkpointing and (later) FSDP
// sharding each work on whole flat buffers.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "titan/core/allocator.h"
#include "titan/core/tensor.h"

namespace titan {

// kaiming_uniform: U(-1/sqrt(in), 1/sqrt(in)) over a matrix (out, in), torch's
// kaiming_uniform_(a = sqrt(5)) -- what PEFT gives a LoRA A matrix.
enum class ParamInit { normal, ones, zeros, kaiming_uniform };

struct ParamSpec {
  std::string
      name;  // fully qualified Hugging Face name, e.g. model.layers.3.self_attn.q_proj.weight
  Shape shape;
  ParamInit init = ParamInit::normal;
};

struct ParamView {
  ParamSpec spec;
  int64_t offset = 0;  // elements from the start of the group's buffers
  int64_t numel = 0;
  int64_t copy_offset = -1;  // elements from the start of the bf16 compute copy, or -1: none
};

// Floats a parameter of `numel` elements takes in its group's flat buffers: views start on
// 64-byte boundaries so every parameter is aligned for vector loads.
int64_t param_view_span(int64_t numel);
// Floats of each of a group's flat buffers (parameters, gradients, each AdamW moment) holding
// `specs`: what ParamGroup allocates, computed without allocating (titan plan).
int64_t param_group_numel(const std::vector<ParamSpec>& specs);
// HF initialisation of one parameter of `spec` into `p` (its shape's elements): N(0, std) for
// ParamInit::normal, 1 for ones, 0 for zeros (biases), Kaiming-uniform over its columns; from its
// own stream (core/rng.h), so the same bits wherever it is made.
void initialize_param(const ParamSpec& spec, float* p, uint64_t seed, float std);

// Mixed precision: a parameter a model reads only through a bf16 copy it keeps outside the group
// (DecoderLM's compute weights: the matmul weights). Whoever fills the whole group from shards
// (FSDP's all-gather, distributed/fsdp.h) may write the copy -- the parameter rounded to bf16,
// element by element -- and leave the fp32 master unwritten, moving half the bytes.
struct ComputeCopyTarget {
  std::string param;  // its name in the group
  uint16_t* copy;     // numel bf16 values, the parameter's layout
};

// How a use of a parameter group ends (ParamGroupHooks::release, models/causal_lm.h): whether, and
// how soon, the group is used again in this micro-batch -- what a parallelism needs to decide
// whether to keep the unit whole until then (fsdp_reshard_after_forward).
enum class GroupUseEnd {
  last,        // not used again (a forward without gradients: evaluation)
  used_later,  // used again later (a block's forward before its backward; a tied embedding unit
               // before the final norm and loss)
  used_next,   // used again by the model's very next use of any group (the last block's forward,
               // its backward next)
  gradients,   // the use accumulated into the group's gradients, complete for this use
};

// What a use of a parameter group reads (ParamGroupHooks::acquire and prefetch,
// models/causal_lm.h): what a parallelism must bring into the unit for it.
enum class GroupReads {
  // Every parameter as the model keeps it: under bf16 the weights read only in bf16 through their
  // copies, the rest -- a tied embedding too, for its lookup -- as fp32 masters.
  parameters,
  // Under bf16 every parameter with a bf16 copy through that copy only -- a tied embedding used as
  // the lm_head -- and the rest as fp32 masters; under fp32 the same as `parameters`.
  through_copies,
  // No parameter: only the group's gradients are used (the embedding's backward).
  nothing,
};

// parallelism.fsdp_reshard_after_forward: which forward uses leave a unit whole until its next use
// (the backward) instead of handing it back and gathering it again.
enum class ReshardPolicy {
  except_next,  // "default" (torchtitan's): only the unit used again next (the last block)
  always,       // none
  never,        // every unit used again
};
// The policy a config string names; titan::Error naming the key unless default, always or never.
ReshardPolicy parse_reshard_policy(const std::string& policy);
// Whether a use ending `end` keeps the unit whole under `policy`: never after the last use
// (evaluation) or a use that computed gradients.
bool keeps_whole(ReshardPolicy policy, GroupUseEnd end);

class ParamGroup {
 public:
  // Residency::released: the parameters (and later the gradients) start handed back, as FSDP's
  // whole units do between uses; acquire_params commits them. Every buffer of the group is made
  // in `space`: the running device's memory, or the host's for host-side copies of a device's
  // groups (nn/host_params.h).
  ParamGroup(std::string name, const std::vector<ParamSpec>& specs,
             Residency residency = Residency::committed, MemorySpace* space = nullptr);

  const std::string& name() const { return name_; }
  const std::vector<ParamView>& views() const { return views_; }
  const ParamView& view(const std::string& param_name) const;  // titan::Error when absent
  const ParamView* find(const std::string& param_name) const;  // null when absent
  int64_t numel() const { return numel_; }

  // A frozen group (LoRA's base weights, nn/lora.h) is never trained: allocate_gradients and
  // allocate_optimizer_state leave it without gradients and AdamW state, and its modules compute
  // no weight gradients (their gradient pointers stay null).
  void freeze() { frozen_ = true; }
  bool frozen() const { return frozen_; }
  // Gradient and optimizer buffers exist only once requested (inference needs neither); the
  // gradients with the parameters' residency.
  void allocate_gradients();
  void allocate_optimizer_state();
  // Every gradient to zero (before a step's first backward), split over the threads.
  void zero_gradients();

  float* params() const { return params_.as<float>(); }    // (numel)
  float* grads() const { return grads_.as<float>(); }      // (numel) or null
  float* exp_avg() const { return exp_avg_.as<float>(); }  // (numel) or null
  float* exp_avg_sq() const { return exp_avg_sq_.as<float>(); }
  // FSDP (distributed/fsdp.h): the whole parameters or gradients of a unit handed back to the OS
  // while it is not in flight (Buffer::decommit); the views keep their addresses. Acquired again,
  // the gradients read zero (the backward accumulates into them); the parameters are undefined
  // until written, but for the alignment padding between views, zero (the all-gather writes
  // every view).
  void release_params() { params_.decommit(); }
  void release_grads() { grads_.decommit(); }
  // Every view committed, charged and zero-padded.
  void acquire_params();
  // Only the views `held` selects, wherever they lie; the rest stay unbacked and must not be
  // touched until the next release (under bf16 the parameters read through copies elsewhere: FSDP's
  // units in flight, distributed/fsdp.h; bf16 inference's weights, infer/weights.h).
  void acquire_params_where(const std::function<bool(const ParamView&)>& held);
  void acquire_grads();
  bool params_resident() const { return params_.committed(); }
  // Mixed precision: one bf16 copy (raw bits) of each parameter `copied` selects -- what the model
  // computes with -- laid out in view order in one buffer beside the masters (each at its view's
  // copy_offset), with `residency`. The model rounds the masters into it, or FSDP gathers into it
  // (distributed/fsdp.h); like the parameters it may be handed back between uses.
  void allocate_compute_copy(const std::function<bool(const ParamView&)>& copied,
                             Residency residency);
  uint16_t* compute_copy() const { return compute_copy_.as<uint16_t>(); }  // or null
  int64_t compute_copy_numel() const { return compute_copy_numel_; }
  void release_compute_copy() { compute_copy_.decommit(); }
  void acquire_compute_copy() { compute_copy_.recommit(); }
  // Moves the parameters and gradients to new buffers of the same residency, the committed ones'
  // contents kept: what a device whose allocator frees a unit between uses does, so its next use
  // finds it elsewhere. Modules that hold pointers into a group are rebound at its next use
  // (DecoderLM's acquire); nothing else may keep them.
  void move_storage();

  Tensor param(const std::string& param_name) const;
  Tensor grad(const std::string& param_name) const;

  // initialize_param of every parameter (drawn on the host; a device's group receives them in one
  // copy).
  void initialize(uint64_t seed, float std);
  MemorySpace& space() const { return *space_; }

 private:
  std::string name_;
  MemorySpace* space_;
  std::vector<ParamView> views_;
  int64_t numel_ = 0;
  Residency residency_;
  bool frozen_ = false;
  Buffer params_, grads_, exp_avg_, exp_avg_sq_;
  Buffer compute_copy_;
  int64_t compute_copy_numel_ = 0;
};

}  // namespace titan
