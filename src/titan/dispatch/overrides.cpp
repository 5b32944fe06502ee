#include "titan/dispatch/overrides.h"

#include <algorithm>
#include <map>

#include "titan/core/error.h"

namespace titan {
namespace {

bool is_ancestor(const std::string& ancestor, const std::string& module) {
  return module.size() > ancestor.size() && module.compare(0, ancestor.size(), ancestor) == 0 &&
         module[ancestor.size()] == '.';
}

}  // namespace

bool glob_match(std::string_view pattern, std::string_view text) {
  // Iterative wildcard matching with one backtrack point per '*'.
  size_t p = 0, t = 0, star = std::string_view::npos, resume = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

OverrideReport apply_overrides(std::vector<KernelSlot>& slots,
                               const std::vector<OverrideRule>& rules,
                               const KernelRegistry& registry) {
  OverrideReport report;
  std::map<size_t, size_t> claimed_by;                          // slot index -> rule index
  std::vector<std::pair<std::string, size_t>> claimed_modules;  // (module, rule index)
  for (size_t r = 0; r < rules.size(); ++r) {
    const OverrideRule& rule = rules[r];
    const KernelEntry* entry = registry.find(rule.kernel);
    TITAN_CHECK(entry != nullptr, "override '", rule.pattern, "' = '", rule.kernel,
                "': no kernel of that name is registered");
    size_t matched = 0;
    for (size_t s = 0; s < slots.size(); ++s) {
      if (slots[s].kind != entry->kind || !glob_match(rule.pattern, slots[s].module)) continue;
      const auto [it, inserted] = claimed_by.emplace(s, r);
      TITAN_CHECK(inserted, "overrides '", rules[it->second].pattern, "' and '", rule.pattern,
                  "' both claim the ", op_kind_name(entry->kind), " of ", slots[s].module);
      claimed_modules.emplace_back(slots[s].module, r);
      ++matched;
    }
    if (matched == 0) {
      // A module the pattern names, but without a slot of this kernel's kind: a wrong kernel.
      for (const KernelSlot& slot : slots) {
        if (!glob_match(rule.pattern, slot.module)) continue;
        std::string kinds;
        for (const KernelSlot& other : slots) {
          if (other.module == slot.module) {
            kinds += (kinds.empty() ? "" : ", ") + std::string(op_kind_name(other.kind));
          }
        }
        fail("override '", rule.pattern, "' = '", rule.kernel, "': '", rule.kernel, "' is a ",
             op_kind_name(entry->kind), " kernel but ", slot.module, " has no ",
             op_kind_name(entry->kind), " slot (its slots: ", kinds, ")");
      }
      report.warnings.push_back("override '" + rule.pattern + "' = '" + rule.kernel +
                                "' matches no module with a " + op_kind_name(entry->kind) +
                                " slot");
    }
  }
  for (const auto& [a, rule_a] : claimed_modules) {
    for (const auto& [b, rule_b] : claimed_modules) {
      TITAN_CHECK(rule_a == rule_b || !is_ancestor(a, b), "override '", rules[rule_a].pattern,
                  "' claims ", a, ", an ancestor of ", b, " claimed by override '",
                  rules[rule_b].pattern, "'");
    }
  }
  for (const auto& [s, r] : claimed_by) {
    report.applied.push_back(slots[s].module + ": " + slots[s].kernel + " -> " + rules[r].kernel);
    slots[s].kernel = rules[r].kernel;
  }
  for (const KernelSlot& slot : slots) {
    const KernelEntry& entry = registry.get(slot.kernel, slot.kind);
    TITAN_CHECK(entry.device == slot.device, slot.module, ": ", op_kind_name(slot.kind),
                " kernel '", slot.kernel, "' runs on ", device_kind_name(entry.device),
                ", the model on ", device_kind_name(slot.device));
    if (std::find(entry.dtypes.begin(), entry.dtypes.end(), slot.dtype) != entry.dtypes.end()) {
      continue;
    }
    std::string accepted;
    for (DType t : entry.dtypes)
      accepted += (accepted.empty() ? "" : ", ") + std::string(dtype_name(t));
    fail(slot.module, ": ", op_kind_name(slot.kind), " kernel '", slot.kernel, "' takes ", accepted,
         ", the module needs ", dtype_name(slot.dtype));
  }
  return report;
}

void require_slot_constraints(const std::vector<KernelSlot>& slots, const KernelRegistry& registry,
                              const AttentionShape& attention, const ExpertsShape& experts) {
  for (const KernelSlot& slot : slots) {
    if (slot.kind == OpKind::attention) {
      require_constraints(slot.module, slot.kernel,
                          std::get<AttentionKernel>(registry.get(slot.kernel, slot.kind).impl),
                          attention);
    } else if (slot.kind == OpKind::experts) {
      require_constraints(slot.module, slot.kernel,
                          std::get<ExpertsKernel>(registry.get(slot.kernel, slot.kind).impl),
                          experts);
    }
  }
}

}  // namespace titan
