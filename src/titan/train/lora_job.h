// What `titan train` does differently with [lora] (models/lora.h): the adapter built from the
// config, attached to the model (whose weights it freezes), started from PEFT's init or from a
// PEFT adapter folder, and exported as a PEFT adapter folder or merged into the model.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "titan/models/causal_lm.h"
#include "titan/models/lora.h"
#include "titan/models/state_dict_adapter.h"
#include "titan/nn/shard.h"
#include "titan/train/job_config.h"

namespace titan {

// The adapter the config asks for (lora.rank > 0).
LoraOptions job_lora_options(const JobConfig& config);
// What a LoRA run cannot do, refused before anything is read or allocated with one line naming
// the key: a titan checkpoint as the initial weights (the base comes from a Hugging Face folder or
// the seeded init). Also titan plan's.
void check_lora_config(const JobConfig& config);
// check_lora_config, and a lora.initial_adapter that is not a PEFT adapter of this config's rank,
// alpha and targets.
void check_lora_job(const JobConfig& config);
// The adapter attached to `model` (its weights frozen), with a line saying what trains.
// `sharded`: FSDP shards the frozen model (then the experts' LoRA is refused under bf16: its
// merge reads the fp32 expert weights, which bf16 units gather only as their bf16 copies).
std::unique_ptr<LoraAdapter> attach_job_lora(const JobConfig& config, const ModelArgs& args,
                                             CausalLM& model, bool sharded);
// The frozen model's weights from checkpoint.initial_load_path (a Hugging Face folder) into
// `model_groups` (this rank's cut `model_cut` of them: Parallelism::model_groups), the same
// whether the adapter starts or resumes (else the seeded init stays), and when `starting`,
// lora.initial_adapter read into `adapter` (else PEFT's init, already made, stays).
void load_lora_run_weights(const JobConfig& config, const ModelArgs& args,
                           std::vector<ParamGroup>& model_groups, Shard model_cut,
                           LoraAdapter& adapter, bool starting);
// Where the run's last save goes: job.dump_folder/adapter (a PEFT adapter folder) for a LoRA run
// that does not merge, else job.dump_folder/hf; and what kind of folder it is (io/atomic_dir.h).
std::string job_export_dir(const JobConfig& config);
std::string job_export_content(const JobConfig& config);
// The LoRA run's export, on every rank (the adapter's values checked finite first, as the model's
// are; the adapter is whole on each): the PEFT adapter folder, written by the rank that `writes`,
// or with lora.merge_on_export the model with W + scaling B A written by `export_model` (which
// merges each run of weights as it is gathered: merge_lora_into).
void export_lora(const JobConfig& config, const LoraAdapter& adapter, const std::string& base_model,
                 bool writes, const std::function<void()>& export_model);

}  // namespace titan
