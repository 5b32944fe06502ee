// What `titan train` does differently with [lora] (models/lora.h): the adapter built from the
// config, attached to the model (whose weights it freezes), started from PEFT's init or from a
// PEFT adapter folder, and exported as a PEFT adapter folder or merged into the model.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "titan/models/causal_lm.h"
#include "titan/models/lora.h"
#include "titan/models/nonfinite_weights.h"
#include "titan/models/peft_adapter.h"
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
// lora.base_dtype = "bfloat16": the frozen base held only as bf16 (its matmul weights).
bool lora_base_in_bf16(const JobConfig& config);
// Where lora.base_dtype = "bfloat16" cannot hold, refused with one line naming the key, once the
// model `args` are resolved: without a Hugging Face folder to load the base from (a random base is
// made in fp32), and with the experts of a MoE model adapted (ExpertLora merges their fp32 weights
// at each step, which a bf16-only base does not hold). (Under tensor parallel it is refused:
// train/job_resolve.h.)
void check_lora_base_dtype(const JobConfig& config, const ModelArgs& args);
// Under bf16 compute, `model`'s frozen weights read only in bf16 held only as the bf16 copies its
// matmuls read (CausalLM::hold_compute_copies): their fp32 masters handed back, the copies of
// every group committed at once and never rounded again. Before any weight is loaded (the values
// are undefined until load_lora_run_weights); the norms, the embedding (its lookup) and biases
// stay fp32.
void hold_lora_base_in_bf16(CausalLM& model);
// The adapter attached to `model` (its weights frozen), with a line saying what trains. Before
// FSDP shards the model: the experts LoRA adapts are then gathered in fp32 under bf16 compute
// (their merge reads the masters; CausalLM::bf16_only_params leaves them out).
// Under tensor parallel (`plan`, the model's) the adapter holds this rank's cuts (models/lora.h).
std::unique_ptr<LoraAdapter> attach_job_lora(const JobConfig& config, const ModelArgs& args,
                                             CausalLM& model, const ParallelizePlan& plan);
// The frozen model's weights from checkpoint.initial_load_path (a Hugging Face folder) into
// `model_groups` (this rank's cut `model_cut` of them: Parallelism::model_groups), the same
// whether the adapter starts or resumes (else the seeded init stays), and when `starting`,
// lora.initial_adapter read into `adapter` (else PEFT's init, already made, stays). With
// lora.base_dtype = "bfloat16" the weights held in bf16 are read from the folder straight into
// bf16, rounded to nearest even (a bf16 folder's bits as stored): in one process or replicas the
// copies `model` holds (hold_lora_base_in_bf16), the copies made from fp32 masters (a tied
// embedding's lm_head copy) rounded after the load, as a live model rounds them; under FSDP
// (`model_cut` of more than one) the bf16 rows of `model_groups` (the views with a compute copy:
// FullyShardedGroups' bf16_shards), whose gathers fill the model's copies.
// Under tensor parallel (`plan`, the model's) each rank reads its cut of the base's weights and of
// the initial adapter's.
void load_lora_run_weights(const JobConfig& config, const ModelArgs& args,
                           std::vector<ParamGroup>& model_groups, Shard model_cut,
                           const ParallelizePlan& plan, LoraAdapter& adapter, bool starting,
                           CausalLM& model);
// Where the run's last save goes: job.dump_folder/adapter (a PEFT adapter folder) for a LoRA run
// that does not merge, else job.dump_folder/hf; and what kind of folder it is (io/atomic_dir.h).
std::string job_export_dir(const JobConfig& config);
std::string job_export_content(const JobConfig& config);
// The LoRA run's export, on every rank (the adapter's values checked finite first, as the model's
// are: `scan`, the same verdict on every rank): the PEFT adapter folder, written by the rank that
// `writes` -- under tensor parallel each tensor gathered whole by `gather` just before it is
// written, every rank calling it in the writer's order (null: the adapter is whole on each) --,
// or with lora.merge_on_export the model with W + scaling B A written by `export_model` (which
// merges each run of weights as it is gathered: merge_lora_into).
void export_lora(const JobConfig& config, const LoraAdapter& adapter, const std::string& base_model,
                 bool writes, const NonfiniteScan& scan, const std::function<void()>& export_model,
                 const AdapterTensorGather& gather);
// Before a merged export of a base held in bf16 (lora.merge_on_export with lora.base_dtype =
// "bfloat16"): the fp32 masters of `model`'s bf16-only weights committed again and set to their
// bf16 values widened exactly, so the export scans, gathers and merges fp32 weights as it does
// for a base with masters. The adapter's update is then added in fp32 (merge_lora_into) and the
// folder written in checkpoint.export_dtype: rounding the sum to bf16 would lose most of an
// update smaller than the weight's bf16 spacing, which the default float32 keeps.
void widen_lora_base_to_fp32(CausalLM& model);

}  // namespace titan
