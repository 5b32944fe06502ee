// A status line for operations that can take more than a few seconds: loading or saving a
// checkpoint, exporting a model folder, training a tokenizer, tokenising a dataset.
//
// On a terminal it redraws one line in place (label, bar, done / total, rate, elapsed) at most
// ten times a second; in a log or a pipe it writes plain lines instead -- one every
// `plain_interval_s` while the operation runs and one when it ends. Either way nothing is written
// for an operation that ends before `show_after_s`, so quick ones stay silent.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace titan {

struct ProgressOutput {
  std::FILE* stream = nullptr;  // null: stderr
  bool terminal = false;        // redraw in place (a TTY) or plain lines
  double show_after_s = 1.0;
  double plain_interval_s = 30.0;
};

// The default is stderr, in terminal mode exactly when stderr is a TTY.
ProgressOutput progress_output();
void set_progress_output(const ProgressOutput& output);

enum class ProgressUnit { bytes, items, tokens, batches };

class Progress {
 public:
  // total 0: unknown (no bar, no percentage).
  Progress(std::string label, int64_t total, ProgressUnit unit);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Safe to call from several threads.
  void advance(int64_t n);
  // Writes the closing line (when anything was shown or the operation ran long); idempotent.
  void finish();

 private:
  // Unwinding past an operation that failed: no closing line claiming it ended, only the
  // redrawn terminal line ended so the error prints on a line of its own.
  void abandon();
  void report(bool final_line);
  std::string describe(int64_t done, double elapsed, bool final_line) const;

  std::string label_;
  int64_t total_;
  ProgressUnit unit_;
  ProgressOutput out_;
  double start_s_;
  std::atomic<int64_t> done_{0};
  std::mutex draw_mutex_;
  double last_draw_s_ = 0.0;
  bool shown_ = false;
  bool finished_ = false;
  int uncaught_at_start_;
};

// "1.19 GB", "512 MB", "310 items", "1.20 M tokens": the numbers Progress prints.
std::string format_quantity(double value, ProgressUnit unit);

}  // namespace titan
