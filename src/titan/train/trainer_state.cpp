// The Trainer's state on disk: the checkpoint it resumes from (restore), the ones it saves
// (synchronous or async), and the final Hugging Face export -- apart from the loop (trainer.cpp).
#include "titan/train/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "titan/backend/backend.h"
#include "titan/core/allocator.h"
#include "titan/core/clock.h"
#include "titan/core/error.h"
#include "titan/core/profile.h"
#include "titan/core/suggest.h"
#include "titan/data/dataset_chat.h"
#include "titan/data/dataset_read.h"
#include "titan/data/tokenizer_train.h"
#include "titan/distributed/world.h"
#include "titan/io/atomic_dir.h"
#include "titan/models/flops.h"
#include "titan/models/hf_checkpoint.h"
#include "titan/models/hf_export.h"
#include "titan/models/nonfinite_weights.h"
#include "titan/models/peft_adapter.h"
#include "titan/models/registry.h"
#include "titan/nn/host_params.h"
#include "titan/train/checkpoint.h"
#include "titan/train/job_resolve.h"
#include "titan/train/lora_job.h"
#include "titan/train/preflight.h"
#include "titan/train/profiling.h"
#include "titan/train/rank_agreement.h"
#include "titan/train/run_record.h"
namespace titan {

std::string Trainer::checkpoint_folder() const {
  return config_.job.dump_folder + "/" + config_.checkpoint.folder;
}

std::vector<ParamGroup>& Trainer::state_groups() {
  return parallelism_->state_groups();
}

std::vector<ParamGroupSpec> Trainer::state_specs() const {
  if (config_.lora.rank > 0) return lora_param_specs(args_, job_lora_options(config_));
  return model_param_specs(args_);
}

Shard Trainer::state_cut() const {
  return parallelism_->state_cut();
}

void Trainer::restore() {
  const JobConfig::Checkpoint& ck = config_.checkpoint;
  std::optional<LoaderState> loader_state;
  const auto resume_from = [&](const TrainerState& state, const std::string& dir) {
    loader_state = LoaderState::from_json(state.loader_state);
    optimizer_->set_step_count(state.optimizer_step);
    start_step_ = state.step;
    std::printf("resumed step %lld from %s%s\n", static_cast<long long>(state.step), dir.c_str(),
                state.model_only ? " (model weights only: the run is already complete)" : "");
  };
  const std::vector<ParamGroupSpec> specs = state_specs();
  // On a device the loaders write host copies, copied in after (nn/host_params.h).
  const auto load = [&](const std::string& dir, CheckpointContent content) {
    TrainerState state;
    write_params_on_host(
        state_groups(), content == CheckpointContent::full, [&](std::vector<ParamGroup>& groups) {
          state = load_training_checkpoint(dir, specs, groups, state_cut(), content,
                                           ck.allow_nonfinite_weights, plan_);
        });
    return state;
  };
  if (resume_) {
    resume_from(load(resume_->dir, resume_->state.model_only ? CheckpointContent::model_only
                                                             : CheckpointContent::full),
                resume_->dir);
  }
  const std::string& initial = ck.initial_load_path;
  if (lora_) {
    load_lora_run_weights(config_, args_, parallelism_->model_groups(), parallelism_->model_cut(),
                          plan_, *lora_, start_step_ == 0, *model_);
  } else if (start_step_ == 0 && !initial.empty()) {
    if (ck.initial_load_in_hf) {  // checked by check_initial_weights
      write_params_on_host(state_groups(), false, [&](std::vector<ParamGroup>& groups) {
        load_hf_weights(args_, groups, initial, "the model's config", ck.allow_nonfinite_weights,
                        state_cut(), {}, plan_);
      });
    } else if (ck.initial_load_model_only) {
      const TrainerState state = load(initial, CheckpointContent::model_only);
      std::printf("initial weights from %s (titan checkpoint of step %lld, model weights only)\n",
                  initial.c_str(), static_cast<long long>(state.step));
    } else {
      resume_from(load(initial, CheckpointContent::full), initial);
    }
  } else if (start_step_ > 0 && !initial.empty()) {
    std::printf("checkpoint.initial_load_path %s not used: resuming takes precedence\n",
                initial.c_str());
  }
  // One stream of batches for every rank; each tokenizes what its rows need (data/loader.h).
  LoaderOptions options = loader_options_;
  const int64_t dp = mesh_->dims().dp();
  options.share = {accumulation_steps_ * dp, mesh_->dp_rank() * accumulation_steps_,
                   accumulation_steps_};
  if (dp > 1) {
    // Packed text or conversations: the ranks sum the lengths of the documents each tokenized,
    // inside next_batch (the same call on every rank), so that each tokenizes only what its rows
    // need.
    Communicator& group = parallelism_->data_parallel_group();
    options.sum_over_ranks = [&group](double* values, int64_t count) {
      group.all_reduce_sum(values, count);
    };
  }
  resumed_truncated_ = loader_state ? loader_state->truncated : 0;
  loader_ = std::make_unique<DataLoader>(options, *tokenizer_, loader_state);
}

LoaderState Trainer::loader_state() const {
  LoaderState state = loader_->state();
  // Each rank counted the conversations cut in its own rows since the state it started from.
  double cut = static_cast<double>(state.truncated - resumed_truncated_);
  if (mesh_->dims().dp() > 1) parallelism_->data_parallel_group().all_reduce_sum(&cut, 1);
  state.truncated = resumed_truncated_ + static_cast<int64_t>(cut);
  return state;
}

void Trainer::save_checkpoint(int64_t step, bool model_only) {
  TrainerState state;
  state.step = step;
  state.model_only = model_only;
  state.optimizer_step = optimizer_->step_count();
  state.loader_state = loader_state().to_json();
  state.seed = config_.training.seed;
  // One writer per distinct cut of the state: rank 0 for replicated parameters (one process,
  // DDP), replica 0's shard ranks under FSDP and HSDP. Rank 0 begins and commits; every rank
  // waits for the commit, so none runs ahead of a checkpoint it might resume from, and waits as
  // long as for start-up, not one step.
  set_collective_timeout(config_.comm.init_timeout_seconds, "init_timeout_seconds");
  const std::string folder = checkpoint_folder();
  const std::vector<ParamGroupSpec> specs = state_specs();
  Communicator& world = mesh_->world();
  if (async_checkpoints_) {
    // The save before is written and committed first; this one is staged, then written in the
    // background while the next steps run.
    const double t0 = now_seconds();
    async_checkpoints_->finish();
    AsyncCheckpointer::Save save;
    save.folder = folder;
    save.specs = specs;
    save.cut = parallelism_->checkpoint_cut();
    save.writes_shard = parallelism_->writes_checkpoint();
    save.state = std::move(state);
    save.keep_latest_k = config_.checkpoint.keep_latest_k;
    save.write_record = [this](const std::string& temp_dir) {
      write_checkpoint_record(temp_dir, config_, args_, tokenizer_dir_);
    };
    if (parallelism_->gathers_checkpoint()) {
      // Under TP and EP the gathers are collectives: they run here, on the training thread. What
      // they fill on rank 0 is Parallelism's own and untouched until the next save's gathers,
      // which come after finish(): the background thread writes from it, no staging copy.
      async_checkpoints_->start_gathered(
          std::move(save), parallelism_->checkpoint_source(model_only, /*all_now=*/true).groups);
    } else {
      async_checkpoints_->start(std::move(save), state_groups());
    }
    if (world.rank() == 0) {
      std::printf("checkpoint %s: state staged in %.3f s, writing in the background%s\n",
                  training_checkpoint_dir(folder, step).c_str(), now_seconds() - t0,
                  model_only ? " (model weights only)" : "");
      std::fflush(stdout);
    }
    set_collective_timeout(config_.comm.train_timeout_seconds, "train_timeout_seconds");
    return;
  }
  const double t0 = now_seconds();
  // Under TP and EP each tensor gathered onto rank 0 just before it is written (every rank of
  // the gathers follows the writer's order).
  const Parallelism::CheckpointSource source =
      parallelism_->checkpoint_source(model_only, /*all_now=*/false);
  if (world.rank() == 0) begin_training_checkpoint(folder, step);
  world.barrier();
  const std::string temp_dir = training_checkpoint_temp_dir(folder, step);
  if (parallelism_->writes_checkpoint()) {
    write_checkpoint_shard(temp_dir, specs, source.groups, parallelism_->checkpoint_cut(),
                           model_only, /*show_progress=*/true, source.gather);
  } else if (source.gather) {
    for (const CheckpointTensor& t : checkpoint_read_order(specs, model_only)) source.gather(t);
  }
  parallelism_->end_checkpoint();
  world.barrier();
  if (world.rank() == 0) {
    write_checkpoint_record(temp_dir, config_, args_, tokenizer_dir_);
    commit_training_checkpoint(folder, temp_dir, specs, parallelism_->checkpoint_cut().count, state,
                               config_.checkpoint.keep_latest_k);
    const std::string dir = training_checkpoint_dir(folder, step);
    std::printf("checkpoint saved: %s (%s%s)\n", dir.c_str(), saved_folder_summary(dir, t0).c_str(),
                model_only ? ", model weights only" : "");
    std::fflush(stdout);
  }
  world.barrier();
  set_collective_timeout(config_.comm.train_timeout_seconds, "train_timeout_seconds");
}

void Trainer::finish_async_checkpoint() {
  if (!async_checkpoints_) return;
  set_collective_timeout(config_.comm.init_timeout_seconds, "init_timeout_seconds");
  async_checkpoints_->finish();
  set_collective_timeout(config_.comm.train_timeout_seconds, "train_timeout_seconds");
}

void Trainer::export_model() {
  const bool writes = mesh_->world().rank() == 0;
  const bool allow = config_.checkpoint.allow_nonfinite_weights;
  HfExportOptions options;
  options.dtype = parse_export_dtype(config_.checkpoint.export_dtype);
  options.source_dir = tokenizer_dir_;
  options.overwrite = true;
  options.job_config_toml = job_config_to_toml(config_);
  const std::string dir = job_export_dir(config_);
  const auto export_model = [&] {
    // Skipped non-finite steps can still leave weights that are; they are not exported as a
    // model. Scanned where each rank holds them, with the same verdict on every rank.
    const NonfiniteScan scan = parallelism_->scan_model("the trained model");
    if (writes || !allow) scan.check(allow);  // one warning, every rank's error
    if (!parallelism_->takes_part_in_export()) return;
    const double t0 = now_seconds();
    // A run at a time: gathered onto the writing rank (under FSDP), LoRA merged into it there.
    const auto gather = [&](const ExportRun& run) {
      parallelism_->gather_for_export(run);
      if (lora_ && writes) merge_lora_into(*lora_, model_->param_groups()[run.group], run.params);
    };
    if (writes) {
      memory_reset_peak();  // the export's own peak (the run's is in the summary above)
      export_hf_folder(dir, args_, parallelism_->export_groups(), options, gather);
      std::printf("exported the model as a Hugging Face folder%s: %s (%s)\n",
                  lora_ ? ", the LoRA adapter merged into its weights" : "", dir.c_str(),
                  saved_folder_summary(dir, t0).c_str());
      // What titan plan predicts as the final export's peak (tests/e2e/plan_memory.sh).
      std::printf("the export's peak memory on rank 0: %zu bytes\n", memory_stats().total_peak);
    } else {
      for (const ExportRun& run : hf_export_runs(args_, options)) gather(run);
    }
    parallelism_->end_export();
  };
  if (lora_) {
    // A base held only in bf16 is scanned, merged and written from fp32 masters (exact widening).
    if (config_.lora.merge_on_export && lora_base_in_bf16(config_)) {
      parallelism_->widen_bf16_base();
    }
    const std::string& base = config_.checkpoint.initial_load_path;
    AdapterTensorGather gather;  // under TP: the adapter's cuts gathered a tensor at a time
    if (mesh_->dims().tp > 1) {
      gather = [this](size_t group, const std::string& param, float* whole) {
        parallelism_->gather_trained(group, param, whole);
      };
    }
    export_lora(config_, *lora_, base.empty() ? tokenizer_dir_ : base, writes,
                parallelism_->scan_trained("the trained adapter"), export_model, gather);
  } else {
    export_model();
  }
}

}  // namespace titan
