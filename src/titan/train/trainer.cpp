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
#include "titan/models/param_count.h"
#include "titan/models/peft_adapter.h"
#include "titan/models/registry.h"
#include "titan/train/checkpoint.h"
#include "titan/train/comm_report.h"
#include "titan/train/job_device.h"
#include "titan/train/job_resolve.h"
#include "titan/train/lora_job.h"
#include "titan/train/preflight.h"
#include "titan/train/profiling.h"
#include "titan/train/rank_agreement.h"
#include "titan/train/run_record.h"

namespace titan {
namespace {

int64_t scored_tokens(const Batch& b) {
  int64_t n = 0;
  for (int64_t r = 0; r < b.batch_size; ++r) {
    for (int64_t s = 0; s < b.seq_len; ++s) n += b.labels[r * b.seq_len + s] != kIgnoreIndex;
  }
  return n;
}

// The job's model (train/job_resolve.h) and the tokenizer that will feed it. Token ids the model's
// config leaves unset (a built-in flavor sets none) are the tokenizer's: the loader ends every
// document with its EOS, so the export's config.json and generation_config.json must name it for
// generation to stop there. Ids the config sets stay (an HF folder's own choice).
ModelArgs resolve_model_args(const JobConfig& c, const Tokenizer& tok) {
  ModelArgs args = resolve_job_model_args(c);
  TITAN_CHECK(static_cast<int64_t>(tok.vocab_size()) <= args.vocab_size, "the tokenizer has ",
              tok.vocab_size(), " tokens but model flavor '", c.model.flavor, "' has vocab_size ",
              args.vocab_size);
  if (args.eos_token_ids.empty() && tok.eos_id() >= 0) args.eos_token_ids = {tok.eos_id()};
  if (args.bos_token_id < 0) args.bos_token_id = tok.bos_id();
  if (args.pad_token_id < 0) args.pad_token_id = tok.pad_id();
  return args;
}

// The MFU denominator and where it came from: metrics.peak_tflops when set, else the device's
// peak for GEMMs with `dtype` operands.
struct MfuPeak {
  double gflops = 0.0;
  std::string source;
};

MfuPeak mfu_peak(const Backend& device, DType dtype, double peak_tflops) {
  if (peak_tflops > 0) return {peak_tflops * 1e3, "metrics.peak_tflops"};
  const std::optional<double> peak = device.peak_gflops(dtype);
  TITAN_CHECK(peak.has_value(), "no ", dtype_name(dtype), " peak to measure MFU against on ",
              device.name(), " (", device.peak_source(dtype), "): set metrics.peak_tflops");
  return {*peak, device.peak_source(dtype)};
}

// A warning every rank reaches alike (the job's config, the model, the schedule): rank 0 says it
// once. Other ranks' stdout is already silent (apps/titan/main.cpp), but their stderr stays open
// for their own errors.
void warn_job(const std::string& line) {
  if (world().rank() == 0) std::fprintf(stderr, "warning: %s\n", line.c_str());
}

}  // namespace

Trainer::Trainer(const JobConfig& config) : config_(config) {
  job_config_validate(config_);
  const JobConfig::Training& t = config_.training;
  set_collective_timeout(config_.comm.init_timeout_seconds, "init_timeout_seconds");
  set_heartbeat_timeout(config_.comm.heartbeat_timeout_seconds, "heartbeat_timeout_seconds");
  // Before anything collective depends on the config: every rank runs rank 0's binary and config.
  check_ranks_agree(world(), config_);
  check_tensor_parallel_job(config_);
  const MeshDims dims = resolve_mesh_dims(job_parallel_degrees(config_), world().size());
  mesh_ = std::make_unique<DeviceMesh>(world(), dims);
  if (dims.dp() > 1) {
    const bool lora = config_.lora.rank > 0;
    const char* how =
        dims.dp_shard == 1 ? "parameters replicated, gradients all-reduced"
        : !dims.fsdp()     ? "not FSDP under expert parallel: the parameters other than the "
                             "experts replicated, their gradients all-reduced"
        : lora             ? "FSDP: the frozen model's parameters sharded, each unit gathered "
                             "while in use; the LoRA adapter replicated, its gradients "
                             "all-reduced over every rank"
        : dims.ep > 1      ? "FSDP: parameters, gradients and AdamW state sharded, each unit "
                             "gathered while in use; the experts sharded over the ranks holding "
                             "the same experts"
                           : "FSDP: parameters, gradients and AdamW state sharded, each unit "
                             "gathered while in use";
    std::printf(
        "data parallel over %lld ranks: dp_replicate %lld x dp_shard %lld (%s = "
        "replicate index x %lld + shard index); %s\n",
        static_cast<long long>(dims.dp()), static_cast<long long>(dims.dp_replicate),
        static_cast<long long>(dims.dp_shard), dims.tp == 1 ? "rank" : "data-parallel rank",
        static_cast<long long>(dims.dp_shard), how);
  }
  if (dims.tp > 1) {
    std::printf(
        "tensor parallel over %lld ranks per model (rank = data-parallel rank x %lld + tp index): "
        "attention heads, MLP widths and the vocabulary cut, %s; %s\n",
        static_cast<long long>(dims.tp), static_cast<long long>(dims.tp),
        config_.parallelism.enable_sequence_parallel
            ? "sequence parallel (norms and residual adds on seq_len / tp tokens, blocks' inputs "
              "all-gathered and outputs reduce-scattered)"
            : "partial outputs all-reduced (enable_sequence_parallel = false)",
        mesh_->describe().c_str());
  }
  if (dims.ep > 1 && dims.tp > 1) {
    std::printf(
        "expert parallel over %lld ranks (borrowed from dp_shard x tp: EP index = (shard index x "
        "%lld + tp index) mod %lld): each holds num_experts / %lld whole experts of every sparse "
        "layer, a sparse block runs on each TP rank's sequence shard and sends its tokens to "
        "their experts' ranks by all-to-all-v; the experts' gradients summed over the ranks "
        "holding the same experts\n",
        static_cast<long long>(dims.ep), static_cast<long long>(dims.tp),
        static_cast<long long>(dims.ep), static_cast<long long>(dims.ep));
  } else if (dims.ep > 1) {
    std::printf(
        "expert parallel over %lld ranks (borrowed from dp_shard: EP index = shard index mod "
        "%lld): "
        "each holds num_experts / %lld whole experts of every sparse layer, tokens sent to their "
        "experts' ranks by all-to-all-v; the experts' gradients summed over the ranks holding the "
        "same experts; %s\n",
        static_cast<long long>(dims.ep), static_cast<long long>(dims.ep),
        static_cast<long long>(dims.ep), mesh_->describe().c_str());
  }
  accumulation_steps_ = job_accumulation_steps(config_, dims);
  check_lora_job(config_);
  const ModelArgs job_args = resolve_job_model_args(config_);
  check_lora_base_dtype(config_, job_args);
  check_job_sizes(config_, job_args, dims);
  check_expert_parallel_job(config_, dims);
  check_tensor_parallel_model(config_, job_args, dims);
  if (dims.tp > 1 && dims.ep == 1 && job_args.is_moe()) {
    std::printf(
        "expert tensor parallel over the %lld TP ranks: each holds 1/%lld of every expert's width "
        "(gate and up column-wise, down row-wise) and runs each sparse block on every token, as a "
        "dense MLP\n",
        static_cast<long long>(dims.tp), static_cast<long long>(dims.tp));
  }
  // Before anything is allocated: every buffer from here on is the device's. A build or machine
  // without the device says so before what the device cannot run yet.
  select_job_device(config_);
  check_device_job(config_, job_args, dims);

  for (const std::string& line : job_config_unused_keys(config_)) {
    warn_job(line);
  }
  for (const std::string& line : job_world_unused_keys(config_, dims, world().size())) {
    warn_job(line);
  }
  if (!config_.job.description.empty()) std::printf("job: %s\n", config_.job.description.c_str());
  const DataSources sources = resolve_data_sources(config_);
  check_inputs(sources);
  check_outputs(config_, sources);
  // One job per dump folder: rank 0, which begins and commits every checkpoint and writes the
  // export, holds its lock from here to the run's end; a second job on the folder stops here.
  // (A run that writes only its record takes it in run(), once nothing can refuse it.)
  if (world().rank() == 0 && (config_.checkpoint.enable || config_.checkpoint.last_save_in_hf)) {
    lock_dump_folder();
  }
  tokenizer_dir_ = sources.tokenizer;
  tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::load(sources.tokenizer));
  if (t.dataset == "chat") {
    // One conversation per row, rendered with the chat template of the tokenizer's folder (the
    // model's), labels on the assistant replies only (data/loader.h).
    loader_options_.mode = DataMode::chat;
    loader_options_.chat_template = load_chat_template(tokenizer_dir_);
    check_chat_tokenizer(*tokenizer_, *loader_options_.chat_template);
    loader_options_.truncate_long = t.truncate_long_conversations;
    loader_options_.pack_conversations = t.dataset_packing;
    loader_options_.long_conversation_hint =
        "raise training.seq_len, or set training.truncate_long_conversations = true to cut it";
    std::printf(
        "chat data: the %s chat template of %s; loss on the assistant replies only; %s of at "
        "most seq_len + 1 = %lld tokens%s\n",
        std::string(loader_options_.chat_template->name()).c_str(), tokenizer_dir_.c_str(),
        t.dataset_packing ? "conversations packed into rows (training.dataset_packing), each"
                          : "one conversation per row, padded,",
        static_cast<long long>(t.seq_len + 1),
        t.truncate_long_conversations ? " (longer ones cut)" : "");
  }
  args_ = resolve_model_args(config_, *tokenizer_);
  // The record names the family the run resolved (an HF folder names its own), so that it runs
  // again as it is.
  config_.model.name = model_family(args_.architecture, "model").name;
  if (config_.model.output_router_logits && !args_.is_moe()) {
    warn_job("model.output_router_logits has no effect: the model has no sparse layers");
  }
  for (const std::string& line : job_model_unused_keys(config_, args_)) {
    warn_job(line);
  }
  std::printf("model dims: %s; tokenizer: %s; data: %s\n",
              config_.model.flavor == "hf" ? (config_.model.hf_assets_path + "/config.json").c_str()
                                           : ("flavor '" + config_.model.flavor + "'").c_str(),
              sources.tokenizer.c_str(),
              config_.training.dataset == "default"
                  ? ("the built-in corpus " + sources.train.front()).c_str()
                  : config_.training.dataset_path.c_str());
  resume_ = find_resume_checkpoint(checkpoint_folder(), state_specs(), config_.checkpoint, t.steps);
  std::printf("%s\n", model_weights_line(config_, resume_).c_str());
  if (!resume_) check_initial_weights(config_.checkpoint, args_);

  const JobKernels kernels = resolve_job_kernels(config_);
  if (!config_.experimental.custom_import.empty()) {
    std::printf("kernel plugin %s: %s\n", config_.experimental.custom_import.c_str(),
                join_names(kernels.plugin_kernels).c_str());
  }
  const DType compute = job_compute_dtype(config_);
  // A base held in bf16 is never held in fp32: made released, it is loaded, not initialised.
  const bool base_in_bf16 = lora_base_in_bf16(config_);
  plan_ = Parallelism::plan(
      args_, Parallelism::axes(*mesh_, config_.parallelism.enable_sequence_parallel));
  model_ =
      make_model(args_, kernels.overrides, compute,
                 base_in_bf16 ? Residency::released : Parallelism::param_residency(*mesh_), plan_);
  if (base_in_bf16) {
    std::printf(
        "mixed precision: %s; the frozen base's matmul weights held only in bf16 "
        "(lora.base_dtype), its norms and embedding in fp32; the adapter's fp32 "
        "weights, AdamW state and gradients\n",
        describe_compute_dtype(compute));
  } else if (compute == DType::bf16) {
    std::printf("mixed precision: %s; fp32 master weights, AdamW state and gradients\n",
                describe_compute_dtype(compute));
  } else {
    std::printf("precision: %s\n", describe_compute_dtype(compute));
  }
  if (compute == DType::bf16 && !backend().native(DType::bf16)) {
    std::fprintf(stderr,
                 "warning: %s has no native bf16 dot products (AVX512_BF16): bf16 matmuls are "
                 "widened to fp32 in registers and will be slower than fp32 training\n",
                 backend().name().c_str());
  }
  for (const std::string& line : model_->override_report().applied) {
    std::printf("override %s\n", line.c_str());
  }
  for (const std::string& line : model_->override_report().warnings) {
    warn_job(line);
  }
  if (config_.lora.rank > 0) lora_ = attach_job_lora(config_, args_, *model_, plan_);
  model_->check_kernel_constraints(t.local_batch_size, t.seq_len);
  model_->set_activation_checkpointing(job_activation_checkpointing(config_));
  model_->allocate_gradients();
  if (lora_) lora_->allocate_gradients();
  AdamWConfig adamw;
  adamw.lr = static_cast<float>(config_.optimizer.lr);
  adamw.beta1 = static_cast<float>(config_.optimizer.beta1);
  adamw.beta2 = static_cast<float>(config_.optimizer.beta2);
  adamw.eps = static_cast<float>(config_.optimizer.eps);
  adamw.weight_decay = static_cast<float>(config_.optimizer.weight_decay);
  parallelism_ = std::make_unique<Parallelism>(
      *model_, *mesh_, plan_, config_.parallelism.fsdp_reshard_after_forward, base_in_bf16);
  if (lora_) parallelism_->train_only(lora_->groups(), lora_->specs());
  optimizer_ = std::make_unique<AdamWOptimizer>(parallelism_->state_groups(), adamw,
                                                parallelism_->grad_norm_group(),
                                                parallelism_->cut_model_norm());
  schedule_ = LrSchedule::make(config_.optimizer.lr, t.steps, config_.lr_scheduler.warmup_steps,
                               config_.lr_scheduler.decay_ratio, config_.lr_scheduler.decay_type,
                               config_.lr_scheduler.min_lr_factor);
  if (!schedule_.adjusted.empty()) warn_job(schedule_.adjusted);

  loader_options_.data.paths = sources.train;
  validation_paths_ = sources.validation;
  loader_options_.batch_size = t.local_batch_size;
  loader_options_.seq_len = t.seq_len;
  loader_options_.seed = static_cast<uint64_t>(t.seed);
  if (config_.validation.enable) {
    // The validation data must give a pass at least one batch: found now, not after the first
    // validation.freq steps.
    LoaderOptions options = loader_options_;
    options.data.paths = validation_paths_;
    options.shuffle = false;
    options.epochs = 1;
    DataLoader probe(options, *tokenizer_);
    TITAN_CHECK(probe.next_batch().has_value(), "validation.dataset_path ",
                config_.validation.dataset_path, ": the validation data gives no full batch of ",
                t.local_batch_size, " rows of ", t.seq_len,
                " tokens (training.local_batch_size x training.seq_len): empty or too short");
  }
  if (config_.checkpoint.enable && config_.checkpoint.async_mode != "disabled") {
    const bool pinned = config_.checkpoint.async_mode == "async_with_pinned_mem";
    MemorySpace& staging = pinned ? backend().host_staging_memory() : host_memory();
    async_checkpoints_ = std::make_unique<AsyncCheckpointer>(mesh_->world(), staging);
    std::printf(
        "checkpoint.async_mode = \"%s\": each save stages the state in host memory (%s) and "
        "writes it on a background thread while training goes on%s\n",
        config_.checkpoint.async_mode.c_str(),
        parallelism_->gathers_checkpoint()
            ? "under TP or EP the whole state gathered onto rank 0 on the training thread, "
              "written from there"
            : "one copy, made now and reused by every save",
        pinned && &staging == &host_memory()
            ? "; the same as \"async\" here: pinned memory only speeds device-to-host copies, "
              "and the staging copy is reused across saves in both modes"
        : pinned ? "; the staging copy in pinned host memory"
                 : "");
  }
  const auto seed = static_cast<uint64_t>(t.seed);
  if (!base_in_bf16) parallelism_->initialize(args_, seed);  // else loaded by restore()
  if (lora_) lora_->initialize(seed);
  restore();
  if (async_checkpoints_ && parallelism_->writes_checkpoint() &&
      !parallelism_->gathers_checkpoint()) {
    async_checkpoints_->prepare(state_groups());
  }
}

Trainer::~Trainer() = default;

void Trainer::lock_dump_folder() {
  ensure_writable_folder(config_.job.dump_folder, "job.dump_folder");
  dump_lock_ = FolderLock::take(config_.job.dump_folder, "job.dump_folder");
  if (!dump_lock_->warning.empty()) {
    std::fprintf(stderr, "warning: %s\n", dump_lock_->warning.c_str());
  }
}

Trainer::StepOutcome Trainer::train_step(int64_t step) {
  StepOutcome out;
  // The loss is normalised by the scored tokens of the whole global batch, so accumulating
  // micro-batches gives exactly the gradients of one big batch: fetch them all first.
  const double t0 = now_seconds();
  // Every data-parallel rank walks the whole global batch (the same stream, the same state) and
  // runs its own accumulation_steps_ micro-batches of it, rank r the r-th run of them: the loader
  // tokenizes the others' rows only where their bounds need it (data/loader.h), and the scored
  // tokens are summed over the ranks. The TP ranks of a model read the same rows.
  const int64_t dp = mesh_->dims().dp();
  std::vector<Batch> micro;
  std::vector<int64_t> micro_index;  // each one's place among the step's accumulation_steps_ dp
  int64_t scored = 0;
  {
    const ProfileSpan span("data", SpanKind::phase);
    for (int64_t i = 0; i < accumulation_steps_ * dp; ++i) {
      std::optional<Batch> b = loader_->next_batch();
      TITAN_CHECK(b.has_value(), "the training data ran out at step ", step);
      if (!b->own) continue;
      scored += scored_tokens(*b);
      micro.push_back(std::move(*b));
      micro_index.push_back(i);
    }
    if (dp > 1) {
      double sum = static_cast<double>(scored);  // exact: far below 2^53
      parallelism_->data_parallel_group().all_reduce_sum(&sum, 1);
      scored = static_cast<int64_t>(sum);
    }
  }
  out.data_time_s = now_seconds() - t0;
  TITAN_CHECK(scored > 0, "step ", step, ": the global batch has no scored tokens");
  {
    const ProfileSpan span("zero_grad", SpanKind::phase);
    parallelism_->zero_gradients();
  }
  ForwardOptions options;
  options.compute_grad = true;
  options.grad_scale = 1.0f / static_cast<float>(scored);
  // The load-balancing loss (0 unless enabled) is per micro-batch; the step takes their mean. Its
  // global form is the loss of the ranks' micro-batch i together (the same on every rank), each
  // rank's gradient its own rows' share of it: the mean over accumulation_steps_ of them.
  const int64_t micro_batches = accumulation_steps_ * dp;
  const bool global_aux = dp > 1 && config_.model.router_aux_loss_scope == "global";
  options.aux_loss_scale =
      1.0f / static_cast<float>(global_aux ? accumulation_steps_ : micro_batches);
  if (global_aux) {
    Communicator& group = parallelism_->router_statistics_group();
    options.sum_router_statistics = [&group](double* statistics, int64_t count) {
      group.all_reduce_sum(statistics, count);
    };
  }
  // The loss over scored tokens, the load-balancing losses (global: every rank's the same, so
  // their sum over the ranks divided by micro_batches is still the mean over the step).
  double sums[2] = {0.0, 0.0};
  for (size_t m = 0; m < micro.size(); ++m) {
    const Batch& b = micro[m];
    options.segment_start = b.segment_start.empty() ? nullptr : b.segment_start.data();
    // LoRA's dropout masks are keyed by the rows' place in the step's global batch, the same on
    // every layout (ops/lora_dropout.h).
    if (lora_) {
      lora_->begin_dropout(static_cast<uint64_t>(config_.training.seed), step,
                           micro_index[m] * b.batch_size, b.seq_len);
    }
    {
      const ProfileSpan span("forward", SpanKind::phase);
      sums[0] +=
          model_->forward(b.input_ids.data(), b.labels.data(), b.batch_size, b.seq_len, options)
              .loss_sum;
      sums[1] += model_->aux_loss();
    }
    const ProfileSpan span("backward", SpanKind::phase);
    model_->backward();
  }
  if (lora_) lora_->end_dropout();
  {
    const ProfileSpan span("reduce_gradients", SpanKind::phase);
    parallelism_->finish_gradients();
    parallelism_->data_parallel_group().all_reduce_sum(sums, 2);
  }
  out.loss = sums[0] / static_cast<double>(scored) +
             args_.router_aux_loss_coef * sums[1] / static_cast<double>(micro_batches);
  std::string nonfinite;
  if (!std::isfinite(out.loss)) {
    nonfinite = "the loss is not finite (" + std::to_string(out.loss) + ")";
  } else {
    try {
      const ProfileSpan span("clip_grad_norm", SpanKind::phase);
      out.grad_norm = optimizer_->clip_grad_norm(config_.training.max_norm);
    } catch (const Error& e) {
      nonfinite = e.what();
    }
  }
  if (!nonfinite.empty()) {
    TITAN_CHECK(config_.training.skip_nonfinite_steps, "step ", step, ": ", nonfinite,
                " (training.skip_nonfinite_steps = true skips such steps instead)");
    ++skipped_steps_;
    std::fprintf(stderr, "warning: step %lld skipped: %s (%lld skipped so far)\n",
                 static_cast<long long>(step), nonfinite.c_str(),
                 static_cast<long long>(skipped_steps_));
    out.grad_norm = std::numeric_limits<double>::quiet_NaN();
    return out;  // no update; the gradients are zeroed by the next step
  }
  const ProfileSpan span("optimizer", SpanKind::phase);
  optimizer_->step(schedule_.at(step));
  return out;
}

EvalResult Trainer::validate() {
  // Held-out data, read from its start every time, so passes are comparable.
  LoaderOptions options = loader_options_;
  options.data.paths = validation_paths_;
  options.shuffle = false;
  options.epochs = 1;
  DataLoader loader(options, *tokenizer_);
  // A forward without gradients ends each use GroupUseEnd::last: FSDP keeps no unit after it.
  return evaluate(*model_, loader, config_.validation.steps);
}

TrainResult Trainer::run() {
  const int64_t dp = mesh_->dims().dp();
  MfuPeak peak = mfu_peak(backend(), model_->compute_dtype(), config_.metrics.peak_tflops);
  if (dp > 1) {  // every rank's device counts (ranks are alike)
    peak.gflops *= static_cast<double>(dp);
    peak.source = std::to_string(dp) + " ranks x " + peak.source;
  }
  const JobConfig::Training& t = config_.training;
  const int64_t tokens_per_step = accumulation_steps_ * dp * t.local_batch_size * t.seq_len;
  // The run's record, once every check has passed: a refused run leaves the folder as it was.
  if (mesh_->world().rank() == 0) {
    if (!dump_lock_) lock_dump_folder();
    write_job_config_record(config_.job.dump_folder, config_);
    std::printf("resolved config saved as %s/%s\n", config_.job.dump_folder.c_str(),
                kJobConfigFile);
  }
  // Rank 0 speaks for the job (the others' stdout is silenced by the command line).
  const bool rank0 = mesh_->world().rank() == 0;
  MetricsLogger metrics(training_flops_per_token(args_, t.seq_len, plan_), peak.gflops, t.steps,
                        rank0 ? metrics_jsonl_path(config_) : std::string(),
                        rank0 ? tensorboard_run_dir(config_) : std::string(), &mesh_->world());
  // The whole model's count; under TP or EP rank 0 holds fewer.
  const int64_t whole_count = count_parameters(args_).total;
  const std::string rank0_count =
      model_->parameter_count() == whole_count
          ? ""
          : " (" + std::to_string(model_->parameter_count()) + " on rank 0)";
  std::printf(
      "model %s: %lld parameters%s, %.4g training FLOPs per token; %lld steps of %lld x %lld "
      "tokens (%lld micro-batches per rank)\nMFU against %.1f GFLOP/s (%s)\n",
      config_.model.flavor.c_str(), static_cast<long long>(whole_count), rank0_count.c_str(),
      training_flops_per_token(args_, t.seq_len, plan_), static_cast<long long>(t.steps),
      static_cast<long long>(t.local_batch_size), static_cast<long long>(t.seq_len),
      static_cast<long long>(accumulation_steps_), peak.gflops, peak.source.c_str());
  if (const std::string jsonl = metrics_jsonl_path(config_); !jsonl.empty()) {
    std::printf("metrics appended to %s (metrics.save_jsonl)\n", jsonl.c_str());
  }
  TrainResult result;
  result.first_step = start_step_ + 1;
  reset_collective_times();  // the steps' collectives only, not start-up's
  StepProfiler profiler(config_, mesh_->world().rank());
  // What the mesh's groups moved inside the timed steps (after the first, as the collectives'
  // times, unless it is the only one), and those steps' seconds.
  const auto groups = mesh_->named_groups();
  GroupCounts in_steps;
  for (const auto& [name, group] : groups) in_steps.emplace_back(name, CommCounts{});
  double timed_seconds = 0.0;
  for (int64_t step = start_step_ + 1; step <= t.steps; ++step) {
    profiler.begin_step(step);
    std::vector<CommCounts> before;
    for (const auto& [name, group] : groups) before.push_back(group->counts());
    const double t0 = now_seconds();
    StepOutcome out;
    {
      const ProfileSpan span("step", SpanKind::phase);
      out = train_step(step);
    }
    const double elapsed = now_seconds() - t0;
    if (step > result.first_step || step == t.steps) {
      timed_seconds += elapsed;
      for (size_t g = 0; g < groups.size(); ++g) {
        in_steps[g].second += groups[g].second->counts().since(before[g]);
      }
    }
    profiler.end_step(step);
    if (step == result.first_step) {
      result.first_loss = out.loss;
      set_collective_timeout(config_.comm.train_timeout_seconds, "train_timeout_seconds");
      if (step < t.steps) reset_collective_times();  // timed after warm-up, as the summary
    }
    result.last_step = step;
    result.last_loss = out.loss;
    const bool print =
        step % config_.metrics.log_freq == 0 || step == result.first_step || step == t.steps;
    metrics.record({step, out.loss, out.grad_norm, schedule_.at(step), tokens_per_step, elapsed,
                    out.data_time_s},
                   print);
    if (config_.validation.enable && step % config_.validation.freq == 0) {
      const EvalResult v = validate();
      metrics.log_validation(step, v.loss, v.tokens);
    }
    if (config_.checkpoint.enable && (step % config_.checkpoint.interval == 0 || step == t.steps)) {
      save_checkpoint(step, step == t.steps && config_.checkpoint.last_save_model_only);
    }
  }
  finish_async_checkpoint();
  metrics.print_summary();
  if (const int64_t cut = loader_state().truncated; cut > 0) {
    std::printf(
        "conversations cut to seq_len + 1 = %lld tokens: %lld (training.truncate_long_"
        "conversations; a conversation counts once per epoch)\n",
        static_cast<long long>(t.seq_len + 1), static_cast<long long>(cut));
  }
  if (mesh_->dims().world() > 1 && result.last_step >= result.first_step) {
    // Rank 0's view (the ranks are alike): the collectives' time on its communication thread and
    // the part its compute thread waited for; the rest ran behind compute. Its waits beyond that
    // are the hand-offs between the threads (CommTimes), printed apart so that the hidden share
    // stays a share of the collectives' time. Then what each group's
    // collectives moved inside those steps (the step's own: no metrics, validation or saves).
    const CommTimes c = collective_times();
    const int64_t timed = std::max<int64_t>(1, result.last_step - result.first_step);
    const std::string after_warm_up = result.last_step > result.first_step
                                          ? " after warm-up (" + std::to_string(timed) + " steps)"
                                          : std::string();
    std::printf(
        "collectives: %.3f s per step on the communication thread, %.3f s of it exposed "
        "(%.0f %% hidden), %.3f s handing off between the threads (waiting %.1f %% of the step "
        "time)%s\n",
        c.busy_s / static_cast<double>(timed), c.exposed_s / static_cast<double>(timed),
        100.0 * c.hidden_fraction(), c.handoff_s / static_cast<double>(timed),
        timed_seconds > 0.0 ? 100.0 * c.waited_s() / timed_seconds : 0.0, after_warm_up.c_str());
    std::printf(
        "communication per step on rank 0%s, by group and collective (bytes: each call's "
        "buffer on this rank):\n%s",
        after_warm_up.c_str(), comm_report_lines(in_steps, timed).c_str());
  }
  if (config_.checkpoint.last_save_in_hf) {
    set_collective_timeout(config_.comm.init_timeout_seconds, "init_timeout_seconds");
    export_model();  // every rank takes part; rank 0 writes
  }
  mesh_->world().barrier();
  return result;
}

}  // namespace titan
