// What a test reads of a refusal: the message of the titan::Error a call throws.
#pragma once

#include <functional>
#include <string>

#include "titan/core/error.h"

namespace titan::test {

// The message of the titan::Error that f throws, or "no error" when it throws none (which then
// differs from any message a test expects).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace titan::test
