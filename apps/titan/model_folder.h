// The model path a command reads (`titan info`, `eval`, `generate`): a Hugging Face folder as it
// is; a titan step-N training checkpoint exported to a temporary Hugging Face folder in fp32 (its
// master weights), removed when the command ends; a torchtitan DCP checkpoint refused with the
// conversion to use (train/checkpoint_export.h).
#pragma once

#include <optional>
#include <string>

#include "titan/train/checkpoint.h"

namespace titan::cli {

class ModelFolder {
 public:
  // `what` names the argument in messages ("--model").
  ModelFolder(const std::string& path, const std::string& what);
  ~ModelFolder();
  ModelFolder(const ModelFolder&) = delete;
  ModelFolder& operator=(const ModelFolder&) = delete;

  // The Hugging Face folder to read.
  const std::string& path() const { return path_; }
  // The checkpoint's trainer state when the path was a training checkpoint.
  const std::optional<TrainerState>& checkpoint() const { return checkpoint_; }

 private:
  std::string path_;
  std::string temp_;  // the temporary export, "" when none
  std::optional<TrainerState> checkpoint_;
};

}  // namespace titan::cli
