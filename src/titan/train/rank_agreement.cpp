#include "titan/train/rank_agreement.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "titan/core/error.h"

namespace titan {
namespace {

constexpr const char* kBinaryKey = "the titan binary";

std::string key_of(const std::string& line) {
  const size_t eq = line.find(" = ");
  return eq == std::string::npos ? line : line.substr(0, eq);
}

std::string value_of(const std::string& line) {
  const size_t eq = line.find(" = ");
  return eq == std::string::npos ? std::string("(none)") : line.substr(eq + 3);
}

// At most 120 bytes of a value in a message.
std::string shown(const std::string& value) {
  return value.size() <= 120 ? value : value.substr(0, 120) + "...";
}

// A line as shown(), "none" for no line.
std::string line_or_none(const std::string& line) {
  return line.empty() ? std::string("none") : shown(line);
}

// Rank `root`'s `text` on every rank (the others' `text` is ignored), a byte per float (exact).
std::string broadcast_text(Communicator& world, const std::string& text, int root) {
  float size = world.rank() == root ? static_cast<float>(text.size()) : 0.0f;
  world.broadcast(&size, 1, root);
  std::vector<float> bytes(static_cast<size_t>(size));
  if (world.rank() == root) {
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(text[i]);
  }
  world.broadcast(bytes.data(), static_cast<int64_t>(bytes.size()), root);
  std::string out(bytes.size(), '\0');
  for (size_t i = 0; i < bytes.size(); ++i) out[i] = static_cast<char>(static_cast<int>(bytes[i]));
  return out;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace

std::vector<std::string> job_config_lines(const JobConfig& config) {
  std::vector<std::string> lines;
  std::string section;
  for (const std::string& line : split_lines(job_config_to_toml(config))) {
    if (line.empty()) continue;
    if (line.front() == '[' && line.back() == ']') {
      section = line.substr(1, line.size() - 2);
      continue;
    }
    lines.push_back(section.empty() ? line : section + "." + line);
  }
  return lines;
}

std::string binary_fingerprint() {
  std::ifstream in("/proc/self/exe", std::ios::binary);
  if (!in) return std::string("unreadable (/proc/self/exe: ") + std::strerror(errno) + ")";
  uint64_t h = 1469598103934665603ull;
  uint64_t bytes = 0;
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const auto got = static_cast<size_t>(in.gcount());
    for (size_t i = 0; i < got; ++i) {
      h = (h ^ static_cast<unsigned char>(buffer[i])) * 1099511628211ull;
    }
    bytes += got;
  }
  char text[64];
  std::snprintf(text, sizeof(text), "%016llx (%llu bytes)", static_cast<unsigned long long>(h),
                static_cast<unsigned long long>(bytes));
  return text;
}

std::string first_difference(const std::vector<std::string>& mine,
                             const std::vector<std::string>& rank0) {
  const size_t n = std::max(mine.size(), rank0.size());
  for (size_t i = 0; i < n; ++i) {
    const std::string a = i < mine.size() ? mine[i] : std::string();
    const std::string b = i < rank0.size() ? rank0[i] : std::string();
    if (a == b) continue;
    const std::string key = key_of(a.empty() ? b : a);
    if (key_of(a) != key_of(b)) {  // the key sets differ ([overrides] rules)
      return detail::concat("has ", line_or_none(a), " where rank 0 has ", line_or_none(b));
    }
    if (key == kBinaryKey) {
      return detail::concat("runs another titan binary (fingerprint ", value_of(a), ", rank 0's ",
                            value_of(b), "): run the same build on every rank");
    }
    return detail::concat("has ", key, " = ", shown(value_of(a)), ", rank 0 has ",
                          shown(value_of(b)));
  }
  return {};
}

void check_ranks_agree(Communicator& world, const JobConfig& config) {
  if (world.size() == 1) return;
  std::vector<std::string> mine = {std::string(kBinaryKey) + " = " + binary_fingerprint()};
  for (std::string& line : job_config_lines(config)) mine.push_back(std::move(line));
  std::string text;
  for (const std::string& line : mine) text += line + "\n";
  const std::vector<std::string> rank0 = split_lines(broadcast_text(world, text, 0));
  const std::string difference = first_difference(mine, rank0);
  // The lowest rank that differs (the max of size - rank over those that do), and how many do.
  double found[2] = {difference.empty() ? 0.0 : static_cast<double>(world.size() - world.rank()),
                     difference.empty() ? 0.0 : 1.0};
  world.all_reduce_max(found, 1);
  world.all_reduce_sum(found + 1, 1);
  if (found[0] == 0.0) return;
  const int first = world.size() - static_cast<int>(found[0]);
  const std::string what = broadcast_text(world, difference, first);
  fail_job_wide("ranks disagree: rank ", first, " ", what, " (", static_cast<int>(found[1]), " of ",
                world.size(),
                " ranks differ from rank 0; every rank must run the same binary and config)");
}

}  // namespace titan
