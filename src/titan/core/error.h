// Errors: exceptions inside the library, one line and a non-zero exit at the edge (apps/titan).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace titan {

// Every bad input ends as one of these; the message is the whole line the user sees.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(detail::concat(args...));
}

// Raised alike on every rank from what they all know (a collective's result, such as ranks that
// disagree): rank 0 reports it for the job and the others leave the line to it, so the job prints
// it once however slowly rank 0's abort reaches them.
class JobWideError : public Error {
 public:
  using Error::Error;
};

template <typename... Args>
[[noreturn]] void fail_job_wide(const Args&... args) {
  throw JobWideError(detail::concat(args...));
}

}  // namespace titan

// TITAN_CHECK(cond, "what", value, "where") throws titan::Error with the concatenated message.
#define TITAN_CHECK(cond, ...)               \
  do {                                       \
    if (!(cond)) ::titan::fail(__VA_ARGS__); \
  } while (0)
