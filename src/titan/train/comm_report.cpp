#include "titan/train/comm_report.h"

#include <cstdio>

#include "titan/io/byte_size.h"

namespace titan {

std::string comm_report_lines(const GroupCounts& counts, int64_t steps) {
  std::string lines;
  const auto per_step = static_cast<double>(steps);
  for (const auto& [group, c] : counts) {
    for (int k = 0; k < kCollectiveKinds; ++k) {
      const CollectiveCount& n = c.of[k];
      if (n.calls == 0) continue;
      const double bytes = static_cast<double>(n.bytes) / per_step;
      char line[256];
      // %.17g: a whole number prints whole; a count that differs between steps shows its mean.
      std::snprintf(line, sizeof line, "  %-13s %-18s %8.17g calls %14.17g bytes (%s)\n",
                    group.c_str(), collective_name(static_cast<Collective>(k)),
                    static_cast<double>(n.calls) / per_step, bytes,
                    format_byte_size(static_cast<uint64_t>(bytes)).c_str());
      lines += line;
    }
  }
  return lines;
}

}  // namespace titan
