// [profiling]: the steps a run records (core/profile.h: every kernel call through the registry's
// tables, every collective on the communication thread, the waits for them and the phases of the
// step, each on the thread that ran it) and their traces, one per rank, in the Chrome trace
// format Perfetto (ui.perfetto.dev) and chrome://tracing open:
// job.dump_folder/save_traces_folder/iteration_<step>/rank<r>_trace.json, as torchtitan lays its
// traces out. Step s is recorded when it is a multiple of profile_freq or one of the
// profiler_active - 1 steps before one; the trace is written, atomically, after that multiple.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "titan/core/profile.h"
#include "titan/train/job_config.h"

namespace titan {

class StepProfiler {
 public:
  // Names the calling thread (the one that runs the steps) "main" in traces and says (rank 0)
  // which steps are traced where; nothing is recorded unless profiling.enable_profiling.
  StepProfiler(const JobConfig& config, int rank);
  // Stops a recording a run ended inside of (its trace is not written, as in torchtitan).
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // Before step `step` begins: starts recording when it is a recorded step.
  void begin_step(int64_t step);
  // After it ends: at a multiple of profile_freq, stops and writes the trace (rank 0 prints its
  // path and how much of the step time the kernels cover).
  void end_step(int64_t step);

 private:
  bool recorded(int64_t step) const;
  // save_traces_folder, under job.dump_folder unless absolute.
  std::filesystem::path traces_folder() const;

  const JobConfig::Profiling config_;
  const std::string dump_folder_;
  const int rank_;
  bool recording_ = false;
  int64_t first_recorded_ = 0;
};

// The trace of `spans` (core/profile.h) on rank `rank` as Chrome trace JSON: an "X" event per span
// (name, cat = its kind, ts and dur in microseconds of the steady clock, pid = rank, tid = its
// thread), each "step" span's args naming its step from `first_step` on, and "M" events naming the
// process "rank <r>" and each named thread.
std::string chrome_trace_json(const std::vector<ProfileSpanRecord>& spans, int rank,
                              int64_t first_step);

// Of the "step" phases' time, the share inside kernel spans on their thread (kernels do not nest,
// so those spans are disjoint).
double kernel_share_of_steps(const std::vector<ProfileSpanRecord>& spans);

}  // namespace titan
