#include "titan/train/preflight.h"

#include <filesystem>

#include "titan/core/error.h"
#include "titan/data/dataset_read.h"
#include "titan/data/tokenizer_train.h"
#include "titan/io/atomic_dir.h"
#include "titan/models/hf_checkpoint.h"
#include "titan/models/state_dict_adapter.h"
#include "titan/train/checkpoint.h"
#include "titan/train/lora_job.h"

namespace titan {

DataSources resolve_data_sources(const JobConfig& c) {
  DataSources d;
  if (c.training.dataset == "default") {
    d.train = {default_corpus()};
    d.tokenizer =
        c.model.hf_assets_path.empty() ? ensure_default_tokenizer() : c.model.hf_assets_path;
  } else {
    TITAN_CHECK(!c.training.dataset_path.empty(), "training.dataset '", c.training.dataset,
                "' needs training.dataset_path (files, a folder or a glob)");
    TITAN_CHECK(!c.model.hf_assets_path.empty(),
                "training.dataset_path needs a tokenizer: set model.hf_assets_path to a folder "
                "holding tokenizer.json");
    d.train = {c.training.dataset_path};
    d.tokenizer = c.model.hf_assets_path;
  }
  if (c.validation.enable) {
    TITAN_CHECK(!c.validation.dataset_path.empty(),
                "validation.enable needs validation.dataset_path (held-out files)");
    d.validation = {c.validation.dataset_path};
  }
  return d;
}

ChatTemplate load_chat_template(const std::string& dir) {
  try {
    return ChatTemplate::load(dir);
  } catch (const Error& e) {
    fail(
        "training.dataset = \"chat\" renders conversations with the chat template of "
        "model.hf_assets_path: ",
        e.what());
  }
}

void check_inputs(const DataSources& d) {
  const auto check = [](const std::vector<std::string>& paths, const char* key) {
    if (paths.empty()) return;  // validation off
    try {
      expand_data_paths(paths);
    } catch (const Error& e) {
      fail(key, ": ", e.what());
    }
  };
  check(d.train, "training.dataset_path");
  check(d.validation, "validation.dataset_path");
}

void check_outputs(const JobConfig& c, const DataSources& d) {
  if (!c.checkpoint.enable && !c.checkpoint.last_save_in_hf) return;
  ensure_writable_folder(c.job.dump_folder, "job.dump_folder");
  if (c.checkpoint.enable) {
    ensure_writable_folder(c.job.dump_folder + "/" + c.checkpoint.folder, "checkpoint.folder");
  }
  if (!c.checkpoint.last_save_in_hf) return;
  const std::string hf = job_export_dir(c);
  check_destination_apart(hf, c.model.hf_assets_path, "model.hf_assets_path");
  check_destination_apart(hf, c.checkpoint.initial_load_path, "checkpoint.initial_load_path");
  check_destination_apart(hf, d.tokenizer, "the tokenizer folder");
  for (const std::vector<std::string>* paths : {&d.train, &d.validation}) {
    if (paths->empty()) continue;
    for (const std::string& path : expand_data_paths(*paths)) {
      check_destination_apart(hf, path, "the dataset file");
    }
  }
  check_atomic_dir_destination(hf, job_export_content(c), true);
}

void check_initial_weights(const JobConfig::Checkpoint& ck, const ModelArgs& args) {
  const std::string& initial = ck.initial_load_path;
  if (initial.empty()) return;
  if (ck.initial_load_in_hf) {
    TITAN_CHECK(ck.initial_load_model_only,
                "checkpoint.initial_load_in_hf = true loads model weights only (a Hugging Face "
                "folder holds no optimizer state); set checkpoint.initial_load_model_only = true");
    match_hf_checkpoint(args, SafetensorsCheckpoint::open(initial), "the model's config");
    return;
  }
  TITAN_CHECK(std::filesystem::exists(initial + "/trainer_state.json") ||
                  !std::filesystem::exists(initial + "/config.json"),
              "checkpoint.initial_load_path ", initial,
              " is a Hugging Face folder; set checkpoint.initial_load_in_hf = true to load it");
  check_training_checkpoint(
      initial, model_param_specs(args),
      ck.initial_load_model_only ? CheckpointContent::model_only : CheckpointContent::full);
}

}  // namespace titan
