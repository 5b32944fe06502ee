// The keys a config sets that do nothing in its job: refused where the user plainly meant them to
// (a dataset path with the built-in corpus), one warning line each otherwise, torchtitan's inert
// keys grouped by reason.
#include <algorithm>
#include <utility>

#include "titan/backend/backend.h"
#include "titan/core/error.h"
#include "titan/train/job_config.h"
#include "titan/train/job_config_torchtitan.h"

namespace titan {

std::vector<std::string> job_config_unused_keys(const JobConfig& c) {
  const auto is_set = [&](const char* key) { return job_config_key_set(c, key); };
  TITAN_CHECK(!is_set("training.dataset_path") || c.training.dataset != "default",
              "training.dataset_path is set but training.dataset is \"default\" (the built-in "
              "Jargon File): set training.dataset to \"chat\" for conversations, or to a name "
              "for your documents (any other name), for training.dataset_path to be read");
  TITAN_CHECK(!is_set("checkpoint.load_step") || c.checkpoint.enable,
              "checkpoint.load_step is set but checkpoint.enable is false: set "
              "checkpoint.enable = true to resume from step ",
              c.checkpoint.load_step);
  std::vector<std::string> warnings;
  for (const std::string& old_name : c.renamed_keys) {
    warnings.push_back(old_name + " is torchtitan's older place for it: read as parallelism." +
                       old_name.substr(old_name.find('.') + 1) + " (move it to [parallelism])");
  }
  const auto unused = [&](std::initializer_list<const char*> keys, bool ignored,
                          const std::string& remedy) {
    if (!ignored) return;
    for (const char* key : keys) {
      if (is_set(key)) warnings.push_back(std::string(key) + " has no effect: " + remedy);
    }
  };
  unused({"validation.dataset_path", "validation.freq", "validation.steps"}, !c.validation.enable,
         "validation.enable is false");
  unused({"training.truncate_long_conversations", "training.dataset_packing"},
         c.training.dataset != "chat",
         "training.dataset is not \"chat\" (documents are packed, never refused for length)");
  unused({"metrics.save_tb_folder"}, !c.metrics.enable_tensorboard,
         "metrics.enable_tensorboard is false");
  unused({"profiling.save_traces_folder", "profiling.profile_freq", "profiling.profiler_active"},
         !c.profiling.enable_profiling, "profiling.enable_profiling is false");
  unused({"validation.dataset"}, true,
         "validation reads validation.dataset_path (any format), the name is not used");
  unused(
      {"checkpoint.folder", "checkpoint.interval", "checkpoint.keep_latest_k",
       "checkpoint.last_save_model_only", "checkpoint.allow_fresh_start", "checkpoint.async_mode"},
      !c.checkpoint.enable, "checkpoint.enable is false");
  unused({"checkpoint.initial_load_model_only", "checkpoint.initial_load_in_hf"},
         c.checkpoint.initial_load_path.empty(), "checkpoint.initial_load_path is not set");
  unused({"checkpoint.export_dtype"}, !c.checkpoint.last_save_in_hf,
         "checkpoint.last_save_in_hf is false (no Hugging Face folder is exported)");
  unused({"lr_scheduler.decay_ratio", "lr_scheduler.min_lr_factor"},
         c.lr_scheduler.decay_type == "none",
         "lr_scheduler.decay_type is \"none\" (set linear, cosine or sqrt to decay)");
  unused({"training.allow_tf32"}, parse_device_name(c.training.device).kind == DeviceKind::cpu,
         "training.device is the CPU, which has no TF32 (its fp32 GEMMs stay fp32)");
  unused({"training.deterministic"}, !c.training.deterministic,
         "titan's kernels are deterministic for a given thread count whatever its value");
  unused({"lora.alpha", "lora.dropout", "lora.target_modules", "lora.merge_on_export",
          "lora.initial_adapter", "lora.base_dtype"},
         c.lora.rank == 0, "lora.rank is 0 (set a rank to train a LoRA adapter)");
  // torchtitan's own TOMLs carry an option beside mode = "full", which ignores it; beside "none"
  // it says the mode was meant to be selective.
  TITAN_CHECK(!is_set("activation_checkpoint.selective_ac_option") ||
                  c.activation_checkpoint.mode != "none",
              "activation_checkpoint.selective_ac_option = \"",
              c.activation_checkpoint.selective_ac_option,
              "\" is set but activation_checkpoint.mode is \"none\": set mode = \"selective\" for "
              "it to count");
  unused({"activation_checkpoint.selective_ac_option"}, c.activation_checkpoint.mode == "full",
         "activation_checkpoint.mode is \"full\" (every layer is recomputed; the option counts "
         "under \"selective\")");
  // torchtitan's keys titan does not act on: one line per reason, naming every key given.
  std::vector<std::pair<const char*, std::string>> inert;
  for (const std::string& key : c.inert_keys) {
    const char* reason = torchtitan_inert_key_reason(key);
    auto it =
        std::find_if(inert.begin(), inert.end(), [&](const auto& r) { return r.first == reason; });
    if (it == inert.end()) {
      inert.emplace_back(reason, key);
    } else {
      it->second += ", " + key;
    }
  }
  for (const auto& [reason, keys] : inert) {
    warnings.push_back(keys + (keys.find(',') == std::string::npos ? " has" : " have") +
                       " no effect here: " + reason);
  }
  // A folder given without naming a model is fine-tuned (train/job_finetune.h) and leaves here
  // with flavor "hf"; a named flavor keeps the folder to its tokenizer.
  if (is_set("model.hf_assets_path") && c.model.flavor != "hf") {
    warnings.push_back(
        "model.hf_assets_path gives only the tokenizer: the model's dims come from "
        "flavor '" +
        c.model.flavor +
        "' and its weights are random (name no flavor nor preset to fine-tune the folder's "
        "weights; model.flavor = \"hf\" reads only its config.json)");
  }
  return warnings;
}

}  // namespace titan
