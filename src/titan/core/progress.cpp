#include "titan/core/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <exception>

#include "titan/core/clock.h"

namespace titan {
namespace {

std::mutex& output_mutex() {
  static std::mutex m;
  return m;
}

ProgressOutput& output_setting() {
  static ProgressOutput out = [] {
    ProgressOutput o;
    o.terminal = ::isatty(STDERR_FILENO) != 0;
    return o;
  }();
  return out;
}

constexpr double kRedrawInterval = 0.1;  // seconds between terminal redraws
constexpr int kBarWidth = 24;

}  // namespace

ProgressOutput progress_output() {
  std::lock_guard<std::mutex> lock(output_mutex());
  return output_setting();
}

void set_progress_output(const ProgressOutput& output) {
  std::lock_guard<std::mutex> lock(output_mutex());
  output_setting() = output;
}

std::string format_quantity(double value, ProgressUnit unit) {
  static const char* const kPrefixes[] = {"", "k", "M", "G", "T"};
  int p = 0;
  while (std::fabs(value) >= 1000.0 && p < 4) {
    value /= 1000.0;
    ++p;
  }
  char number[32];
  if (p == 0 && value == std::floor(value)) {
    std::snprintf(number, sizeof number, "%.0f", value);
  } else if (p == 0) {  // a rate below 1000 per second
    std::snprintf(number, sizeof number, value < 10.0 ? "%.2f" : "%.1f", value);
  } else {
    std::snprintf(number, sizeof number,
                  value < 10.0    ? "%.2f"
                  : value < 100.0 ? "%.1f"
                                  : "%.0f",
                  value);
  }
  if (unit == ProgressUnit::bytes) return std::string(number) + " " + kPrefixes[p] + "B";
  const std::string prefix = p == 0 ? "" : std::string(kPrefixes[p]) + " ";
  const char* name = unit == ProgressUnit::tokens    ? "tokens"
                     : unit == ProgressUnit::batches ? "batches"
                                                     : "items";
  return std::string(number) + " " + prefix + name;
}

Progress::Progress(std::string label, int64_t total, ProgressUnit unit)
    : label_(std::move(label)),
      total_(total),
      unit_(unit),
      out_(progress_output()),
      start_s_(now_seconds()),
      uncaught_at_start_(std::uncaught_exceptions()) {
  if (out_.stream == nullptr) out_.stream = stderr;
}

Progress::~Progress() {
  if (std::uncaught_exceptions() > uncaught_at_start_) {
    abandon();
  } else {
    finish();
  }
}

void Progress::abandon() {
  std::lock_guard<std::mutex> lock(draw_mutex_);
  if (finished_) return;
  finished_ = true;
  if (shown_ && out_.terminal) {
    std::fputc('\n', out_.stream);
    std::fflush(out_.stream);
  }
}

void Progress::advance(int64_t n) {
  done_.fetch_add(n, std::memory_order_relaxed);
  report(false);
}

void Progress::finish() {
  report(true);
}

std::string Progress::describe(int64_t done, double elapsed, bool final_line) const {
  const double rate = elapsed > 0.0 ? static_cast<double>(done) / elapsed : 0.0;
  char tail[64];
  if (final_line) {
    std::snprintf(tail, sizeof tail, " in %.1f s (%s/s)", elapsed,
                  format_quantity(rate, unit_).c_str());
    return label_ + ": " + format_quantity(static_cast<double>(done), unit_) + tail;
  }
  std::string line = label_;
  if (total_ > 0) {
    const double fraction = std::min(1.0, static_cast<double>(done) / static_cast<double>(total_));
    const int filled = static_cast<int>(fraction * kBarWidth);
    line += " [" + std::string(static_cast<size_t>(filled), '#') +
            std::string(static_cast<size_t>(kBarWidth - filled), '.') + "]";
    char percent[16];
    std::snprintf(percent, sizeof percent, " %3.0f%%", 100.0 * fraction);
    line += percent;
    line += "  " + format_quantity(static_cast<double>(done), unit_) + " / " +
            format_quantity(static_cast<double>(total_), unit_);
  } else {
    line += "  " + format_quantity(static_cast<double>(done), unit_);
  }
  std::snprintf(tail, sizeof tail, "  %s/s  %.0f s", format_quantity(rate, unit_).c_str(), elapsed);
  return line + tail;
}

void Progress::report(bool final_line) {
  // Workers of a parallel load must never wait on the drawing thread.
  std::unique_lock<std::mutex> lock(draw_mutex_, std::defer_lock);
  if (final_line) {
    lock.lock();
  } else if (!lock.try_lock()) {
    return;
  }
  if (finished_) return;
  const double now = now_seconds(), elapsed = now - start_s_;
  const int64_t done = done_.load(std::memory_order_relaxed);
  if (final_line) {
    finished_ = true;
    if (!shown_ && elapsed < out_.show_after_s) return;
    const std::string text = describe(done, elapsed, true);
    std::fprintf(out_.stream, out_.terminal ? "\r\033[K%s\n" : "%s\n", text.c_str());
    std::fflush(out_.stream);
    return;
  }
  if (elapsed < out_.show_after_s) return;
  const double interval = out_.terminal ? kRedrawInterval : out_.plain_interval_s;
  if (shown_ && now - last_draw_s_ < interval) return;
  const std::string text = describe(done, elapsed, false);
  std::fprintf(out_.stream, out_.terminal ? "\r\033[K%s" : "%s\n", text.c_str());
  std::fflush(out_.stream);
  shown_ = true;
  last_draw_s_ = now;
}

}  // namespace titan
