#include "titan/train/checkpoint_export.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include "titan/core/error.h"
#include "titan/models/hf_config.h"
#include "titan/models/state_dict_adapter.h"

namespace titan {
namespace fs = std::filesystem;

void refuse_dcp_checkpoint(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (!fs::is_directory(path, ec) || !fs::is_regular_file(fs::path(path) / ".metadata", ec)) return;
  std::string shard;
  for (const auto& entry : fs::directory_iterator(path, ec)) {
    if (entry.path().extension() == ".distcp") {
      shard = entry.path().filename().string();
      break;
    }
  }
  if (shard.empty()) return;
  fail(what, " ", path, " is a torchtitan DCP checkpoint (.metadata, ", shard,
       "), which titan does not read: export it as a Hugging Face folder with torchtitan's "
       "scripts/checkpoint_conversion/convert_to_hf.py (or train with checkpoint.last_save_in_hf "
       "= true) and give titan that folder");
}

CheckpointExport export_training_checkpoint(const std::string& dir, const std::string& dst,
                                            HfExportOptions options, bool allow_nonfinite) {
  TITAN_CHECK(is_training_checkpoint(dir), dir,
              ": not a titan training checkpoint (no trainer_state.json)");
  const fs::path config = fs::path(dir) / "config.json";
  TITAN_CHECK(fs::is_regular_file(config), dir,
              ": a checkpoint saved by a titan from before checkpoints carried config.json; export "
              "it by resuming its run with checkpoint.last_save_in_hf = true");
  CheckpointExport result;
  result.args = read_hf_config(config.string());
  const std::vector<ParamGroupSpec> specs = model_param_specs(result.args);
  std::vector<ParamGroup> groups = make_param_groups(result.args);
  result.state = load_training_checkpoint(dir, specs, groups, Shard{},
                                          CheckpointContent::model_only, allow_nonfinite);
  options.source_dir = dir;
  if (const fs::path job = fs::path(dir) / kJobConfigFile; fs::is_regular_file(job)) {
    std::ifstream in(job, std::ios::binary);
    options.job_config_toml.assign(std::istreambuf_iterator<char>(in),
                                   std::istreambuf_iterator<char>());
    TITAN_CHECK(!in.bad(), job.string(), ": read failed");
  }
  export_hf_folder(dst, result.args, groups, options);
  return result;
}

}  // namespace titan
