#include "titan/train/resume.h"

#include <cstdio>

#include "titan/core/error.h"

namespace titan {

std::optional<ResumePoint> find_resume_checkpoint(const std::string& folder,
                                                  const std::vector<ParamGroupSpec>& specs,
                                                  const JobConfig::Checkpoint& ck,
                                                  int64_t training_steps) {
  // checkpoint.load_step without checkpoint.enable is refused by job_config_unused_keys.
  if (!ck.enable) return std::nullopt;
  std::string model_only_dir;  // a newer model-only checkpoint passed over
  std::vector<std::pair<std::string, std::string>> unusable;  // (step-N, why), newest first
  for (int64_t step : list_training_checkpoints(folder)) {
    if (ck.load_step >= 0 && step != ck.load_step) continue;
    const std::string dir = training_checkpoint_dir(folder, step);
    try {
      const TrainerState saved = read_trainer_state(dir);
      TITAN_CHECK(saved.step == step, dir, "/trainer_state.json says step ", saved.step);
      // A model-only checkpoint ends a run; it can stand for that run only once it is complete.
      if (saved.model_only && step < training_steps) {
        TITAN_CHECK(ck.load_step < 0, dir,
                    " holds model weights only (checkpoint.last_save_model_only) and cannot "
                    "continue training to step ",
                    training_steps);
        std::printf(
            "%s holds model weights only (checkpoint.last_save_model_only); looking for an older "
            "full checkpoint to continue to step %lld\n",
            dir.c_str(), static_cast<long long>(training_steps));
        if (model_only_dir.empty()) model_only_dir = dir;
        continue;
      }
      check_training_checkpoint(
          dir, specs, saved.model_only ? CheckpointContent::model_only : CheckpointContent::full);
      // Said only now: when none is usable the run stops with one line instead.
      for (const auto& [name, why] : unusable) {
        std::fprintf(stderr, "warning: checkpoint %s is unusable (%s); using %s\n", name.c_str(),
                     why.c_str(), dir.c_str());
      }
      return ResumePoint{dir, saved};
    } catch (const Error& e) {
      TITAN_CHECK(ck.load_step < 0, "checkpoint.load_step ", ck.load_step, ": ", e.what());
      unusable.emplace_back("step-" + std::to_string(step), e.what());
    }
  }
  TITAN_CHECK(ck.load_step < 0, "checkpoint.load_step ", ck.load_step, ": no step-", ck.load_step,
              " under ", folder);
  TITAN_CHECK(model_only_dir.empty(), model_only_dir,
              " holds model weights only and no full checkpoint precedes it; to start a new run "
              "from its weights, set checkpoint.initial_load_path to it with "
              "checkpoint.initial_load_in_hf = false and another job.dump_folder");
  if (!unusable.empty()) {
    std::string names;
    for (const auto& [name, why] : unusable) names += (names.empty() ? "" : ", ") + name;
    TITAN_CHECK(ck.allow_fresh_start, folder, ": none of its ", unusable.size(), " checkpoint(s) (",
                names, ") can be resumed; ", unusable.front().first, ": ", unusable.front().second,
                "; fix or move them away, or set checkpoint.allow_fresh_start = true to start a "
                "new run from step 1 beside them");
    std::fprintf(stderr,
                 "warning: %s: none of its checkpoints (%s) can be resumed; starting a new run "
                 "(checkpoint.allow_fresh_start)\n",
                 folder.c_str(), names.c_str());
  }
  return std::nullopt;
}

std::string model_weights_line(const JobConfig& c, const std::optional<ResumePoint>& resume) {
  const JobConfig::Checkpoint& ck = c.checkpoint;
  const std::string frozen = c.lora.rank > 0 ? "; frozen: LoRA trains an adapter" : "";
  if (resume) return "model weights: from " + resume->dir + " (resuming)";
  const std::string& initial = ck.initial_load_path;
  if (!initial.empty() && ck.initial_load_in_hf) {
    return "model weights: from " + initial + " (Hugging Face folder" + frozen + ")";
  }
  if (!initial.empty() && ck.initial_load_model_only) {
    return "model weights: from " + initial + " (titan checkpoint, model weights only" + frozen +
           ")";
  }
  if (!initial.empty()) return "model weights: from " + initial + " (resuming)";
  const std::string dims_only = c.model.flavor == "hf"
                                    ? "; model.flavor \"hf\" takes only the dims of " +
                                          c.model.hf_assets_path +
                                          "/config.json: checkpoint.initial_load_path loads weights"
                                    : "";
  return "model weights: random init (HF init, seed " + std::to_string(c.training.seed) +
         dims_only + frozen + ")";
}

}  // namespace titan
