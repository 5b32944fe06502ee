// The trainer's end-of-run report of what the mesh's collectives moved inside its steps (measured
// by the communicators, distributed/comm_counts.h), per step, group by group: the lines
// `titan plan`'s communication table predicts (train/training_plan.h CommRow).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "titan/distributed/comm_counts.h"

namespace titan {

using GroupCounts = std::vector<std::pair<std::string, CommCounts>>;

// One line per group and collective with calls: "  tp  all_reduce  <calls> calls  <bytes> bytes
// (<size>)", the counts divided by `steps` as whole numbers (a mean that is not whole rounded,
// "; the steps' mean, rounded" after the size); none for groups that moved nothing.
std::string comm_report_lines(const GroupCounts& counts, int64_t steps);

}  // namespace titan
