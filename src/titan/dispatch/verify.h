// `titan verify-kernels`: every form of a registered kernel (forward, backward, and the bf16 forms
// it declares) run on small random inputs and compared with the plain fp32 reference of its op
// (the *_reference functions in src/titan/ops, fp64 sums), as the seeds check a custom kernel
// against the baseline with float32 inputs before it replaces a module.
//
// The comparison is normwise: the largest |kernel - reference| over an output, divided by the
// largest |reference|. It catches what a wrong kernel gets wrong (an index, a term, a scale, a
// sign, a dtype: errors of order one); the last bits of the built-in kernels are held by their
// unit tests, not here.
#pragma once

#include <string>
#include <vector>

#include "titan/dispatch/registry.h"

namespace titan {

// One output of one form of a kernel against the reference.
struct KernelCheck {
  std::string form;    // "forward", "backward", "forward_bf16", ...
  std::string output;  // the output compared: "y", "dx", "dweight", ...
  double error = 0.0;  // normwise; +inf when the kernel wrote a NaN or an infinity
  double tolerance = 0.0;
  bool passed() const { return error <= tolerance; }
};

struct KernelReport {
  std::string kernel;
  OpKind kind = OpKind::linear;
  std::vector<KernelCheck> checks;
  bool passed() const;
};

// Checks every form `entry` has. A kernel that throws on the inputs is a titan::Error naming it.
KernelReport verify_kernel(const KernelEntry& entry);

}  // namespace titan
