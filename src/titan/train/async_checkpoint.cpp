#include "titan/train/async_checkpoint.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "titan/backend/backend.h"
#include "titan/core/clock.h"
#include "titan/core/error.h"
#include "titan/train/run_record.h"

namespace titan {
namespace {

// kCheckpointWriteDelayEnv's milliseconds; 0 when unset.
int64_t test_write_delay_ms() {
  const char* text = std::getenv(kCheckpointWriteDelayEnv);
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  const long long ms = std::strtoll(text, &end, 10);
  TITAN_CHECK(*end == '\0' && ms >= 0 && ms <= 3600 * 1000, kCheckpointWriteDelayEnv, "=", text,
              ": expected milliseconds (0 to 3600000)");
  return ms;
}

}  // namespace

AsyncCheckpointer::AsyncCheckpointer(Communicator& world, MemorySpace& staging)
    : world_(world), staging_memory_(staging) {}

AsyncCheckpointer::~AsyncCheckpointer() {
  if (!pending_) return;
  abandon_and_join();
  const std::string step = std::to_string(save_.state.step);
  if (!write_error_.empty()) {
    std::fprintf(stderr, "warning: checkpoint step-%s: the background write failed: %s\n",
                 step.c_str(), write_error_.c_str());
  } else if (!commit_error_.empty()) {
    std::fprintf(stderr, "warning: checkpoint step-%s: the commit failed: %s\n", step.c_str(),
                 commit_error_.c_str());
  }
}

void AsyncCheckpointer::prepare(const std::vector<ParamGroup>& groups) {
  staging_.clear();
  for (const ParamGroup& group : groups) {
    staging_.emplace_back(staging_memory_, 3 * static_cast<size_t>(group.numel()) * sizeof(float),
                          MemCategory::other);
    staging_.back().zero();
  }
}

void AsyncCheckpointer::stage(const std::vector<ParamGroup>& groups, bool model_only) {
  staging_.resize(groups.size());
  staged_.clear();
  for (size_t g = 0; g < groups.size(); ++g) {
    const ParamGroup& group = groups[g];
    const auto numel = static_cast<size_t>(group.numel());
    const size_t bytes = (model_only ? 1 : 3) * numel * sizeof(float);
    // Made by prepare(); kept from one save to the next. Host memory: the writer reads it.
    if (staging_[g].bytes() < bytes) {
      staging_[g] = Buffer(staging_memory_, bytes, MemCategory::other);
    }
    float* base = staging_[g].as<float>();
    CheckpointGroup staged{&group.views(), base, nullptr, nullptr};
    Backend& device = backend();  // the groups' memory is the backend's
    device.copy_to_host(staged.params, group.params(), numel * sizeof(float));
    if (!model_only) {
      staged.exp_avg = base + numel;
      staged.exp_avg_sq = base + 2 * numel;
      device.copy_to_host(staged.exp_avg, group.exp_avg(), numel * sizeof(float));
      device.copy_to_host(staged.exp_avg_sq, group.exp_avg_sq(), numel * sizeof(float));
    }
    staged_.push_back(staged);
  }
}

void AsyncCheckpointer::start(Save save, const std::vector<ParamGroup>& groups) {
  begin(std::move(save));
  if (save_.writes_shard) stage(groups, save_.state.model_only);
  launch();
}

void AsyncCheckpointer::start_gathered(Save save, std::vector<CheckpointGroup> gathered) {
  begin(std::move(save));
  staged_ = std::move(gathered);
  launch();
}

void AsyncCheckpointer::begin(Save save) {
  TITAN_CHECK(!pending_, "checkpoint step-", save.state.step, ": the save of step-",
              save_.state.step, " is still pending (finish it first)");
  const int64_t step = save.state.step;
  if (world_.rank() == 0) begin_training_checkpoint(save.folder, step);
  world_.barrier();  // the temporary folder exists before any rank writes into it
  temp_dir_ = training_checkpoint_temp_dir(save.folder, step);
  started_s_ = now_seconds();
  save_ = std::move(save);
}

void AsyncCheckpointer::launch() {
  written_ = false;
  write_error_.clear();
  commit_error_.clear();
  abandon_ = false;
  all_written_ = false;
  pending_ = true;
  thread_ = std::thread([this] { write_in_background(); });
}

void AsyncCheckpointer::write_in_background() {
  std::string error;
  try {
    if (save_.writes_shard) {
      write_checkpoint_shard(temp_dir_, save_.specs, staged_, save_.cut, save_.state.model_only,
                             /*show_progress=*/false);
    }
    if (const int64_t ms = test_write_delay_ms(); ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    }
    if (world_.rank() == 0) save_.write_record(temp_dir_);
  } catch (const std::exception& e) {
    error = e.what();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    write_error_ = error;
    written_ = true;
  }
  written_cv_.notify_all();
  if (world_.rank() != 0 || !error.empty()) return;
  try {
    if (!wait_for_shards()) return;
    commit_training_checkpoint(save_.folder, temp_dir_, save_.specs, save_.cut.count, save_.state,
                               save_.keep_latest_k);
    const std::string dir = training_checkpoint_dir(save_.folder, save_.state.step);
    std::printf("checkpoint saved: %s (%s in the background since step %lld%s)\n", dir.c_str(),
                saved_folder_summary(dir, started_s_).c_str(),
                static_cast<long long>(save_.state.step),
                save_.state.model_only ? ", model weights only" : "");
    std::fflush(stdout);
  } catch (const std::exception& e) {
    commit_error_ = e.what();
  }
}

bool AsyncCheckpointer::wait_for_shards() const {
  const std::vector<std::string> names =
      checkpoint_shard_files(save_.cut.count, save_.state.model_only);
  for (;;) {
    const bool last_look = all_written_;  // read before looking: then a missing file stays missing
    std::string missing;
    for (const std::string& name : names) {
      std::error_code ec;
      if (missing.empty() && !std::filesystem::is_regular_file(temp_dir_ + "/" + name, ec)) {
        missing = name;
      }
    }
    if (missing.empty()) return true;
    TITAN_CHECK(!last_look, temp_dir_, "/", missing,
                " is missing although every rank has written its shard (removed during the "
                "save?)");
    if (abandon_) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void AsyncCheckpointer::abandon_and_join() {
  abandon_ = true;
  if (thread_.joinable()) thread_.join();
  pending_ = false;
}

void AsyncCheckpointer::finish() {
  if (!pending_) return;
  const std::string name = "checkpoint step-" + std::to_string(save_.state.step);
  {
    std::unique_lock<std::mutex> lock(mutex_);
    written_cv_.wait(lock, [this] { return written_; });
  }
  double failed = write_error_.empty() ? 0.0 : 1.0;
  world_.all_reduce_max(&failed, 1);
  if (!write_error_.empty()) {
    abandon_and_join();
    fail(name, ": the background write failed: ", write_error_);
  }
  if (failed > 0) {
    // Another rank's write failed: its error ends the job (apps/titan/main.cpp aborts every rank
    // after printing it); this rank must neither commit nor print a line of its own first.
    abandon_and_join();
    world_.barrier();
    fail(name, ": another rank's background write failed");
  }
  all_written_ = true;  // rank 0's commit needs no more waiting: its files are there or lost
  thread_.join();
  pending_ = false;
  TITAN_CHECK(commit_error_.empty(), name, ": the commit failed: ", commit_error_);
  world_.barrier();  // as after a synchronous save: no rank runs ahead of the commit
}

}  // namespace titan
