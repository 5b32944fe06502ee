// What `titan info PATH` reports about a Hugging Face model folder: the model config.json
// describes, its parameter counts, and the checkpoint files, checked against each other.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "titan/models/model_args.h"
#include "titan/models/param_count.h"

namespace titan {

struct HfFolderInfo {
  struct File {
    std::string name;  // relative to the folder
    uint64_t bytes = 0;
  };
  std::string dir;
  ModelArgs args;
  ParamCounts counts;
  size_t tensors = 0;                           // stored tensors, a tied lm_head.weight included
  std::map<std::string, size_t> dtype_tensors;  // "BF16" -> tensors stored as it
  uint64_t data_bytes = 0;                      // tensor bytes (the index's total_size)
  std::vector<File> weight_files;               // safetensors files, then the index if any
  size_t shards = 0;                            // safetensors files
  bool tied_lm_head_stored = false;  // tied, yet lm_head.weight is stored (equal to the embedding)
  std::vector<std::string> other_files;  // generation config and tokenizer files present
};

// The folder `path` (or the folder of the config.json `path`); the weights are validated against
// config.json as a load would (names, shapes, dtypes), without reading the tensor data.
HfFolderInfo inspect_hf_folder(const std::string& path);

}  // namespace titan
