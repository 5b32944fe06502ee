// Checkpoint folders as models for the commands that read one (`titan info`, `eval`, `generate`,
// `convert`): a titan training checkpoint (step-N) exported as a Hugging Face folder, and a
// torchtitan DCP checkpoint recognised and refused with the conversion to use.
#pragma once

#include <string>

#include "titan/models/hf_export.h"
#include "titan/train/checkpoint.h"

namespace titan {

// torchtitan's DCP checkpoint (a .metadata file beside __R_S.distcp shards): a titan::Error saying
// what it is and which conversion makes it a folder titan reads; nothing for any other path.
// `what` names the argument ("--model").
void refuse_dcp_checkpoint(const std::string& path, const std::string& what);

struct CheckpointExport {
  ModelArgs args;
  TrainerState state;
};

// The training checkpoint `dir` (either layout, model weights only or the whole state) as the
// Hugging Face folder `dst`: its config.json's model, its parameters loaded whole in fp32 and
// exported as options.dtype, with the tokenizer files, generation config and job_config.toml the
// checkpoint carries (options.source_dir and job_config_toml are set from `dir`). A checkpoint
// written by a titan from before checkpoints carried config.json is a titan::Error saying how to
// export it.
// NaN or Inf in its weights is refused unless `allow_nonfinite`.
CheckpointExport export_training_checkpoint(const std::string& dir, const std::string& dst,
                                            HfExportOptions options, bool allow_nonfinite = false);

}  // namespace titan
