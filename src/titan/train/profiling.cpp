#include "titan/train/profiling.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "titan/core/error.h"
#include "titan/io/atomic_file.h"

namespace titan {
namespace {

constexpr const char* kStepSpan = "step";

double microseconds(int64_t ns) {
  return static_cast<double>(ns) * 1e-3;
}

}  // namespace

std::string chrome_trace_json(const std::vector<ProfileSpanRecord>& spans, int rank,
                              int64_t first_step) {
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", rank},
                    {"args", {{"name", "rank " + std::to_string(rank)}}}});
  for (const auto& [thread, name] : profile_thread_names()) {
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", rank},
                      {"tid", thread},
                      {"args", {{"name", name}}}});
  }
  // Spans are kept as they end; a viewer wants each thread's in start order.
  std::vector<const ProfileSpanRecord*> ordered;
  for (const ProfileSpanRecord& s : spans) ordered.push_back(&s);
  std::stable_sort(ordered.begin(), ordered.end(),
                   [](const auto* a, const auto* b) { return a->start_ns < b->start_ns; });
  int64_t step = first_step;
  for (const ProfileSpanRecord* s : ordered) {
    nlohmann::json e = {{"name", s->name},
                        {"cat", span_kind_name(s->kind)},
                        {"ph", "X"},
                        {"ts", microseconds(s->start_ns)},
                        {"dur", microseconds(s->end_ns - s->start_ns)},
                        {"pid", rank},
                        {"tid", s->thread}};
    if (s->kind == SpanKind::phase && std::string_view(s->name) == kStepSpan) {
      e["args"] = {{"step", step++}};
    }
    events.push_back(std::move(e));
  }
  return nlohmann::json({{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}}).dump();
}

double kernel_share_of_steps(const std::vector<ProfileSpanRecord>& spans) {
  // With profiler_active > 1, what runs between two recorded steps (validation, a checkpoint) is
  // recorded too, outside every step: only kernels inside a step count.
  std::vector<const ProfileSpanRecord*> steps;
  int64_t steps_ns = 0, kernels_ns = 0;
  for (const ProfileSpanRecord& s : spans) {
    if (s.kind == SpanKind::phase && std::string_view(s.name) == kStepSpan) {
      steps.push_back(&s);
      steps_ns += s.end_ns - s.start_ns;
    }
  }
  for (const ProfileSpanRecord& k : spans) {
    if (k.kind != SpanKind::kernel) continue;
    for (const ProfileSpanRecord* s : steps) {
      if (k.thread == s->thread && k.start_ns >= s->start_ns && k.end_ns <= s->end_ns) {
        kernels_ns += k.end_ns - k.start_ns;
        break;
      }
    }
  }
  return steps_ns > 0 ? static_cast<double>(kernels_ns) / static_cast<double>(steps_ns) : 0.0;
}

StepProfiler::StepProfiler(const JobConfig& config, int rank)
    : config_(config.profiling), dump_folder_(config.job.dump_folder), rank_(rank) {
  if (!config_.enable_profiling) return;
  name_profile_thread("main");
  if (rank_ == 0) {
    std::printf(
        "profiling: every step that is a multiple of %lld%s traced into %s\n",
        static_cast<long long>(config_.profile_freq),
        config_.profiler_active > 1
            ? (" (with the " + std::to_string(config_.profiler_active - 1) + " before it)").c_str()
            : "",
        (traces_folder() / "iteration_<step>/rank<r>_trace.json").c_str());
  }
}

std::filesystem::path StepProfiler::traces_folder() const {
  const std::filesystem::path folder(config_.save_traces_folder);
  return folder.is_absolute() ? folder : dump_folder_ / folder;
}

StepProfiler::~StepProfiler() {
  if (recording_) profile_stop_recording();
}

bool StepProfiler::recorded(int64_t step) const {
  const int64_t into = step % config_.profile_freq;  // 0 at a multiple
  return into == 0 || into > config_.profile_freq - config_.profiler_active;
}

void StepProfiler::begin_step(int64_t step) {
  if (!config_.enable_profiling || recording_ || !recorded(step)) return;
  profile_start_recording();
  recording_ = true;
  first_recorded_ = step;
}

void StepProfiler::end_step(int64_t step) {
  if (!recording_ || step % config_.profile_freq != 0) return;
  const std::vector<ProfileSpanRecord> spans = profile_stop_recording();
  recording_ = false;
  const std::filesystem::path dir = traces_folder() / ("iteration_" + std::to_string(step));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  TITAN_CHECK(!ec, "profiling.save_traces_folder: cannot create ", dir.string(), ": ",
              ec.message());
  const std::string path = (dir / ("rank" + std::to_string(rank_) + "_trace.json")).string();
  write_file_atomic(path, chrome_trace_json(spans, rank_, first_recorded_));
  if (rank_ == 0) {
    std::printf("profile trace of step%s %lld%s: %s (%zu spans; kernels %.1f%% of the step time)\n",
                first_recorded_ < step ? "s" : "", static_cast<long long>(first_recorded_),
                first_recorded_ < step ? ("-" + std::to_string(step)).c_str() : "", path.c_str(),
                spans.size(), 100.0 * kernel_share_of_steps(spans));
    std::fflush(stdout);
  }
}

}  // namespace titan
