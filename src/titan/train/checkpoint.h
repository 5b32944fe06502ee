// Full training checkpoints: everything a run needs to continue exactly where it stopped.
//
//   <folder>/step-<N>/model.safetensors      fp32 parameters under their HF names
//   <folder>/step-<N>/optimizer.safetensors  exp_avg.<name>, exp_avg_sq.<name>
//   <folder>/step-<N>/trainer_state.json     step, optimizer step, data-loader state, seed,
//                                            model_only
//
// Under FSDP over K ranks (distributed/fsdp.h) each shard rank writes its rows instead, every
// tensor (c, ...) with c = ceil(d0 / K), zero padded past d0 (nn/shard.h):
//
//   <folder>/step-<N>/model.shard-<i>-of-<K>.safetensors, optimizer.shard-<i>-of-<K>.safetensors
//   <folder>/step-<N>/sharding.json          K, and per parameter its whole shape and each
//                                            shard's slice of rows [first, first + rows)
//
// Either layout loads into any cut of the parameters (the whole model, or shard i of any K, of a
// tensor-parallel rank's part too): a run resumes on another number of ranks, another TP degree,
// or on one process, by reading each row where it was written. Under TP the one process's layout
// is written, gathered onto rank 0 (train/parallelism.h).
//
// A model-only checkpoint (torchtitan's last_save_model_only, for the last step) has no
// optimizer files: it can seed another run's weights but cannot resume this one exactly.
//
// A checkpoint is written into a hidden temporary folder and renamed to step-<N> only when every
// file in it is complete and on disk, so a process killed at any moment leaves the previous
// checkpoints loadable and no half-written step-<N>.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "titan/models/state_dict_adapter.h"
#include "titan/nn/parallel_plan.h"
#include "titan/nn/param_group.h"
#include "titan/nn/shard.h"

namespace titan {

struct TrainerState {
  int64_t step = 0;            // optimizer updates done
  int64_t optimizer_step = 0;  // AdamW's bias-correction counter
  std::string loader_state;    // DataLoader state as JSON
  int64_t seed = 0;
  bool model_only = false;  // parameters only: no AdamW moments saved
  // Every file of the checkpoint but trainer_state.json, by name -> "crc32c:xxxxxxxx"
  // (io/file_checksum.h), recorded at commit; empty in a checkpoint of a titan from before.
  std::map<std::string, std::string> checksums;
};

enum class CheckpointContent { model_only, full };

// One parameter group as a checkpoint writes it: its views and its flat buffers (numel floats
// each) -- the parameters and AdamW's moments (null in a model-only save) -- the group's own
// (checkpoint_groups), or an asynchronous save's staged copy of them (train/async_checkpoint.h).
struct CheckpointGroup {
  const std::vector<ParamView>* views = nullptr;
  float* params = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  // The buffers are the backend's device memory (a device run's own groups): the writer reads
  // them through the backend's copies, one tensor at a time (nn/host_params.h).
  bool in_device_memory = false;
};

// One tensor of a checkpoint's files: group `group`'s parameter `name`, from buffer `buffer` (0:
// the parameters, 1: AdamW's exp_avg, 2: its exp_avg_sq).
struct CheckpointTensor {
  size_t group = 0;
  std::string name;
  size_t buffer = 0;
};

// Called with each tensor just before the writer first reads it, the tensors before it done: a
// save under TP or EP gathers it onto rank 0 there (train/parallelism.h).
using CheckpointBeforeRead = std::function<void(const CheckpointTensor&)>;

// The tensors of a checkpoint of `specs` in the order write_checkpoint_shard reads them: the model
// file's, then the optimizer file's unless `model_only`. The ranks that take part in a
// before_read's gathers without writing follow it.
std::vector<CheckpointTensor> checkpoint_read_order(const std::vector<ParamGroupSpec>& specs,
                                                    bool model_only);

// `groups`' own buffers, for a save that writes from them directly.
std::vector<CheckpointGroup> checkpoint_groups(const std::vector<ParamGroup>& groups);

// A folder a training checkpoint was committed as (not a link; trainer_state.json in it): the
// only kind a save replaces or prunes, and what the commands read as a step-N checkpoint.
bool is_training_checkpoint(const std::string& dir);

// <folder>/step-<step>
std::string training_checkpoint_dir(const std::string& folder, int64_t step);

// Saves the parameters, and their AdamW state unless state.model_only, with `state` as
// <folder>/step-<state.step>, in steps so that several ranks can write one checkpoint (the trainer
// orders them with barriers): one rank begins (refuses to replace a step-<N> that is not a titan
// checkpoint, clears a killed save's leftovers); every writer writes its cut into the temporary
// folder; when all are written, one rank commits: trainer_state.json (and sharding.json for K > 1
// shards), fsync, rename, then prunes to keep_latest_k (0 keeps all). Only step folders older
// than the one just written are removed, the oldest first, so that it and the k - 1 before it
// remain; newer step folders (left by another run, perhaps unusable) are never counted or removed:
// pruning must not take the checkpoint this run just wrote for an older one. `specs` are the
// whole model's; `groups` hold `shard` of it.
std::string begin_training_checkpoint(const std::string& folder, int64_t step);
std::string training_checkpoint_temp_dir(const std::string& folder, int64_t step);
// `show_progress`: the saving status line (core/progress.h), off for a background write;
// `before_read`: see CheckpointBeforeRead (none: every buffer is filled before).
void write_checkpoint_shard(const std::string& temp_dir, const std::vector<ParamGroupSpec>& specs,
                            const std::vector<CheckpointGroup>& groups, Shard shard,
                            bool model_only, bool show_progress,
                            const CheckpointBeforeRead& before_read = {});
// The names of the tensor files the writers of a checkpoint of `shards` shards put in its folder:
// what must all be there before it is committed.
std::vector<std::string> checkpoint_shard_files(int64_t shards, bool model_only);
void commit_training_checkpoint(const std::string& folder, const std::string& temp_dir,
                                const std::vector<ParamGroupSpec>& specs, int64_t shards,
                                const TrainerState& state, int64_t keep_latest_k);

// The step numbers of the step-<N> folders under `folder`, newest first.
std::vector<int64_t> list_training_checkpoints(const std::string& folder);

// The trainer_state.json of a checkpoint folder.
TrainerState read_trainer_state(const std::string& dir);

// Checks the checkpoint folder `dir` against a model of `specs`: trainer_state.json readable;
// every file it loads from with the checksum trainer_state.json records for it (a file changed
// or damaged after the save -- finite garbage included -- is refused, naming it; a checkpoint of
// a titan from before checksums is checked by its headers only); model.safetensors (with `full`,
// optimizer.safetensors too) holding exactly the model's tensors, F32, each of its shape -- or, in
// a sharded checkpoint, sharding.json and every shard file holding each tensor's rows. Returns its
// trainer state.
TrainerState check_training_checkpoint(const std::string& dir,
                                       const std::vector<ParamGroupSpec>& specs,
                                       CheckpointContent content);

// Loads the checkpoint folder `dir` (either layout) into groups holding the model of `specs` cut
// by each parameter's placement under `plan` (tensor parallel's cut) and then by `shard`: the
// parameters, and with `full` the AdamW moments too (groups must have optimizer state allocated; a
// model-only checkpoint is an error). Every file is checked before any tensor is copied; errors
// name file and tensor. NaN or Inf in what was loaded is refused (models/nonfinite_weights.h)
// unless `allow_nonfinite`.
TrainerState load_training_checkpoint(const std::string& dir,
                                      const std::vector<ParamGroupSpec>& specs,
                                      std::vector<ParamGroup>& groups, Shard shard,
                                      CheckpointContent content, bool allow_nonfinite = false,
                                      const ParallelizePlan& plan = {});

}  // namespace titan
