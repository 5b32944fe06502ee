// DecoderLM's parameter units in use: their bf16 compute copies (laid out, refreshed from the
// masters, or held as the weights themselves) and the acquire / prefetch / release protocol around
// every use of a group (ParamGroupHooks: FSDP's gathers and reduce-scatters attach there).
#include <cstring>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "titan/backend/backend.h"
#include "titan/core/error.h"
#include "titan/dispatch/device_ops.h"
#include "titan/models/decoder_lm.h"

namespace titan {

void DecoderLM::allocate_compute_weights(Residency head_residency) {
  // Each weight read through a copy, by parameter name, with the module's pointer to its copy.
  // The lm_head's weight is the embedding's when tied: its copy serves the head.
  std::unordered_map<std::string, const uint16_t**> module_copy;
  for (Linear* w : m_.matmul_linears()) {
    const std::string weight = w == &m_.lm_head && args_.tie_word_embeddings
                                   ? m_.embed_tokens.name + ".weight"
                                   : w->name + ".weight";
    module_copy.emplace(weight, &w->weight_bf16);
  }
  for (DecoderLayer& l : m_.layers) {
    if (!l.sparse) continue;
    SparseMoeBlock& moe = l.moe;  // the router (moe.gate) stays fp32
    const std::string experts = moe.name + ".experts.";
    module_copy.emplace(experts + "gate_proj", &moe.weights_bf16.gate);
    module_copy.emplace(experts + "up_proj", &moe.weights_bf16.up);
    module_copy.emplace(experts + "down_proj", &moe.weights_bf16.down);
  }
  int64_t largest_block = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    ParamGroup& unit = groups_[g];
    const bool head = static_cast<int64_t>(g) == head_group_;
    unit.allocate_compute_copy(
        [&](const ParamView& v) { return module_copy.count(v.spec.name) > 0; },
        head ? head_residency : Residency::released);
    if (!head) largest_block = std::max(largest_block, unit.compute_copy_numel());
    for (const ParamView& v : unit.views()) {
      if (v.copy_offset < 0) continue;
      uint16_t* copy = unit.compute_copy() + v.copy_offset;
      const uint16_t** module = module_copy.at(v.spec.name);
      *module = copy;
      compute_copies_.push_back({v.offset, copy, copy, module, v.numel, static_cast<int64_t>(g),
                                 v.spec.name == m_.embed_tokens.name + ".weight"});
    }
  }
  block_in_flight_ =
      Buffer(backend().memory(), static_cast<size_t>(largest_block) * sizeof(uint16_t),
             MemCategory::parameters, Residency::released);
}

void DecoderLM::bind_compute_copies(int64_t group, uint16_t* base) {
  const uint16_t* own = groups_[static_cast<size_t>(group)].compute_copy();
  for (ComputeCopy& c : compute_copies_) {
    if (c.group != group) continue;
    c.bound = base + (c.copy - own);
    *c.module_copy = c.bound;
  }
}

bool DecoderLM::read_only_in_bf16(const std::string& name) {
  const auto ends_with = [&](std::string_view tail) {
    return name.size() >= tail.size() &&
           name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  return ends_with("_proj.weight") || ends_with(".experts.gate_proj") ||
         ends_with(".experts.up_proj") || ends_with(".experts.down_proj") ||
         name == "lm_head.weight";
}

void DecoderLM::refresh_compute_weights(int64_t group, bool all) {
  std::vector<Bf16Cast> casts;  // one launch on a GPU
  for (const ComputeCopy& c : compute_copies_) {
    if (group >= 0 && c.group != group) continue;
    if (!all && !c.master_read) continue;
    casts.push_back({c.bound, master_of(c), c.numel});
  }
  device_ops().round_to_bf16_all(casts);
}

std::vector<std::vector<ComputeCopyTarget>> DecoderLM::copy_targets(bool with_master_read) {
  std::vector<std::vector<ComputeCopyTarget>> targets(groups_.size());
  for (const ComputeCopy& c : compute_copies_) {
    if (c.master_read && !with_master_read) continue;
    const ParamGroup& g = groups_[static_cast<size_t>(c.group)];
    const int64_t at = c.master_offset;
    for (const ParamView& v : g.views()) {
      if (v.offset != at) continue;
      // The one list of what is read only in bf16, which the plan reads too.
      TITAN_CHECK(c.master_read || read_only_in_bf16(v.spec.name), "model: ", v.spec.name,
                  " has a bf16 copy but is not listed as read only in bf16");
      targets[static_cast<size_t>(c.group)].push_back({v.spec.name, c.copy});
    }
  }
  return targets;
}

std::vector<std::vector<ComputeCopyTarget>> DecoderLM::bf16_only_params() {
  return copy_targets(false);
}

std::vector<std::vector<ComputeCopyTarget>> DecoderLM::copied_params() {
  return copy_targets(true);
}

std::vector<std::vector<ComputeCopyTarget>> DecoderLM::hold_compute_copies(bool lookup_in_bf16) {
  TITAN_CHECK(compute_dtype_ == DType::bf16,
              "model: bf16 copies held as the weights of a model computing in ",
              dtype_name(compute_dtype_));
  TITAN_CHECK(!hooks_.acquire && groups_[0].grads() == nullptr,
              "model: bf16 copies held as the weights of a model under parameter-group hooks or "
              "with gradients");
  copies_held_ = true;
  for (size_t g = 0; g < groups_.size(); ++g) {
    groups_[g].acquire_compute_copy();
    bind_compute_copies(static_cast<int64_t>(g), groups_[g].compute_copy());
  }
  block_in_flight_ = Buffer();
  std::vector<std::vector<ComputeCopyTarget>> targets = copied_params();
  Embedding& embed = m_.embed_tokens;
  if (!lookup_in_bf16) return targets;
  if (args_.tie_word_embeddings) {
    embed.weight_bf16 = m_.lm_head.weight_bf16;
    return targets;
  }
  embedding_bf16_ =
      Buffer(backend().memory(), static_cast<size_t>(embed.vocab * embed.dim) * sizeof(uint16_t),
             MemCategory::parameters);
  embed.weight_bf16 = embedding_bf16_.as<uint16_t>();
  targets[0].push_back({embed.name + ".weight", embedding_bf16_.as<uint16_t>()});
  return targets;
}

const float* DecoderLM::master_of(const ComputeCopy& c) const {
  return groups_[static_cast<size_t>(c.group)].params() + c.master_offset;
}

void DecoderLM::record_group_pointers() {
  group_pointers_.assign(groups_.size(), {});
  bound_storage_.assign(groups_.size(), {nullptr, nullptr});
  m_.for_each_group_pointer([&](auto& pointer, bool gradient) {
    if (pointer == nullptr) return;
    for (size_t g = 0; g < groups_.size(); ++g) {
      const float* base = gradient ? groups_[g].grads() : groups_[g].params();
      if (base == nullptr || pointer < base || pointer >= base + groups_[g].numel()) continue;
      using Pointee = std::remove_pointer_t<std::remove_reference_t<decltype(pointer)>>;
      group_pointers_[g].push_back(
          {static_cast<void*>(&pointer), std::is_const_v<Pointee>, gradient, pointer - base});
      return;
    }
    fail("model: a module's ", gradient ? "gradient" : "parameter",
         " pointer lies outside every parameter group");
  });
  for (size_t g = 0; g < groups_.size(); ++g) {
    bound_storage_[g] = {groups_[g].params(), groups_[g].grads()};
  }
}

void DecoderLM::rebind_if_moved(int64_t group) {
  const auto g = static_cast<size_t>(group);
  const ParamGroup& unit = groups_[g];
  if (bound_storage_[g] ==
      std::make_pair<const float*, const float*>(unit.params(), unit.grads())) {
    return;
  }
  for (const GroupPointer& p : group_pointers_[g]) {
    float* at = (p.gradient ? unit.grads() : unit.params()) + p.offset;
    if (p.is_const) {
      *static_cast<const float**>(p.pointer) = at;
    } else {
      *static_cast<float**>(p.pointer) = at;
    }
  }
  bound_storage_[g] = {unit.params(), unit.grads()};
}

void DecoderLM::acquire(int64_t group, bool gradients, GroupReads reads) {
  const auto g = static_cast<size_t>(group);
  if (!hooks_.acquire) {
    rebind_if_moved(group);
    // One process: a block's bf16 copies are made at each use, as under FSDP, in the one buffer
    // every block's share. The [norm, lm_head] unit's are made at the forward's start and kept.
    // Copies held as the weights are already bound in place.
    if (compute_copies_.empty() || reads == GroupReads::nothing || copies_held_) return;
    if (group == head_group_ || groups_[g].compute_copy_numel() == 0) return;
    block_in_flight_.recommit();
    bind_compute_copies(group, block_in_flight_.as<uint16_t>());
    refresh_compute_weights(group);
    return;
  }
  const bool prefetched = prefetched_ == group;
  if (prefetched) prefetched_ = -1;
  if (!reads_copies(group, reads)) {
    hooks_.acquire(group, gradients, reads);
    rebind_if_moved(group);
    return;
  }
  // Copies the acquire fills come from a gather (all of them for a use through_copies): a unit
  // kept whole since its last use kept those, and its masters of them were never written. A unit
  // kept since a use that read its parameters has its other copies (a tied embedding's) rounded
  // from its masters when a use through_copies first reads them. (A prefetched unit is resident
  // too, but its gather is filling them.)
  const bool kept = groups_[g].params_resident() && !prefetched;
  groups_[g].acquire_compute_copy();  // the acquire may write them
  bind_compute_copies(group, groups_[g].compute_copy());
  hooks_.acquire(group, gradients, reads);
  rebind_if_moved(group);
  if (!hooks_.fills_compute_copies) {
    refresh_compute_weights(group);
  } else if (kept && reads == GroupReads::through_copies) {
    refresh_compute_weights(group, false);
  }
}

bool DecoderLM::reads_copies(int64_t group, GroupReads reads) const {
  // A use through_copies reads every copy of the group; one reading its parameters only the
  // copies of the weights read only in bf16 (a tied embedding's copy serves the loss, not the
  // lookup). A use that reads none brings none: its copies are not touched.
  return std::any_of(compute_copies_.begin(), compute_copies_.end(), [&](const ComputeCopy& c) {
    return c.group == group && (reads == GroupReads::through_copies ||
                                (reads == GroupReads::parameters && !c.master_read));
  });
}

void DecoderLM::prefetch(int64_t group, GroupReads reads) {
  if (!hooks_.prefetch) return;
  const auto g = static_cast<size_t>(group);
  if (reads != GroupReads::nothing && !groups_[g].params_resident()) {
    prefetched_ = group;
    if (reads_copies(group, reads)) {
      groups_[g].acquire_compute_copy();
      bind_compute_copies(group, groups_[g].compute_copy());
    }
  }
  hooks_.prefetch(group, reads);
}

void DecoderLM::release(int64_t group, GroupUseEnd end) {
  const auto g = static_cast<size_t>(group);
  if (!hooks_.release) return;  // one process: block_in_flight_ stays committed
  hooks_.release(group, end);
  if (compute_copies_.empty()) return;
  if (!hooks_.fills_compute_copies || !groups_[g].params_resident()) {
    groups_[g].release_compute_copy();
  }
}

}  // namespace titan
