#include "titan/models/hf_info.h"

#include <filesystem>

#include "titan/core/error.h"
#include "titan/io/safetensors.h"
#include "titan/models/hf_checkpoint.h"
#include "titan/models/hf_config.h"
#include "titan/models/hf_export.h"

namespace titan {
namespace fs = std::filesystem;

HfFolderInfo inspect_hf_folder(const std::string& path) {
  HfFolderInfo info;
  TITAN_CHECK(fs::exists(path), path, ": no such model folder");
  const fs::path dir = fs::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
  info.dir = dir.string();
  const std::string config = (dir / "config.json").string();
  info.args = read_hf_config(config);
  info.counts = count_parameters(info.args);

  const SafetensorsCheckpoint checkpoint = SafetensorsCheckpoint::open(info.dir);
  match_hf_checkpoint(info.args, checkpoint, config);
  info.tensors = checkpoint.size();
  info.data_bytes = checkpoint.data_bytes();
  info.tied_lm_head_stored =
      info.args.tie_word_embeddings && checkpoint.find("lm_head.weight") != nullptr;
  for (const SafetensorsFile& file : checkpoint.files()) {
    info.weight_files.push_back(
        {fs::path(file.path()).filename().string(), static_cast<uint64_t>(file.file_size())});
    for (const SafetensorsEntry& e : file.entries())
      ++info.dtype_tensors[std::string(e.dtype_name)];
  }
  info.shards = info.weight_files.size();
  if (checkpoint.path().ends_with(".json")) {
    info.weight_files.push_back({fs::path(checkpoint.path()).filename().string(),
                                 static_cast<uint64_t>(fs::file_size(checkpoint.path()))});
  }
  std::vector<std::string> others = {"generation_config.json"};
  others.insert(others.end(), hf_tokenizer_files().begin(), hf_tokenizer_files().end());
  for (const std::string& name : others) {
    if (fs::is_regular_file(dir / name)) info.other_files.push_back(name);
  }
  return info;
}

}  // namespace titan
