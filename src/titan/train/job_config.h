// The training job's configuration, in torchtitan's sections and keys, so a torchtitan user can
// read and write it at once. Sources, later ones winning: the built-in preset, a TOML file,
// `--section.key=value` command-line overrides. Every field is declared once, in job_config.cpp's
// table (fields(): section, key and the member it sets, whose type is the field's); parsing,
// overriding and printing all walk that table.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "titan/models/activation_checkpointing.h"

namespace titan {

struct JobConfig {
  struct Job {
    std::string dump_folder = "./outputs";
    std::string description = "";
  } job;
  struct Model {
    std::string name = "qwen3";
    std::string flavor = "debugmodel";  // a built-in flavor, or "hf" to read hf_assets_path
    std::string hf_assets_path = "";    // HF folder: config.json (flavor "hf") and tokenizer
    std::string attn_backend = "blockwise";
    // titan's addition: Qwen3-MoE training adds router_aux_loss_coef x the load-balancing loss
    // (HF's output_router_logits, off by default there too; also on when config.json sets it).
    bool output_router_logits = false;
    // titan's addition: which tokens that loss balances on a data-parallel job. "global": the
    // router statistics of every data-parallel rank's micro-batch i summed before the loss (one
    // all-reduce of 2 E + 1 doubles per micro-batch), the loss of one process whose micro-batch
    // is their union, as torchtitan and Megatron balance a data-parallel MoE job; "local": each
    // rank's own tokens, HF's formula on its micro-batch (one process accumulating the ranks'
    // micro-batches). One process computes the same either way.
    std::string router_aux_loss_scope = "global";
  } model;
  struct Training {
    int64_t local_batch_size = 8;
    int64_t global_batch_size = -1;  // -1: local_batch_size x data-parallel ranks (no accumulation)
    int64_t seq_len = 256;
    int64_t steps = 200;
    double max_norm = 1.0;
    // "default": the embedded corpus; "chat": the conversations ("messages") under dataset_path,
    // rendered with model.hf_assets_path's chat template, loss on the assistant replies only, one
    // conversation per row padded to seq_len; any other name: dataset_path's documents, packed.
    std::string dataset = "default";
    std::string dataset_path = "";
    // Chat data: a conversation longer than seq_len + 1 tokens is cut to that length (its later
    // tokens dropped, as TRL's truncation_mode = "keep_start") instead of stopping the run with
    // its file and line.
    bool truncate_long_conversations = false;
    // Chat data: several whole conversations per row (TRL's `packing`), attention kept inside
    // each and positions restarting at each, instead of one padded conversation per row.
    bool dataset_packing = false;
    int64_t seed = 0;
    bool deterministic = true;
    // torchtitan's mixed precision: "bfloat16" keeps fp32 master weights and AdamW state and
    // computes every matmul with bf16 operands and fp32 accumulation (models/causal_lm.h);
    // "float32" computes in fp32. Gradients are reduced in fp32, the only value torchtitan takes.
    std::string mixed_precision_param = "float32";
    std::string mixed_precision_reduce = "float32";
    // titan's addition: a step whose loss or gradients are not finite is skipped (no update,
    // counted and reported) instead of stopping the run.
    bool skip_nonfinite_steps = false;
    // titan's addition: where parameters, gradients, AdamW state, activations and kernels live:
    // "cpu", "cuda" (device 0) or "cuda:N" (train/job_device.h says what CUDA takes so far).
    std::string device = "cpu";
    // As torch.backends.cuda.matmul.allow_tf32: fp32 GEMMs on a GPU may round their operands to
    // TF32 on the tensor cores (faster, about 1e-3 relative). Off: fp32 arithmetic throughout. The
    // CPU has no TF32 (its fp32 GEMMs stay fp32; setting the key there is warned of).
    bool allow_tf32 = false;
  } training;
  struct Optimizer {
    std::string name = "AdamW";
    double lr = 8e-4;
    double beta1 = 0.9;
    double beta2 = 0.95;
    double eps = 1e-8;
    double weight_decay = 0.1;
  } optimizer;
  struct LrScheduler {
    int64_t warmup_steps = 20;
    double decay_ratio = -1.0;          // -1: decay over every step after warmup
    std::string decay_type = "linear";  // linear | cosine | sqrt | none
    double min_lr_factor = 0.0;
  } lr_scheduler;
  struct Parallelism {
    int64_t data_parallel_replicate_degree = 1;
    int64_t data_parallel_shard_degree = -1;
    int64_t tensor_parallel_degree = 1;
    // Norms and residual adds on sequence parts under TP (torchtitan's default, true); titan's
    // tensor parallel computes only with it false so far.
    bool enable_sequence_parallel = true;
    int64_t pipeline_parallel_degree = 1;
    int64_t context_parallel_degree = 1;
    int64_t expert_parallel_degree = 1;
    // After a block's forward under FSDP: default | always hand its whole parameters back (gather
    // again for backward) | never (keep them until its backward: less communication, more memory).
    std::string fsdp_reshard_after_forward = "default";
  } parallelism;
  struct Checkpoint {
    bool enable = false;
    std::string folder = "checkpoint";  // under job.dump_folder
    int64_t interval = 500;
    int64_t keep_latest_k = 10;
    std::string initial_load_path = "";
    bool initial_load_model_only = true;
    bool initial_load_in_hf = false;
    bool last_save_model_only = true;
    bool last_save_in_hf = false;
    std::string export_dtype = "float32";
    int64_t load_step = -1;
    // A resume that finds checkpoints and can use none stops, unless this is set: then the run
    // starts from step 1 beside them (replacing a step-N folder when it saves step N).
    bool allow_fresh_start = false;
    // Initial weights and checkpoints holding NaN or Inf are refused at load unless this is set
    // (for debugging such weights).
    bool allow_nonfinite_weights = false;
    // disabled | async | async_with_pinned_mem: a save stages the state in host memory and writes
    // it on a background thread (train/async_checkpoint.h); the two async values are the same
    // here (pinned memory is for device-to-host copies).
    std::string async_mode = "disabled";
  } checkpoint;
  // torchtitan's [comm]: how long a collective may wait before the job is ended (a rank that
  // hangs without dying): the first step and everything before it, then every later step.
  // titan's addition: how long a rank's heartbeats (one a second from its communication thread,
  // whatever it computes) may stop before the others end the job naming it -- a stopped or
  // frozen rank, found in this time however long a step or a save legitimately takes.
  struct Comm {
    int64_t init_timeout_seconds = 300;
    int64_t train_timeout_seconds = 100;
    int64_t heartbeat_timeout_seconds = 30;
  } comm;
  // What each decoder layer keeps for its backward (models/activation_checkpointing.h): none keeps
  // everything, full only each layer's input; selective (torchtitan's default mode; titan's
  // default stays none) with selective_ac_option "op" keeps every matmul's and the attention's
  // outputs and remakes the RMSNorms' in the backward, or a positive integer N recomputes every
  // N-th layer as full does (torchtitan's default option, "2").
  struct ActivationCheckpoint {
    std::string mode = "none";  // none | full | selective
    std::string selective_ac_option = "2";
  } activation_checkpoint;
  struct Metrics {
    int64_t log_freq = 10;
    // One JSON object per logged step and validation pass, appended; a relative path lies under
    // job.dump_folder (as torchtitan's save_tb_folder); "" writes none.
    std::string save_jsonl = "metrics.jsonl";
    // TensorBoard event files of the logged steps' scalars (rank 0), under
    // job.dump_folder/save_tb_folder/<YYYYMMDD-HHMM of the start> as torchtitan lays them out
    // (train/tensorboard.h).
    bool enable_tensorboard = false;
    std::string save_tb_folder = "tb";
    // titan's addition: the MFU denominator in TFLOP/s; 0 takes the device's peak for the
    // threads the run uses (Backend::peak_gflops, docs/TRAINING.md).
    double peak_tflops = 0.0;
  } metrics;
  // torchtitan's [profiling]: every profile_freq-th step (with the profiler_active - 1 steps
  // before it) recorded -- every kernel call, collective and phase of the step, per thread -- and
  // written as a Chrome/Perfetto trace per rank,
  // job.dump_folder/save_traces_folder/iteration_<step>/rank<r>_trace.json (train/profiling.h).
  struct Profiling {
    bool enable_profiling = false;
    std::string save_traces_folder = "profile_traces";
    int64_t profile_freq = 10;
    int64_t profiler_active = 1;
  } profiling;
  struct Validation {
    bool enable = false;
    std::string dataset = "";
    std::string dataset_path = "";
    int64_t freq = 100;
    int64_t steps = 10;
  } validation;
  // torchtitan's [experimental]: custom_import names what to import before the model is built
  // (there a Python module); here a kernel plugin, a shared library whose kernels join the
  // registry before [overrides] binds them (dispatch/plugin.h).
  struct Experimental {
    std::string custom_import = "";
  } experimental;
  // titan's [lora] (torchtitan's LoRA keys, PEFT's names): rank > 0 trains a LoRA adapter on
  // every target_modules projection of every layer (models/lora.h) with the model's weights
  // frozen, and exports a PEFT adapter folder (or, with merge_on_export, the model with the
  // adapter merged). initial_adapter: a PEFT adapter folder to start from instead of PEFT's init.
  struct Lora {
    int64_t rank = 0;  // 0: off
    double alpha = 16.0;
    double dropout = 0.0;  // PEFT's lora_dropout on the adapter's input (ops/lora_dropout.h)
    std::string target_modules = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";
    bool merge_on_export = false;
    std::string initial_adapter = "";
    // How the frozen base is held: "float32" (fp32 masters, under bf16 compute also the bf16
    // copies the matmuls read) or "bfloat16" (under bf16 compute only: each matmul weight held
    // only as that bf16 copy, loaded from the Hugging Face folder rounded once; no fp32 masters).
    std::string base_dtype = "float32";
  } lora;
  // [overrides]: module pattern -> kernel name, in file order.
  std::vector<std::pair<std::string, std::string>> overrides;
  // "section.key" of every field a TOML file or the command line set (not the preset), so that
  // one set to no effect can be named (job_config_unused_keys).
  std::vector<std::string> set_keys;
  // torchtitan keys given that titan accepts without effect ("section.key", dotted further for
  // nested tables; train/job_config_torchtitan.h); job_config_unused_keys names them.
  std::vector<std::string> inert_keys;
  // Keys given under an older torchtitan name ("training.data_parallel_shard_degree"), each read
  // as its [parallelism] key; job_config_unused_keys warns about them.
  std::vector<std::string> renamed_keys;
};

// The preset a command starts from when none is named: the quick start's run.
inline constexpr std::string_view kDefaultPreset = "tiny";

// Built-in presets (tiny, the default run; tiny_moe; torchtitan's debugmodel and debugmodel_moe;
// qwen3_0.6b, ...; hf); the error for an unknown one names the closest.
JobConfig job_config_preset(const std::string& name);
std::vector<std::string> job_config_preset_names();

// Applies a TOML file on top of `config`. torchtitan's keys titan does not act on are accepted
// and recorded (JobConfig::inert_keys). Unknown sections and keys: one error naming the file and
// every one of them with the closest valid name; a wrong value type: an error naming the key.
void job_config_apply_toml(JobConfig& config, const std::string& path);
// Applies "--section.key=value" (or "section.key=value"); same errors, naming the flag.
void job_config_apply_override(JobConfig& config, const std::string& flag);
// Checks values that do not depend on the model or the world size (positive sizes, known names).
void job_config_validate(const JobConfig& config);
// Whether the TOML file or the command line set "section.key" to other than titan's default: a
// saved resolved config (job_config.toml) names every key, most at their defaults, and must run
// as quietly as the command that made it.
bool job_config_key_set(const JobConfig& config, std::string_view key);
// Keys the TOML file or the command line set that this config ignores. Where ignoring one would
// train on something other than what was asked (data, a checkpoint step) it is a titan::Error;
// otherwise one warning line each, naming the key and what would make it count.
std::vector<std::string> job_config_unused_keys(const JobConfig& config);
// activation_checkpoint.mode with selective_ac_option; a bad option under selective is one line
// naming the key and its value (job_config_validate checks it).
ActivationCheckpointing job_activation_checkpointing(const JobConfig& config);
// The resolved config as TOML.
std::string job_config_to_toml(const JobConfig& config);

}  // namespace titan
