#include "titan/core/clock.h"

#include <cmath>
#include <cstdio>

namespace titan {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  char buf[48];
  if (seconds < 60) {
    std::snprintf(buf, sizeof buf, "%.1fs", seconds);
    return buf;
  }
  const long long whole = std::llround(seconds);
  if (whole < 3600) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", whole / 60, whole % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm%02llds", whole / 3600, whole / 60 % 60,
                  whole % 60);
  }
  return buf;
}

}  // namespace titan
