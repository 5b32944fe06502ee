// The per-user folder where titan keeps what it derives once per machine: the default tokenizer,
// the CPU's measured peak. TITAN_CACHE_DIR, else $XDG_CACHE_HOME/titan, else ~/.cache/titan.
#pragma once

#include <string>

namespace titan {

// The folder's path (not created); `what` names the user of it in the error when no variable
// gives one.
std::string cache_dir(const char* what);

}  // namespace titan
