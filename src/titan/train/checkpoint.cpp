#include "titan/train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include <cstring>

#include "titan/core/error.h"
#include "titan/core/progress.h"
#include "titan/io/atomic_file.h"
#include "titan/io/json_util.h"
#include "titan/io/safetensors.h"
#include "titan/io/safetensors_writer.h"
#include "titan/models/nonfinite_weights.h"

namespace titan {
namespace fs = std::filesystem;
namespace {

using GroupBuffer = float* (ParamGroup::*)() const;
struct BufferSource {
  GroupBuffer buffer;
  std::string prefix;  // tensor name = prefix + parameter name
};

// Checks that `file` holds exactly the tensors of `sources` for the parameters `params` (F32, each
// parameter's shape).
void check_tensors(const SafetensorsFile& file, const std::vector<ParamSpec>& params,
                   const std::vector<BufferSource>& sources) {
  for (const BufferSource& src : sources) {
    for (const ParamSpec& p : params) {
      const SafetensorsEntry* e = file.find(src.prefix + p.name);
      TITAN_CHECK(e != nullptr, file.path(), ": tensor ", src.prefix, p.name, " is missing");
      TITAN_CHECK(e->dtype == DType::f32 && e->shape == p.shape, file.path(), ": tensor ",
                  src.prefix, p.name, " is ", e->dtype_name, " ", shape_str(e->shape),
                  ", expected F32 ", shape_str(p.shape));
    }
  }
  const size_t expected = params.size() * sources.size();
  TITAN_CHECK(file.entries().size() == expected, file.path(), ": holds ", file.entries().size(),
              " tensors, expected ", expected, " (a checkpoint of another model?)");
}

std::vector<ParamSpec> param_specs(const std::vector<ParamGroupSpec>& specs) {
  std::vector<ParamSpec> params;
  for (const ParamGroupSpec& g : specs)
    params.insert(params.end(), g.params.begin(), g.params.end());
  return params;
}

std::vector<ParamSpec> param_specs(const std::vector<ParamGroup>& groups) {
  std::vector<ParamSpec> params;
  for (const ParamGroup& g : groups) {
    for (const ParamView& v : g.views()) params.push_back(v.spec);
  }
  return params;
}

void copy_tensors(const SafetensorsFile& file, std::vector<ParamGroup>& groups,
                  const std::vector<BufferSource>& sources, Progress& progress,
                  NonfiniteScan& scan) {
  file.prefetch();
  for (const BufferSource& src : sources) {
    for (ParamGroup& g : groups) {
      for (const ParamView& v : g.views()) {
        const SafetensorsEntry* e = file.find(src.prefix + v.spec.name);
        float* dst = (g.*src.buffer)() + v.offset;
        std::memcpy(dst, e->data, e->nbytes);
        scan.add(file.path(), e->name, dst, DType::f32, static_cast<size_t>(v.numel));
        progress.advance(static_cast<int64_t>(e->nbytes));
      }
    }
  }
}

int64_t buffer_bytes(const std::vector<ParamGroup>& groups, size_t buffers) {
  int64_t bytes = 0;
  for (const ParamGroup& g : groups) {
    for (const ParamView& v : g.views()) bytes += v.numel * static_cast<int64_t>(sizeof(float));
  }
  return bytes * static_cast<int64_t>(buffers);
}

const std::vector<BufferSource>& model_sources() {
  static const std::vector<BufferSource> sources = {{&ParamGroup::params, ""}};
  return sources;
}

const std::vector<BufferSource>& optimizer_sources() {
  static const std::vector<BufferSource> sources = {{&ParamGroup::exp_avg, "exp_avg."},
                                                    {&ParamGroup::exp_avg_sq, "exp_avg_sq."}};
  return sources;
}

std::vector<SafetensorsTensor> views_of(const std::vector<ParamGroup>& groups,
                                        const std::vector<BufferSource>& sources) {
  std::vector<SafetensorsTensor> tensors;
  for (const BufferSource& src : sources) {
    for (const ParamGroup& g : groups) {
      for (const ParamView& v : g.views()) {
        tensors.push_back({src.prefix + v.spec.name,
                           Tensor::view((g.*src.buffer)() + v.offset, v.spec.shape, DType::f32)});
      }
    }
  }
  return tensors;
}

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  TITAN_CHECK(fd >= 0, dir, ": cannot open to sync");
  const int rc = ::fsync(fd);
  ::close(fd);
  TITAN_CHECK(rc == 0, dir, ": fsync failed");
}

// A folder save_training_checkpoint wrote: the only kind it replaces or prunes.
bool is_titan_checkpoint(const std::string& dir) {
  std::error_code ec;
  return fs::is_directory(fs::symlink_status(dir, ec)) &&
         fs::is_regular_file(fs::symlink_status(dir + "/trainer_state.json", ec));
}

}  // namespace

std::string training_checkpoint_dir(const std::string& folder, int64_t step) {
  return folder + "/step-" + std::to_string(step);
}

void save_training_checkpoint(const std::string& folder, const std::vector<ParamGroup>& groups,
                              const TrainerState& state, int64_t keep_latest_k) {
  fs::create_directories(folder);
  const std::string final_dir = training_checkpoint_dir(folder, state.step);
  // A step saved again (a resumed run) replaces the old checkpoint, never anything else.
  std::error_code ec;
  TITAN_CHECK(!fs::exists(fs::symlink_status(final_dir, ec)) || is_titan_checkpoint(final_dir),
              final_dir,
              " exists and is not a titan checkpoint (no trainer_state.json): move it "
              "away, it is not replaced");
  const std::string temp_dir = folder + "/.step-" + std::to_string(state.step) + ".tmp";
  fs::remove_all(temp_dir);  // leftovers of a save that was killed
  fs::create_directories(temp_dir);
  Progress progress("saving " + final_dir,
                    buffer_bytes(groups, state.model_only ? 1 : 1 + optimizer_sources().size()),
                    ProgressUnit::bytes);
  SafetensorsWriteOptions options;
  options.progress = &progress;
  write_safetensors_file(temp_dir + "/model.safetensors", views_of(groups, model_sources()),
                         options);
  if (!state.model_only) {
    write_safetensors_file(temp_dir + "/optimizer.safetensors",
                           views_of(groups, optimizer_sources()), options);
  }
  const nlohmann::json meta = {{"step", state.step},
                               {"optimizer_step", state.optimizer_step},
                               {"loader_state", state.loader_state},
                               {"seed", state.seed},
                               {"model_only", state.model_only}};
  write_file_atomic(temp_dir + "/trainer_state.json", meta.dump(2) + "\n");
  fsync_directory(temp_dir);
  fs::remove_all(final_dir);
  fs::rename(temp_dir, final_dir);
  fsync_directory(folder);
  if (keep_latest_k > 0) {
    int64_t kept = 0;
    for (int64_t step : list_training_checkpoints(folder)) {  // newest first
      if (step > state.step) continue;
      const std::string dir = training_checkpoint_dir(folder, step);
      if (++kept > keep_latest_k && is_titan_checkpoint(dir)) fs::remove_all(dir);
    }
  }
}

std::vector<int64_t> list_training_checkpoints(const std::string& folder) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || name.rfind("step-", 0) != 0) continue;
    const std::string digits = name.substr(5);
    if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit)) continue;
    steps.push_back(std::stoll(digits));
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

TrainerState read_trainer_state(const std::string& dir) {
  const std::string state_path = dir + "/trainer_state.json";
  const nlohmann::json meta = read_json_file(state_path, "trainer state", 4);
  TrainerState state;
  try {
    state.step = meta.at("step").get<int64_t>();
    state.optimizer_step = meta.at("optimizer_step").get<int64_t>();
    state.loader_state = meta.at("loader_state").get<std::string>();
    state.seed = meta.at("seed").get<int64_t>();
    state.model_only = meta.value("model_only", false);
  } catch (const nlohmann::json::exception& e) {
    fail(state_path, ": ", e.what());
  }
  return state;
}

namespace {

// The checks of check_training_checkpoint; the files stay open for the copy.
struct OpenCheckpoint {
  TrainerState state;
  std::optional<SafetensorsFile> model, optimizer;
};

OpenCheckpoint open_training_checkpoint(const std::string& dir,
                                        const std::vector<ParamSpec>& params,
                                        CheckpointContent content) {
  OpenCheckpoint ck;
  ck.state = read_trainer_state(dir);
  const bool with_optimizer = content == CheckpointContent::full;
  TITAN_CHECK(!with_optimizer || !ck.state.model_only, dir,
              ": holds model weights only (saved with checkpoint.last_save_model_only), not the "
              "optimizer state training needs to continue");
  ck.model.emplace(SafetensorsFile::open(dir + "/model.safetensors"));
  check_tensors(*ck.model, params, model_sources());
  if (with_optimizer) {
    ck.optimizer.emplace(SafetensorsFile::open(dir + "/optimizer.safetensors"));
    check_tensors(*ck.optimizer, params, optimizer_sources());
  }
  return ck;
}

}  // namespace

TrainerState check_training_checkpoint(const std::string& dir,
                                       const std::vector<ParamGroupSpec>& specs,
                                       CheckpointContent content) {
  return open_training_checkpoint(dir, param_specs(specs), content).state;
}

TrainerState load_training_checkpoint(const std::string& dir, std::vector<ParamGroup>& groups,
                                      CheckpointContent content, bool allow_nonfinite) {
  const OpenCheckpoint ck = open_training_checkpoint(dir, param_specs(groups), content);
  Progress progress("loading " + dir,
                    buffer_bytes(groups, ck.optimizer ? 1 + optimizer_sources().size() : 1),
                    ProgressUnit::bytes);
  NonfiniteScan scan;
  copy_tensors(*ck.model, groups, model_sources(), progress, scan);
  if (ck.optimizer) copy_tensors(*ck.optimizer, groups, optimizer_sources(), progress, scan);
  scan.check(allow_nonfinite);
  return ck.state;
}

}  // namespace titan
