// Full training checkpoints: everything a run needs to continue exactly where it stopped.
//
//   <folder>/step-<N>/model.safetensors      fp32 parameters under their HF names
//   <folder>/step-<N>/optimizer.safetensors  exp_avg.<name>, exp_avg_sq.<name>
//   <folder>/step-<N>/trainer_state.json     step, optimizer step, data-loader state, seed,
//                                            model_only
//
// A model-only checkpoint (torchtitan's last_save_model_only, for the last step) has no
// optimizer.safetensors: it can seed another run's weights but cannot resume this one exactly.
//
// A checkpoint is written into a hidden temporary folder and renamed to step-<N> only when every
// file in it is complete and on disk, so a process killed at any moment leaves the previous
// checkpoints loadable and no half-written step-<N>.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "titan/models/state_dict_adapter.h"
#include "titan/nn/param_group.h"

namespace titan {

struct TrainerState {
  int64_t step = 0;            // optimizer updates done
  int64_t optimizer_step = 0;  // AdamW's bias-correction counter
  std::string loader_state;    // DataLoader state as JSON
  int64_t seed = 0;
  bool model_only = false;  // parameters only: no AdamW moments saved
};

enum class CheckpointContent { model_only, full };

// <folder>/step-<step>
std::string training_checkpoint_dir(const std::string& folder, int64_t step);

// Saves groups' parameters, and their AdamW state unless state.model_only, with `state` as
// <folder>/step-<state.step>, then prunes to keep_latest_k (0 keeps all): only step folders older
// than the one just written are removed, the oldest first, so that it and the k - 1 before it
// remain. Newer step folders (left by another run, perhaps unusable) are never counted or removed:
// pruning must not take the checkpoint this run just wrote for an older one.
void save_training_checkpoint(const std::string& folder, const std::vector<ParamGroup>& groups,
                              const TrainerState& state, int64_t keep_latest_k);

// The step numbers of the step-<N> folders under `folder`, newest first.
std::vector<int64_t> list_training_checkpoints(const std::string& folder);

// The trainer_state.json of a checkpoint folder.
TrainerState read_trainer_state(const std::string& dir);

// Checks the checkpoint folder `dir` against a model of `specs` without reading tensor data:
// trainer_state.json readable, and model.safetensors (with `full`, optimizer.safetensors too)
// holding exactly the model's tensors, F32, each of its shape. Returns its trainer state.
TrainerState check_training_checkpoint(const std::string& dir,
                                       const std::vector<ParamGroupSpec>& specs,
                                       CheckpointContent content);

// Loads the checkpoint folder `dir` into groups: the parameters, and with `full` the AdamW moments
// too (groups must have optimizer state allocated; a model-only checkpoint is an error). Every
// tensor is checked (present, right shape) before any is copied; errors name file and tensor.
// NaN or Inf in what was loaded is refused (models/nonfinite_weights.h) unless `allow_nonfinite`.
TrainerState load_training_checkpoint(const std::string& dir, std::vector<ParamGroup>& groups,
                                      CheckpointContent content, bool allow_nonfinite = false);

}  // namespace titan
