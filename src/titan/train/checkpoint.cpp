#include "titan/train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include <cstring>

#include "titan/core/error.h"
#include "titan/core/progress.h"
#include "titan/io/atomic_file.h"
#include "titan/io/file_checksum.h"
#include "titan/io/json_util.h"
#include "titan/io/safetensors.h"
#include "titan/io/safetensors_writer.h"
#include "titan/models/nonfinite_weights.h"
#include "titan/nn/host_params.h"
#include "titan/nn/shard_runs.h"

namespace titan {
namespace fs = std::filesystem;
namespace {

// One flat buffer of the state a checkpoint holds: where a load puts it (a group's own buffer)
// and where a save reads it (CheckpointGroup), and its tensors' name prefix.
using GroupBuffer = float* (ParamGroup::*)() const;
struct BufferSource {
  GroupBuffer buffer;
  float* CheckpointGroup::*saved;
  std::string prefix;  // tensor name = prefix + parameter name
  size_t index;        // CheckpointTensor::buffer
};

const std::vector<BufferSource>& model_sources() {
  static const std::vector<BufferSource> sources = {
      {&ParamGroup::params, &CheckpointGroup::params, "", 0}};
  return sources;
}

const std::vector<BufferSource>& optimizer_sources() {
  static const std::vector<BufferSource> sources = {
      {&ParamGroup::exp_avg, &CheckpointGroup::exp_avg, "exp_avg.", 1},
      {&ParamGroup::exp_avg_sq, &CheckpointGroup::exp_avg_sq, "exp_avg_sq.", 2}};
  return sources;
}

std::vector<ParamSpec> param_specs(const std::vector<ParamGroupSpec>& specs) {
  std::vector<ParamSpec> params;
  for (const ParamGroupSpec& g : specs)
    params.insert(params.end(), g.params.begin(), g.params.end());
  return params;
}

// The files of one kind ("model", "optimizer") in a checkpoint of `shards` shards.
std::string shard_file_name(const std::string& kind, int64_t index, int64_t shards) {
  if (shards == 1) return kind + ".safetensors";
  return kind + ".shard-" + std::to_string(index) + "-of-" + std::to_string(shards) +
         ".safetensors";
}

// Checks that `file`, shard `shard` of a checkpoint, holds exactly the tensors of `sources` for
// `params` (F32, each parameter's shard shape).
void check_tensors(const SafetensorsFile& file, const std::vector<ParamSpec>& params,
                   const std::vector<BufferSource>& sources, Shard shard) {
  for (const BufferSource& src : sources) {
    for (const ParamSpec& whole : params) {
      const ParamSpec p = shard.spec_of(whole);
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

int64_t views_bytes(const std::vector<ParamView>& views) {
  int64_t bytes = 0;
  for (const ParamView& v : views) bytes += v.numel * static_cast<int64_t>(sizeof(float));
  return bytes;
}

int64_t buffer_bytes(const std::vector<ParamGroup>& groups, size_t buffers) {
  int64_t bytes = 0;
  for (const ParamGroup& g : groups) bytes += views_bytes(g.views());
  return bytes * static_cast<int64_t>(buffers);
}

// The tensors of one file, and what each is (`read`, in the same order).
std::vector<SafetensorsTensor> views_of(const std::vector<CheckpointGroup>& groups,
                                        const std::vector<BufferSource>& sources,
                                        std::vector<CheckpointTensor>& read) {
  std::vector<SafetensorsTensor> tensors;
  for (const BufferSource& src : sources) {
    for (size_t g = 0; g < groups.size(); ++g) {
      float* buffer = groups[g].*src.saved;
      TITAN_CHECK(buffer != nullptr, "checkpoint: no ", src.prefix, " buffer to save");
      for (const ParamView& v : *groups[g].views) {
        tensors.push_back(
            {src.prefix + v.spec.name, Tensor::view(buffer + v.offset, v.spec.shape, DType::f32)});
        read.push_back({g, v.spec.name, src.index});
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

// sharding.json: the index of a sharded checkpoint.
nlohmann::json sharding_index(const std::vector<ParamGroupSpec>& specs, int64_t shards) {
  nlohmann::json params = nlohmann::json::object();
  for (const ParamSpec& p : param_specs(specs)) {
    nlohmann::json slices = nlohmann::json::array();
    for (int64_t i = 0; i < shards; ++i) {
      const Shard s{i, shards};
      slices.push_back({s.first(p.shape[0]), s.size(p.shape[0])});
    }
    params[p.name] = {{"shape", p.shape}, {"rows", slices}};
  }
  return {{"format", "titan.fsdp-rows"}, {"shards", shards}, {"parameters", params}};
}

// The shard count of the checkpoint in `dir`: 1 without sharding.json, else its "shards", checked
// against `params` (every parameter's whole shape and its slices).
int64_t read_shard_count(const std::string& dir, const std::vector<ParamSpec>& params) {
  const std::string path = dir + "/sharding.json";
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return 1;
  const nlohmann::json index = read_json_file(path, "checkpoint sharding index", 6);
  int64_t shards = 0;
  try {
    shards = index.at("shards").get<int64_t>();
    TITAN_CHECK(shards >= 1 && shards <= (int64_t{1} << 20), path, ": shards ", shards,
                " is out of range");
    const nlohmann::json& entries = index.at("parameters");
    TITAN_CHECK(entries.size() == params.size(), path, ": indexes ", entries.size(),
                " parameters, the model has ", params.size());
    for (const ParamSpec& p : params) {
      const auto it = entries.find(p.name);
      TITAN_CHECK(it != entries.end(), path, ": parameter ", p.name, " is missing");
      const Shape shape = it->at("shape").get<Shape>();
      TITAN_CHECK(shape == p.shape, path, ": parameter ", p.name, " has shape ", shape_str(shape),
                  ", the model's is ", shape_str(p.shape));
      const nlohmann::json& rows = it->at("rows");
      TITAN_CHECK(rows.is_array() && static_cast<int64_t>(rows.size()) == shards, path,
                  ": parameter ", p.name, " lists ", rows.size(), " slices for ", shards,
                  " shards");
      for (int64_t i = 0; i < shards; ++i) {
        const Shard s{i, shards};
        const auto slice = rows[static_cast<size_t>(i)].get<std::vector<int64_t>>();
        const std::vector<int64_t> expected = {s.first(p.shape[0]), s.size(p.shape[0])};
        TITAN_CHECK(slice == expected, path, ": parameter ", p.name, " shard ", i, " is not rows [",
                    s.first(p.shape[0]), ", +", s.size(p.shape[0]),
                    ") (titan cuts dim 0 in equal blocks of ceil(d0 / shards) rows)");
      }
    }
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": ", e.what());
  }
  return shards;
}

// The checks of check_training_checkpoint; the files stay open for the copy.
struct OpenCheckpoint {
  TrainerState state;
  int64_t shards = 1;
  std::vector<SafetensorsFile> model, optimizer;  // one per shard; optimizer empty unless full
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
  // Every file read below must hold the bytes the save wrote (trainer_state.json's checksums).
  const auto verify = [&](const std::string& name) {
    if (ck.state.checksums.empty()) return;  // saved by a titan from before checksums
    const std::string path = dir + "/" + name;
    const auto it = ck.state.checksums.find(name);
    TITAN_CHECK(it != ck.state.checksums.end(), path,
                ": not among the files trainer_state.json records checksums for");
    std::error_code ec;
    TITAN_CHECK(fs::exists(fs::symlink_status(path, ec)), path, ": no such file");
    const std::string sum = file_checksum_cached(path);
    TITAN_CHECK(sum == it->second, path, ": checksum mismatch (", sum,
                ", trainer_state.json records ", it->second,
                "): the file was changed or damaged after the save");
  };
  {
    std::error_code ec;
    if (fs::exists(fs::symlink_status(dir + "/sharding.json", ec))) verify("sharding.json");
  }
  ck.shards = read_shard_count(dir, params);
  for (int64_t i = 0; i < ck.shards; ++i) {
    verify(shard_file_name("model", i, ck.shards));
    if (with_optimizer) verify(shard_file_name("optimizer", i, ck.shards));
    const Shard shard{i, ck.shards};
    ck.model.push_back(SafetensorsFile::open(dir + "/" + shard_file_name("model", i, ck.shards)));
    check_tensors(ck.model.back(), params, model_sources(), shard);
    if (with_optimizer) {
      ck.optimizer.push_back(
          SafetensorsFile::open(dir + "/" + shard_file_name("optimizer", i, ck.shards)));
      check_tensors(ck.optimizer.back(), params, optimizer_sources(), shard);
    }
  }
  return ck;
}

// Every element of `dst` (the groups' cut of the model of `specs`: each parameter's placement
// under `plan`, then `shard` of that) from the checkpoint's shard files `files`, wherever each
// row was written; padding zeroed.
void copy_rows(const std::vector<SafetensorsFile>& files, const std::vector<ParamGroupSpec>& specs,
               std::vector<ParamGroup>& groups, Shard shard, const ParallelizePlan& plan,
               const std::vector<BufferSource>& sources, Progress& progress, NonfiniteScan& scan) {
  const auto saved = static_cast<int64_t>(files.size());
  for (const SafetensorsFile& f : files) f.prefetch();
  const std::string where = saved == 1 ? files.front().path()
                                       : fs::path(files.front().path()).parent_path().string() +
                                             " (" + std::to_string(saved) + " shards)";
  for (const BufferSource& src : sources) {
    for (size_t g = 0; g < groups.size(); ++g) {
      for (const ParamView& v : groups[g].views()) {
        const ParamSpec& whole = specs[g].param(v.spec.name);
        const int64_t d0 = whole.shape[0], row = shape_numel(whole.shape) / d0;
        const ShardBox box =
            shard_box(whole.shape, {plan.placement_of(whole), plan.fsdp_cut_of(whole, shard)});
        TITAN_CHECK(v.numel == shape_numel(box.part), "checkpoint: parameter ", v.spec.name,
                    " is not shard ", shard.index, " of ", shard.count, " of ",
                    shape_str(whole.shape));
        float* dst = (groups[g].*src.buffer)() + v.offset;
        if (box.real_numel() != v.numel) std::fill(dst, dst + v.numel, 0.0f);  // the padding
        // Each run of the part from the saved shards holding its elements (rows [first, first +
        // size) of the whole, saved shard k's elements [first * row, (first + size) * row)).
        for (int64_t k = 0; k < saved; ++k) {
          const Shard from{k, saved};
          const int64_t begin = from.first(d0) * row, end = begin + from.size(d0) * row;
          const SafetensorsEntry* e = files[static_cast<size_t>(k)].find(src.prefix + v.spec.name);
          for (const ShardRun& run : box.runs) {
            const int64_t lo = std::max(begin, run.whole_first);
            const int64_t hi = std::min(end, run.whole_first + run.count);
            if (lo >= hi) continue;
            std::memcpy(dst + run.part_first + (lo - run.whole_first),
                        static_cast<const float*>(e->data) + (lo - begin),
                        static_cast<size_t>(hi - lo) * sizeof(float));
          }
        }
        for (const ShardRun& run : box.runs) {
          scan.add(where, src.prefix + v.spec.name, dst + run.part_first, DType::f32,
                   static_cast<size_t>(run.count));
        }
        progress.advance(v.numel * static_cast<int64_t>(sizeof(float)));
      }
    }
  }
}

}  // namespace

bool is_training_checkpoint(const std::string& dir) {
  std::error_code ec;
  return fs::is_directory(fs::symlink_status(dir, ec)) &&
         fs::is_regular_file(fs::symlink_status(dir + "/trainer_state.json", ec));
}

std::string training_checkpoint_dir(const std::string& folder, int64_t step) {
  return folder + "/step-" + std::to_string(step);
}

std::string training_checkpoint_temp_dir(const std::string& folder, int64_t step) {
  return folder + "/.step-" + std::to_string(step) + ".tmp";
}

std::string begin_training_checkpoint(const std::string& folder, int64_t step) {
  fs::create_directories(folder);
  const std::string final_dir = training_checkpoint_dir(folder, step);
  // A step saved again (a resumed run) replaces the old checkpoint, never anything else.
  std::error_code ec;
  TITAN_CHECK(!fs::exists(fs::symlink_status(final_dir, ec)) || is_training_checkpoint(final_dir),
              final_dir,
              " exists and is not a titan checkpoint (no trainer_state.json): move it "
              "away, it is not replaced");
  const std::string temp_dir = training_checkpoint_temp_dir(folder, step);
  fs::remove_all(temp_dir);  // leftovers of a save that was killed
  fs::create_directories(temp_dir);
  return temp_dir;
}

std::vector<CheckpointGroup> checkpoint_groups(const std::vector<ParamGroup>& groups) {
  std::vector<CheckpointGroup> out;
  const bool on_device = in_device_memory(groups);
  for (const ParamGroup& g : groups) {
    out.push_back({&g.views(), g.params(), g.exp_avg(), g.exp_avg_sq(), on_device});
  }
  return out;
}

std::vector<std::string> checkpoint_shard_files(int64_t shards, bool model_only) {
  std::vector<std::string> names;
  for (int64_t i = 0; i < shards; ++i) {
    names.push_back(shard_file_name("model", i, shards));
    if (!model_only) names.push_back(shard_file_name("optimizer", i, shards));
  }
  return names;
}

void write_checkpoint_shard(const std::string& temp_dir, const std::vector<ParamGroupSpec>& specs,
                            const std::vector<CheckpointGroup>& groups, Shard shard,
                            bool model_only, bool show_progress,
                            const CheckpointBeforeRead& before_read) {
  TITAN_CHECK(specs.size() == groups.size(), "checkpoint: ", groups.size(),
              " parameter groups for a model of ", specs.size());
  TITAN_CHECK(shard.dim == 0, "checkpoint: shards cut along dimension ", shard.dim,
              " are not written (only FSDP's dimension 0)");
  int64_t bytes = 0;
  for (const CheckpointGroup& g : groups) bytes += views_bytes(*g.views);
  const bool on_device = !groups.empty() && groups[0].in_device_memory;
  for (const CheckpointGroup& g : groups) {
    TITAN_CHECK(g.in_device_memory == on_device,
                "checkpoint: some groups to save are device memory and others host memory");
  }
  std::optional<Progress> progress;
  if (show_progress) {
    progress.emplace("saving " + temp_dir,
                     bytes * static_cast<int64_t>(model_only ? 1 : 1 + optimizer_sources().size()),
                     ProgressUnit::bytes);
  }
  const auto write = [&](const std::string& kind, const std::vector<BufferSource>& sources) {
    std::vector<CheckpointTensor> read;
    const std::vector<SafetensorsTensor> tensors = views_of(groups, sources, read);
    SafetensorsWriteOptions options;
    options.progress = progress ? &*progress : nullptr;
    if (on_device) read_through_backend(options);
    if (before_read) options.before_read = [&](size_t i) { before_read(read[i]); };
    write_safetensors_file(temp_dir + "/" + shard_file_name(kind, shard.index, shard.count),
                           tensors, options);
  };
  write("model", model_sources());
  if (!model_only) write("optimizer", optimizer_sources());
}

std::vector<CheckpointTensor> checkpoint_read_order(const std::vector<ParamGroupSpec>& specs,
                                                    bool model_only) {
  std::vector<CheckpointTensor> order;
  for (const std::vector<BufferSource>* file : {&model_sources(), &optimizer_sources()}) {
    if (model_only && file == &optimizer_sources()) break;
    // The file's tensors without data: the writer's order looks at names, shapes and dtypes only.
    std::vector<SafetensorsTensor> tensors;
    std::vector<CheckpointTensor> read;
    for (const BufferSource& src : *file) {
      for (size_t g = 0; g < specs.size(); ++g) {
        for (const ParamSpec& p : specs[g].params) {
          tensors.push_back({src.prefix + p.name, Tensor::view(nullptr, p.shape, DType::f32)});
          read.push_back({g, p.name, src.index});
        }
      }
    }
    for (size_t i : safetensors_file_read_order(tensors, {})) order.push_back(read[i]);
  }
  return order;
}

void commit_training_checkpoint(const std::string& folder, const std::string& temp_dir,
                                const std::vector<ParamGroupSpec>& specs, int64_t shards,
                                const TrainerState& state, int64_t keep_latest_k) {
  if (shards > 1) {
    write_file_atomic(temp_dir + "/sharding.json", sharding_index(specs, shards).dump(1) + "\n");
  }
  // A checksum of every file the writers put here (all have finished: the trainer's barrier).
  nlohmann::json checksums = nlohmann::json::object();
  for (const auto& entry : fs::directory_iterator(temp_dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && name != "trainer_state.json") {
      checksums[name] = file_checksum(entry.path().string());
    }
  }
  const nlohmann::json meta = {{"step", state.step},
                               {"optimizer_step", state.optimizer_step},
                               {"loader_state", state.loader_state},
                               {"seed", state.seed},
                               {"model_only", state.model_only},
                               {"checksums", checksums}};
  write_file_atomic(temp_dir + "/trainer_state.json", meta.dump(2) + "\n");
  fsync_directory(temp_dir);
  const std::string final_dir = training_checkpoint_dir(folder, state.step);
  fs::remove_all(final_dir);
  fs::rename(temp_dir, final_dir);
  fsync_directory(folder);
  if (keep_latest_k > 0) {
    int64_t kept = 0;
    for (int64_t step : list_training_checkpoints(folder)) {  // newest first
      if (step > state.step) continue;
      const std::string dir = training_checkpoint_dir(folder, step);
      if (++kept > keep_latest_k && is_training_checkpoint(dir)) fs::remove_all(dir);
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
    if (meta.contains("checksums")) {
      for (const auto& [name, sum] : meta.at("checksums").items()) {
        state.checksums[name] = sum.get<std::string>();
      }
    }
  } catch (const nlohmann::json::exception& e) {
    fail(state_path, ": ", e.what());
  }
  return state;
}

TrainerState check_training_checkpoint(const std::string& dir,
                                       const std::vector<ParamGroupSpec>& specs,
                                       CheckpointContent content) {
  return open_training_checkpoint(dir, param_specs(specs), content).state;
}

TrainerState load_training_checkpoint(const std::string& dir,
                                      const std::vector<ParamGroupSpec>& specs,
                                      std::vector<ParamGroup>& groups, Shard shard,
                                      CheckpointContent content, bool allow_nonfinite,
                                      const ParallelizePlan& plan) {
  TITAN_CHECK(specs.size() == groups.size(), "checkpoint: ", groups.size(),
              " parameter groups for a model of ", specs.size());
  TITAN_CHECK(shard.dim == 0, "checkpoint: loading into shards cut along dimension ", shard.dim,
              " is not supported (only FSDP's dimension 0)");
  const OpenCheckpoint ck = open_training_checkpoint(dir, param_specs(specs), content);
  Progress progress("loading " + dir,
                    buffer_bytes(groups, ck.optimizer.empty() ? 1 : 1 + optimizer_sources().size()),
                    ProgressUnit::bytes);
  NonfiniteScan scan;
  copy_rows(ck.model, specs, groups, shard, plan, model_sources(), progress, scan);
  if (!ck.optimizer.empty()) {
    copy_rows(ck.optimizer, specs, groups, shard, plan, optimizer_sources(), progress, scan);
  }
  scan.check(allow_nonfinite);
  return ck.state;
}

}  // namespace titan
