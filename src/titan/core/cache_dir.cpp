#include "titan/core/cache_dir.h"

#include <cstdlib>

#include "titan/core/error.h"

namespace titan {

std::string cache_dir(const char* what) {
  const auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v != nullptr ? v : "");
  };
  if (!env("TITAN_CACHE_DIR").empty()) return env("TITAN_CACHE_DIR");
  if (!env("XDG_CACHE_HOME").empty()) return env("XDG_CACHE_HOME") + "/titan";
  TITAN_CHECK(!env("HOME").empty(), "no cache folder for ", what,
              ": set TITAN_CACHE_DIR (or HOME or XDG_CACHE_HOME)");
  return env("HOME") + "/.cache/titan";
}

}  // namespace titan
