#include "titan/train/job_resolve.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

#include "titan/core/error.h"
#include "titan/dispatch/plugin.h"
#include "titan/models/hf_config.h"
#include "titan/models/qwen3/flavors.h"
#include "titan/models/registry.h"
#include "titan/train/job_finetune.h"

namespace titan {

std::vector<std::string> resolve_job_defaults(JobConfig& c, std::string_view preset) {
  std::vector<std::string> lines;
  if (job_finetunes_folder(c, preset)) {
    if (std::string line = apply_finetune_defaults(c); !line.empty()) lines.push_back(line);
  }
  return lines;
}

ModelArgs resolve_job_model_args(const JobConfig& c) {
  ModelArgs args;
  if (c.model.flavor == "hf") {
    TITAN_CHECK(!c.model.hf_assets_path.empty(),
                "model.flavor = \"hf\" needs model.hf_assets_path (a Hugging Face model folder)");
    args = read_hf_config(c.model.hf_assets_path);
    args.attn_backend = c.model.attn_backend;
  } else {
    args = flavor(c.model.flavor, c.model.attn_backend);
  }
  // model.name picks the family of a built-in flavor; a folder names its own, which an explicit
  // model.name must agree with.
  // (Named at all, even as the default "qwen3": the saved record names the resolved family.)
  const bool name_set =
      std::find(c.set_keys.begin(), c.set_keys.end(), "model.name") != c.set_keys.end();
  const std::string family = model_family(args.architecture, "model").name;
  TITAN_CHECK(family == c.model.name || (c.model.flavor == "hf" && !name_set), "model.name '",
              c.model.name, "' does not match ",
              c.model.flavor == "hf" ? c.model.hf_assets_path + "/config.json"
                                     : "flavor '" + c.model.flavor + "'",
              ", a ", args.architecture, " (model.name '", family, "')");
  args.output_router_logits = args.output_router_logits || c.model.output_router_logits;
  TITAN_CHECK(c.training.seq_len <= args.max_position_embeddings, "training.seq_len (",
              c.training.seq_len, ") exceeds the model's max_position_embeddings (",
              args.max_position_embeddings, ")");
  validate_model_args(args, "model flavor '" + c.model.flavor + "'");
  return args;
}

ParallelDegrees job_parallel_degrees(const JobConfig& c) {
  const JobConfig::Parallelism& p = c.parallelism;
  return {p.data_parallel_replicate_degree, p.data_parallel_shard_degree, p.tensor_parallel_degree,
          p.pipeline_parallel_degree,       p.context_parallel_degree,    p.expert_parallel_degree};
}

int64_t job_accumulation_steps(const JobConfig& c, const MeshDims& dims) {
  const JobConfig::Training& t = c.training;
  const int64_t dp = dims.dp();
  TITAN_CHECK(static_cast<long double>(t.local_batch_size) * static_cast<long double>(dp) <=
                  static_cast<long double>(kMaxJobBytes),
              "training.local_batch_size (", t.local_batch_size, ") x data-parallel ranks (", dp,
              ") is beyond what titan counts (", kMaxJobBytes, ")");
  const int64_t global_batch =
      t.global_batch_size == -1 ? t.local_batch_size * dp : t.global_batch_size;
  TITAN_CHECK(global_batch % (t.local_batch_size * dp) == 0, "training.global_batch_size (",
              global_batch, ") is not a multiple of local_batch_size x data-parallel ranks (",
              t.local_batch_size, " x ", dp, ")");
  return global_batch / (t.local_batch_size * dp);
}

namespace {

// "about 1.5e+19 bytes": a figure too large for int64, as a message shows it.
std::string about(long double x, const char* unit) {
  char text[64];
  std::snprintf(text, sizeof(text), "about %.3Lg %s", x, unit);
  return text;
}

}  // namespace

JobSizeBounds job_size_bounds(const JobConfig& c, const ModelArgs& a, const MeshDims& dims) {
  using F = long double;
  const F h = a.hidden_size, inter = a.intermediate_size, layers = a.num_hidden_layers;
  const F heads = a.num_attention_heads, kv = a.num_key_value_heads, hd = a.head_dim;
  const F vocab = a.vocab_size, experts = a.num_experts, topk = a.num_experts_per_tok;
  const F moe_inter = a.moe_intermediate_size;
  JobSizeBounds b;
  // A layer's parameters with a dense MLP and the MoE one, biases and per-tensor padding; the
  // embedding and an untied lm_head.
  b.per_layer = 2 * h * heads * hd + 2 * h * kv * hd + 3 * h * inter + 3 * experts * h * moe_inter +
                experts * h + 4 * (heads + kv) * hd + 3 * inter + 8 * h + 1024;
  b.parameters = layers * b.per_layer + vocab * h * (a.tie_word_embeddings ? 1 : 2) + 2 * h + 1024;
  // Per rank at most: masters, gradients, AdamW's two moments, bf16 copies, whole units in flight
  // and the export's gather, 4 bytes each: under 32 bytes a parameter.
  b.parameter_bytes = 32 * b.parameters;
  // A layer's kept tensors and scratch per token (blockwise attention: no seq x seq matrix), 16
  // bytes per value, and the final norm, loss and logits chunk beside them.
  const F tokens = static_cast<F>(c.training.local_batch_size) * c.training.seq_len;
  const F per_token = 8 * h + 4 * (heads + 2 * kv) * hd + 4 * inter + 2 * experts +
                      4 * topk * (h + moe_inter) + 2 * heads + 64;
  b.activation_bytes = 16 * (layers * tokens * per_token + tokens * (16 * h + 64)) +
                       static_cast<F>(int64_t{1} << 31);
  const F dp = static_cast<F>(dims.dp());
  b.global_batch = c.training.global_batch_size == -1
                       ? static_cast<F>(c.training.local_batch_size) * dp
                       : static_cast<F>(c.training.global_batch_size);
  b.step_tokens = b.global_batch * c.training.seq_len;
  // Per micro-batch a few times the whole parameters (gathers, reduce-scatters), per step an
  // all-reduce over the replicas.
  const F micro_batches = b.global_batch / (static_cast<F>(c.training.local_batch_size) * dp);
  b.sent_bytes = micro_batches * 32 * b.parameters + 8 * dp * b.parameters;
  return b;
}

void check_job_sizes(const JobConfig& c, const ModelArgs& a, const MeshDims& dims) {
  const JobSizeBounds b = job_size_bounds(c, a, dims);
  const auto limit = static_cast<long double>(kMaxJobBytes);
  const std::string model = c.model.flavor == "hf" ? c.model.hf_assets_path + "/config.json"
                                                   : "flavor '" + c.model.flavor + "'";
  const std::string beyond =
      " per rank, beyond what titan counts (" + std::to_string(kMaxJobBytes) + " bytes, 1 EiB)";
  TITAN_CHECK(b.parameter_bytes <= limit, model, ": the model's parameters (num_hidden_layers ",
              a.num_hidden_layers, " x ", about(b.per_layer, "per layer"), ", vocab_size ",
              a.vocab_size, " x hidden_size ", a.hidden_size, ") would take up to ",
              about(b.parameter_bytes, "bytes"), beyond);
  TITAN_CHECK(b.activation_bytes <= limit, "training.seq_len (", c.training.seq_len,
              ") x training.local_batch_size (", c.training.local_batch_size,
              ") x num_hidden_layers (", a.num_hidden_layers, ", ", model,
              "): the activations would take up to ", about(b.activation_bytes, "bytes"), beyond);
  TITAN_CHECK(b.step_tokens <= limit, "training.global_batch_size (",
              about(b.global_batch, "sequences"), ") x training.seq_len (", c.training.seq_len,
              "): ", about(b.step_tokens, "tokens"), " per step, beyond what titan counts (",
              kMaxJobBytes, ")");
  TITAN_CHECK(b.sent_bytes <= limit, "training.global_batch_size (",
              about(b.global_batch, "sequences"), ") over ", dims.dp(),
              " data-parallel ranks with ", model, "'s ", about(b.parameters, "parameters"),
              ": a rank would send up to ", about(b.sent_bytes, "bytes"), " per step", beyond);
}

std::vector<std::string> job_world_unused_keys(const JobConfig& c, const MeshDims& dims,
                                               int64_t world_size) {
  const auto is_set = [&](const char* key) { return job_config_key_set(c, key); };
  std::vector<std::string> warnings;
  if (world_size == 1) {
    constexpr std::pair<const char*, const char*> kCommKeys[] = {
        {"comm.init_timeout_seconds", "a collective's wait for the other ranks"},
        {"comm.train_timeout_seconds", "a collective's wait for the other ranks"},
        {"comm.heartbeat_timeout_seconds", "how long another rank may stop answering"}};
    for (const auto& [key, limits] : kCommKeys) {
      if (is_set(key)) {
        warnings.push_back(std::string(key) + " has no effect: one process (it limits " + limits +
                           " under mpirun)");
      }
    }
  }
  if (!dims.fsdp() && is_set("parallelism.fsdp_reshard_after_forward")) {
    warnings.push_back(
        "parallelism.fsdp_reshard_after_forward has no effect: no FSDP (" +
        std::string(dims.dp_shard > 1 ? "expert_parallel_degree equals the shard degree)"
                    : world_size == 1 ? "data_parallel_shard_degree resolves to 1 in one process)"
                                      : "data_parallel_shard_degree resolves to 1)"));
  }
  if (dims.tp == 1 && is_set("parallelism.enable_sequence_parallel")) {
    warnings.push_back(
        "parallelism.enable_sequence_parallel has no effect: no tensor parallel "
        "(tensor_parallel_degree 1)");
  }
  return warnings;
}

std::vector<std::string> job_model_unused_keys(const JobConfig& c, const ModelArgs& args) {
  std::vector<std::string> warnings;
  const ActivationCheckpointing checkpointing = job_activation_checkpointing(c);
  if (checkpointing.mode == ActivationCheckpointing::Mode::layers &&
      checkpointing.every > args.num_hidden_layers) {
    warnings.push_back("activation_checkpoint.selective_ac_option = \"" +
                       c.activation_checkpoint.selective_ac_option +
                       "\" recomputes no layer: the model has " +
                       std::to_string(args.num_hidden_layers) +
                       " layers and \"N\" recomputes layers N, 2N, ...; every layer keeps its "
                       "activations, as under mode \"none\"");
  }
  return warnings;
}

DType job_compute_dtype(const JobConfig& c) {
  return c.training.mixed_precision_param == "bfloat16" ? DType::bf16 : DType::f32;
}

JobKernels resolve_job_kernels(const JobConfig& c) {
  JobKernels kernels;
  if (!c.experimental.custom_import.empty()) {
    kernels.plugin_kernels = load_kernel_plugin(c.experimental.custom_import);
  }
  for (const auto& [pattern, kernel] : c.overrides) kernels.overrides.push_back({pattern, kernel});
  return kernels;
}

namespace {

std::string under_tensor_parallel(const JobConfig& c) {
  return " under parallelism.tensor_parallel_degree " +
         std::to_string(c.parallelism.tensor_parallel_degree);
}

}  // namespace

void check_tensor_parallel_model(const JobConfig& c, const ModelArgs& args, const MeshDims& dims) {
  if (c.parallelism.tensor_parallel_degree == 1) return;
  // Without EP, torchtitan's expert tensor parallel: every rank holds 1/T of every expert's width
  // and the sparse block runs on the whole rows as a dense TP MLP does; nothing more to check.
  if (!args.is_moe() || dims.ep == 1) return;
  // torchtitan's EP x TP: the sparse blocks run on each TP rank's sequence shard, the experts
  // whole over an EP group holding the TP ranks.
  TITAN_CHECK(c.parallelism.enable_sequence_parallel ||
                  c.training.seq_len % c.parallelism.tensor_parallel_degree == 0,
              "training.seq_len ", c.training.seq_len, under_tensor_parallel(c),
              " on a model with experts: a sparse block runs on seq_len / ",
              c.parallelism.tensor_parallel_degree,
              " tokens of each sequence per rank, so the degree must divide it");
}

void check_expert_parallel_job(const JobConfig& c, const MeshDims& dims) {
  if (dims.ep == 1) return;
  const std::string under = " under parallelism.expert_parallel_degree " + std::to_string(dims.ep);
  TITAN_CHECK(dims.ep % dims.tp == 0, "parallelism.tensor_parallel_degree ", dims.tp, under,
              ": the EP degree must be a multiple of the TP degree (each EP group holds whole TP ",
              "groups; the experts' tensor-parallel cut beside EP is not built yet)");
  // The attention's adapter is replicated like the attention (models/lora.h); the experts' pairs
  // would need cutting like the experts.
  const std::string targets = c.lora.target_modules;
  TITAN_CHECK(c.lora.rank == 0 || (targets.find("gate_proj") == std::string::npos &&
                                   targets.find("up_proj") == std::string::npos &&
                                   targets.find("down_proj") == std::string::npos),
              "lora.target_modules ", targets, " with lora.rank ", c.lora.rank, under,
              ": LoRA on the experts under expert parallel is not built yet (adapt the "
              "attention only: lora.target_modules = \"q_proj,k_proj,v_proj,o_proj\")");
}

void check_tensor_parallel_job(const JobConfig& c) {
  if (c.parallelism.tensor_parallel_degree == 1) return;
  const std::string under = under_tensor_parallel(c);
  TITAN_CHECK(!c.parallelism.enable_sequence_parallel ||
                  c.training.seq_len % c.parallelism.tensor_parallel_degree == 0,
              "training.seq_len ", c.training.seq_len, under,
              " with parallelism.enable_sequence_parallel = true: each rank holds seq_len / ",
              c.parallelism.tensor_parallel_degree,
              " tokens of a sequence, so the degree must divide it (or set "
              "enable_sequence_parallel = false)");
  if (c.lora.rank == 0) return;
  // The adapter trains cut like its base (models/lora.h); these need the whole base on a rank.
  TITAN_CHECK(!c.lora.merge_on_export, "lora.merge_on_export = true", under,
              ": merging the adapter into a tensor-parallel model's export is not built yet "
              "(export the adapter and merge it with titan eval/generate --adapter or PEFT)");
  TITAN_CHECK(c.lora.base_dtype != "bfloat16", "lora.base_dtype = \"bfloat16\"", under,
              ": a frozen base held only in bf16 is not built yet under tensor parallel (set "
              "lora.base_dtype = \"float32\")");
}

}  // namespace titan
