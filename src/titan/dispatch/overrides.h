// The override map: config patterns (`model.layers.*.mlp = "swiglu_reference"`) rebinding
// module kernel slots. Expanded and validated before anything is allocated.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "titan/dispatch/registry.h"

namespace titan {

// One op slot of one module: model.layers.3.self_attn has an attention slot and a rope slot.
struct KernelSlot {
  std::string module;  // fully qualified module name
  OpKind kind;
  std::string kernel;                   // bound kernel name
  DType dtype = DType::f32;             // of the inputs and weights the module hands its kernel
  DeviceKind device = DeviceKind::cpu;  // where the module's tensors live
};

struct OverrideRule {
  std::string pattern;  // glob over module names; '*' may cross dots (fnmatch without FNM_PATHNAME)
  std::string kernel;
};

struct OverrideReport {
  std::vector<std::string> applied;   // "module: old -> new", one per rebound slot
  std::vector<std::string> warnings;  // rules that matched no slot
};

bool glob_match(std::string_view pattern, std::string_view text);

// Rebinds matching slots in place. Errors (titan::Error): an unknown kernel; a rule naming
// modules none of which has a slot of its kernel's kind (`*.mlp.experts = "swiglu"`); two rules
// claiming the same slot; a rule claiming an ancestor module of another rule's module; a slot
// (rebound or not) whose dtype its kernel does not accept.
OverrideReport apply_overrides(std::vector<KernelSlot>& slots,
                               const std::vector<OverrideRule>& rules,
                               const KernelRegistry& registry);

// Every attention and experts slot's kernel checked against the shapes a step hands it
// (require_constraints): a broken constraint is a titan::Error naming the module.
void require_slot_constraints(const std::vector<KernelSlot>& slots, const KernelRegistry& registry,
                              const AttentionShape& attention, const ExpertsShape& experts);

}  // namespace titan
