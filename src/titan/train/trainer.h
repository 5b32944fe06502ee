// `titan train`: builds the model, data and optimizer a JobConfig describes, restores the newest
// checkpoint (or the initial weights), and runs the loop. The loop itself is short on purpose:
// every concern -- data, loss scaling, clipping, schedule, metrics, checkpoints -- is one call.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "titan/data/loader.h"
#include "titan/data/tokenizer.h"
#include "titan/distributed/mesh.h"
#include "titan/io/folder_lock.h"
#include "titan/models/causal_lm.h"
#include "titan/train/async_checkpoint.h"
#include "titan/train/evaluate.h"
#include "titan/train/job_config.h"
#include "titan/train/lr_schedule.h"
#include "titan/train/metrics.h"
#include "titan/train/optimizer.h"
#include "titan/train/parallelism.h"
#include "titan/train/resume.h"

namespace titan {

struct TrainResult {
  int64_t first_step = 0;  // the first step this run executed (1, or resumed step + 1)
  int64_t last_step = 0;
  double first_loss = 0.0;  // loss of first_step
  double last_loss = 0.0;
};

class Trainer {
 public:
  // Everything that can be checked before training is checked here: config values, the model's
  // arguments, batch divisibility, seq_len against the model's positions, files.
  explicit Trainer(const JobConfig& config);
  ~Trainer();
  TrainResult run();

 private:
  struct StepOutcome {
    double loss = 0.0;
    double grad_norm = 0.0;
    double data_time_s = 0.0;
  };
  StepOutcome train_step(int64_t step);
  EvalResult validate();
  // model_only: parameters only (checkpoint.last_save_model_only, for the last step). With
  // checkpoint.async_mode, staged and written in the background (train/async_checkpoint.h).
  void save_checkpoint(int64_t step, bool model_only);
  // The asynchronous save started last, written and committed on every rank (nothing without
  // one pending): at the end of training.
  void finish_async_checkpoint();
  // The trained model as a Hugging Face folder (checkpoint.last_save_in_hf), on every rank: rank 0
  // writes it, under FSDP gathering one run of a unit's parameters at a time from the shards.
  void export_model();
  void restore();
  // The training loader's state as the job's: its position (every rank's is the same) and the
  // conversations cut in every rank's rows (summed over the ranks: a collective).
  LoaderState loader_state() const;
  // Rank 0: job.dump_folder created if need be and locked (io/folder_lock.h) for the run.
  void lock_dump_folder();
  std::string checkpoint_folder() const;
  // What optimizer state lives in and checkpoints hold (Parallelism::state_groups, state_cut):
  // with LoRA, the adapter's groups (the model's are frozen and come from the initial weights).
  std::vector<ParamGroup>& state_groups();
  std::vector<ParamGroupSpec> state_specs() const;
  Shard state_cut() const;

  JobConfig config_;
  // Rank 0's lock on job.dump_folder while the run writes into it (io/folder_lock.h); declared
  // first, so released last.
  std::unique_ptr<FolderLock> dump_lock_;
  std::unique_ptr<DeviceMesh> mesh_;  // the data-parallel ranks (one without mpirun)
  ModelArgs args_;
  std::string tokenizer_dir_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::optional<ResumePoint> resume_;  // chosen before the model is allocated
  ParallelizePlan plan_;               // this rank's model's (Parallelism::plan)
  std::unique_ptr<CausalLM> model_;
  std::unique_ptr<LoraAdapter> lora_;  // with lora.rank > 0 (train/lora_job.h)
  std::unique_ptr<Parallelism> parallelism_;
  std::unique_ptr<AdamWOptimizer> optimizer_;  // over parallelism_'s state groups
  std::unique_ptr<DataLoader> loader_;
  // With checkpoint.async_mode "async" or "async_with_pinned_mem"; declared after what its
  // background write reads (config_, args_), so destroyed (joined) before them.
  std::unique_ptr<AsyncCheckpointer> async_checkpoints_;
  LoaderOptions loader_options_;
  int64_t resumed_truncated_ = 0;  // LoaderState::truncated of the state the loader started from
  std::vector<std::string> validation_paths_;
  LrSchedule schedule_;
  int64_t accumulation_steps_ = 1;
  int64_t start_step_ = 0;     // steps already done (resumed)
  int64_t skipped_steps_ = 0;  // non-finite steps skipped (training.skip_nonfinite_steps)
};

}  // namespace titan
