// Which training checkpoint a run resumes from, chosen from the files' headers before the model is
// allocated, so that a folder of checkpoints the run cannot use is reported in a second, not after
// minutes of allocation, and never silently trained over.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "titan/models/state_dict_adapter.h"
#include "titan/train/checkpoint.h"
#include "titan/train/job_config.h"

namespace titan {

struct ResumePoint {
  std::string dir;  // <folder>/step-<N>
  TrainerState state;
};

// The newest step folder under `folder` that a model of `specs` can continue from towards
// `training_steps` (or checkpoint.load_step exactly). A damaged or mismatched checkpoint is passed
// over, with a warning, for an older usable one; when the folder holds checkpoints and none is
// usable, the run stops (titan::Error naming them and the choices) unless
// checkpoint.allow_fresh_start. nullopt: start from step 0 (checkpointing off, or no checkpoints).
std::optional<ResumePoint> find_resume_checkpoint(const std::string& folder,
                                                  const std::vector<ParamGroupSpec>& specs,
                                                  const JobConfig::Checkpoint& ck,
                                                  int64_t training_steps);

// Where the run's model weights come from, its start-up line: "model weights: from DIR (Hugging
// Face folder)", "from DIR (resuming)", "random init (...)", ...
std::string model_weights_line(const JobConfig& config, const std::optional<ResumePoint>& resume);

}  // namespace titan
