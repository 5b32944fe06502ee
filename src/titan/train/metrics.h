// The per-step training log, as torchtitan prints it: step N/total, loss, grad norm, memory,
// tokens/s, TFLOP/s, MFU, step and data time, and the estimated time to the last step; the same
// fields appended as one JSON object per logged step to the metrics.save_jsonl file and, with
// metrics.enable_tensorboard, as scalars under torchtitan's tags to a TensorBoard event file
// (train/tensorboard.h); a summary at the end with the total time. Memory is the accounted
// allocator's (core/allocator.h), the maximum over the job's ranks of each figure.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "titan/core/allocator.h"
#include "titan/distributed/communicator.h"
#include "titan/train/tensorboard.h"

namespace titan {

struct StepMetrics {
  int64_t step = 0;
  double loss = 0.0;       // mean over the global batch's scored tokens
  double grad_norm = 0.0;  // before clipping
  double lr = 0.0;
  int64_t tokens = 0;  // tokens this rank processed in the step
  double step_time_s = 0.0;
  double data_time_s = 0.0;  // of step_time_s, waiting for batches
};

class MetricsLogger {
 public:
  // peak_gflops: the device peak MFU is measured against; last_step: the run's last step (the
  // "step N/total" and the ETA); jsonl_path "" writes no file; tensorboard_dir "" writes no event
  // file; ranks: the job's ranks, over which memory is the maximum (every rank calls record and
  // print_summary alike; null: this process alone).
  MetricsLogger(double flops_per_token, double peak_gflops, int64_t last_step,
                const std::string& jsonl_path, const std::string& tensorboard_dir,
                Communicator* ranks = nullptr);
  ~MetricsLogger();
  MetricsLogger(const MetricsLogger&) = delete;
  MetricsLogger& operator=(const MetricsLogger&) = delete;

  // Counts every step in the summary; prints (and appends) it when `print` (log_freq). The first
  // step is marked as warm-up and left out of the summary's rates.
  void record(const StepMetrics& m, bool print);
  // A validation pass's result.
  void log_validation(int64_t step, double loss, int64_t tokens);
  // Totals since construction, excluding the first step (warm-up); the total time includes it.
  void print_summary() const;

 private:
  // This rank's memory figures, each raised to its maximum over the ranks.
  MemoryStats max_memory_stats() const;

  // Seconds to the last step at the pace since the first (warm-up) step ended -- everything the
  // loop does between steps included: validation, checkpoints -- or the first step's pace before.
  double eta_seconds(const StepMetrics& m) const;

  double flops_per_token_;
  double peak_gflops_;
  int64_t last_step_ = 0;
  double start_time_ = 0.0;      // now_seconds() at construction
  double first_step_end_ = 0.0;  // now_seconds() when the first step was recorded
  int64_t first_step_ = 0;
  std::FILE* jsonl_ = nullptr;
  std::string jsonl_path_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  Communicator* ranks_ = nullptr;
  bool first_ = true;
  int64_t steady_steps_ = 0, steady_tokens_ = 0;
  double steady_time_ = 0.0, first_loss_ = 0.0, last_loss_ = 0.0;
};

}  // namespace titan
