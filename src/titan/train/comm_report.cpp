#include "titan/train/comm_report.h"

#include <cmath>
#include <cstdio>

#include "titan/io/byte_size.h"

namespace titan {

std::string comm_report_lines(const GroupCounts& counts, int64_t steps) {
  std::string lines;
  for (const auto& [group, c] : counts) {
    for (int k = 0; k < kCollectiveKinds; ++k) {
      const CollectiveCount& n = c.of[k];
      if (n.calls == 0) continue;
      // Whole numbers: a count that differs between steps (expert parallel's rows follow the
      // routing) is its mean over them, rounded, and the line says so.
      const auto mean = [steps](int64_t total) {
        return static_cast<long long>(
            std::llround(static_cast<double>(total) / static_cast<double>(steps)));
      };
      const bool exact = n.calls % steps == 0 && n.bytes % steps == 0;
      char line[256];
      std::snprintf(line, sizeof line, "  %-13s %-18s %8lld calls %14lld bytes (%s%s)\n",
                    group.c_str(), collective_name(static_cast<Collective>(k)), mean(n.calls),
                    mean(n.bytes), format_byte_size(static_cast<uint64_t>(mean(n.bytes))).c_str(),
                    exact ? "" : "; the steps' mean, rounded");
      lines += line;
    }
  }
  return lines;
}

}  // namespace titan
