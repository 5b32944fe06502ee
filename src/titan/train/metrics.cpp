#include "titan/train/metrics.h"

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "titan/backend/backend.h"
#include "titan/backend/device_memory.h"
#include "titan/core/allocator.h"
#include "titan/core/clock.h"
#include "titan/core/error.h"

namespace titan {
namespace {
double gib(size_t bytes) {
  return static_cast<double>(bytes) / (1u << 30);
}
// "12.34": GiB with two decimals, as the step line prints its other sizes.
std::string format_gib(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", gib(bytes));
  return text;
}
}  // namespace

MetricsLogger::MetricsLogger(double flops_per_token, double peak_gflops, int64_t last_step,
                             const std::string& jsonl_path, const std::string& tensorboard_dir,
                             Communicator* ranks)
    : flops_per_token_(flops_per_token),
      peak_gflops_(peak_gflops),
      last_step_(last_step),
      start_time_(now_seconds()),
      jsonl_path_(jsonl_path),
      ranks_(ranks) {
  if (!tensorboard_dir.empty()) {
    tensorboard_ = std::make_unique<TensorBoardWriter>(tensorboard_dir);
    std::printf("TensorBoard event file %s (tensorboard --logdir %s)\n",
                tensorboard_->path().c_str(),
                std::filesystem::path(tensorboard_dir).parent_path().c_str());
  }
  if (jsonl_path.empty()) return;
  jsonl_ = std::fopen(jsonl_path.c_str(), "a");
  TITAN_CHECK(jsonl_ != nullptr, "metrics.save_jsonl: cannot open ", jsonl_path, " for appending");
}

MetricsLogger::~MetricsLogger() {
  if (jsonl_ != nullptr) std::fclose(jsonl_);
}

MemoryStats MetricsLogger::max_memory_stats() const {
  MemoryStats mem = memory_stats();
  if (ranks_ == nullptr || ranks_->size() == 1) return mem;
  // Bytes as doubles: exact below 2^53 (8 PiB).
  std::array<double, 2 * kMemCategoryCount + 2> v{};
  for (int c = 0; c < kMemCategoryCount; ++c) {
    v[c] = static_cast<double>(mem.current[c]);
    v[kMemCategoryCount + c] = static_cast<double>(mem.peak[c]);
  }
  v[2 * kMemCategoryCount] = static_cast<double>(mem.total_current);
  v[2 * kMemCategoryCount + 1] = static_cast<double>(mem.total_peak);
  ranks_->all_reduce_max(v.data(), static_cast<int64_t>(v.size()));
  for (int c = 0; c < kMemCategoryCount; ++c) {
    mem.current[c] = static_cast<size_t>(v[c]);
    mem.peak[c] = static_cast<size_t>(v[kMemCategoryCount + c]);
  }
  mem.total_current = static_cast<size_t>(v[2 * kMemCategoryCount]);
  mem.total_peak = static_cast<size_t>(v[2 * kMemCategoryCount + 1]);
  return mem;
}

double MetricsLogger::eta_seconds(const StepMetrics& m) const {
  const auto remaining = static_cast<double>(last_step_ - m.step);
  if (m.step == first_step_) return remaining * m.step_time_s;
  return remaining * (now_seconds() - first_step_end_) / static_cast<double>(m.step - first_step_);
}

void MetricsLogger::record(const StepMetrics& m, bool print) {
  if (first_) {
    first_loss_ = m.loss;
    first_step_ = m.step;
    first_step_end_ = now_seconds();
  } else {
    ++steady_steps_;
    steady_tokens_ += m.tokens;
    steady_time_ += m.step_time_s;
  }
  last_loss_ = m.loss;
  const bool first = first_;
  first_ = false;
  if (!print) return;
  const MemoryStats mem = max_memory_stats();
  const double machine = static_cast<double>(backend().memory_bytes());
  const double tps = static_cast<double>(m.tokens) / m.step_time_s;
  const double tflops = tps * flops_per_token_ * 1e-12;
  const double mfu = 100.0 * tflops * 1e3 / peak_gflops_;
  // A GPU's own count of its memory in use (this rank's device): beside the engine's accounted
  // Buffers it holds the CUDA context, cuBLASLt's workspace and the backend's raw allocations.
  const std::optional<size_t> device_in_use = device_memory_in_use(backend());
  const std::string device_note =
      device_in_use ? detail::concat("  device in use ", format_gib(*device_in_use), "GiB") : "";
  std::printf(
      "step %5lld/%lld  loss %8.4f  grad_norm %8.4f  lr %.2e  memory %.2fGiB (peak %.2fGiB, "
      "%.1f%%)%s  tps %8.0f  tflops %6.3f  mfu %5.1f%%  time %.2fs (data %.3fs)  eta %s%s\n",
      static_cast<long long>(m.step), static_cast<long long>(last_step_), m.loss, m.grad_norm, m.lr,
      gib(mem.total_current), gib(mem.total_peak),
      100.0 * static_cast<double>(mem.total_peak) / machine, device_note.c_str(), tps, tflops, mfu,
      m.step_time_s, m.data_time_s, format_duration(eta_seconds(m)).c_str(),
      first ? "  [first step: includes warm-up]" : "");
  std::fflush(stdout);
  if (jsonl_ != nullptr) {
    nlohmann::json peak_by_category = nlohmann::json::object();
    for (int c = 0; c < kMemCategoryCount; ++c) {
      peak_by_category[std::string(mem_category_name(static_cast<MemCategory>(c)))] =
          gib(mem.peak[c]);
    }
    nlohmann::json j = {{"step", m.step},
                        {"loss", m.loss},
                        {"grad_norm", m.grad_norm},
                        {"lr", m.lr},
                        {"tokens_per_second", tps},
                        {"tflops", tflops},
                        {"mfu", mfu},
                        {"memory_current_gib", gib(mem.total_current)},
                        {"memory_peak_gib", gib(mem.total_peak)},
                        {"memory_peak_by_category_gib", peak_by_category},
                        {"step_time_s", m.step_time_s},
                        {"data_time_s", m.data_time_s}};
    if (device_in_use) j["device_memory_in_use_gib"] = gib(*device_in_use);
    std::fprintf(jsonl_, "%s\n", j.dump().c_str());
    std::fflush(jsonl_);
  }
  if (tensorboard_ != nullptr) {
    // torchtitan's tags where it logs the same figure; memory under names of their own, as it is
    // the accounted allocator's (current and peak since the start), not CUDA's active/reserved.
    std::vector<std::pair<std::string, double>> scalars = {
        {"loss_metrics/global_avg_loss", m.loss},
        {"grad_norm", m.grad_norm},
        {"lr", m.lr},
        {"throughput(tps)", tps},
        {"tflops", tflops},
        {"mfu(%)", mfu},
        {"memory/current(GiB)", gib(mem.total_current)},
        {"memory/peak(GiB)", gib(mem.total_peak)},
        {"time_metrics/end_to_end(s)", m.step_time_s},
        {"time_metrics/data_loading(s)", m.data_time_s}};
    for (int c = 0; c < kMemCategoryCount; ++c) {
      scalars.emplace_back(
          "memory/peak_" + std::string(mem_category_name(static_cast<MemCategory>(c))) + "(GiB)",
          gib(mem.peak[c]));
    }
    tensorboard_->add_scalars(m.step, scalars);
  }
}

void MetricsLogger::log_validation(int64_t step, double loss, int64_t tokens) {
  std::printf("validate step %5lld  loss %8.4f  perplexity %10.3f  (%lld tokens)\n",
              static_cast<long long>(step), loss, std::exp(loss), static_cast<long long>(tokens));
  std::fflush(stdout);
  if (jsonl_ != nullptr) {
    const nlohmann::json j = {{"step", step},
                              {"validation_loss", loss},
                              {"validation_perplexity", std::exp(loss)},
                              {"validation_tokens", tokens}};
    std::fprintf(jsonl_, "%s\n", j.dump().c_str());
    std::fflush(jsonl_);
  }
  if (tensorboard_ != nullptr) {
    tensorboard_->add_scalars(step, {{"validation_metrics/loss", loss},
                                     {"validation_metrics/perplexity", std::exp(loss)}});
  }
}

void MetricsLogger::print_summary() const {
  const MemoryStats mem = max_memory_stats();
  if (first_) {
    std::printf("summary: nothing trained (no step ran)");
  } else {
    std::printf("summary: loss %.4f -> %.4f", first_loss_, last_loss_);
  }
  if (steady_steps_ > 0) {
    const double tps = static_cast<double>(steady_tokens_) / steady_time_;
    std::printf("  |  after warm-up: %lld steps, %.0f tokens/s, %.3f TFLOP/s, MFU %.1f%%",
                static_cast<long long>(steady_steps_), tps, tps * flops_per_token_ * 1e-12,
                100.0 * tps * flops_per_token_ * 1e-9 / peak_gflops_);
  }
  std::printf("  |  peak memory %.2f GiB (", gib(mem.total_peak));
  for (int c = 0; c < kMemCategoryCount; ++c) {
    std::printf("%s %.2f%s", std::string(mem_category_name(static_cast<MemCategory>(c))).c_str(),
                gib(mem.peak[c]), c + 1 < kMemCategoryCount ? ", " : ")");
  }
  std::printf("  |  total time %s\n", format_duration(now_seconds() - start_time_).c_str());
  std::fflush(stdout);
}

}  // namespace titan
