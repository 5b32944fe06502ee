#include "titan/train/lora_job.h"

#include <algorithm>
#include <cstdio>

#include "titan/core/error.h"
#include "titan/dispatch/device_ops.h"
#include "titan/io/json_util.h"
#include "titan/models/forward_only_model.h"
#include "titan/models/hf_checkpoint.h"
#include "titan/models/nonfinite_weights.h"
#include "titan/models/param_count.h"
#include "titan/models/peft_adapter.h"
#include "titan/nn/host_params.h"
#include "titan/train/job_resolve.h"

namespace titan {

LoraOptions job_lora_options(const JobConfig& config) {
  LoraOptions o;
  o.rank = config.lora.rank;
  o.alpha = config.lora.alpha;
  o.dropout = config.lora.dropout;
  o.target_modules = parse_lora_targets(config.lora.target_modules, "lora.target_modules");
  return o;
}

void check_lora_config(const JobConfig& c) {
  TITAN_CHECK(c.checkpoint.initial_load_path.empty() || c.checkpoint.initial_load_in_hf,
              "lora.rank > 0 loads the frozen model from a Hugging Face folder: set "
              "checkpoint.initial_load_in_hf = true (checkpoint.initial_load_path ",
              c.checkpoint.initial_load_path, ")");
}

void check_lora_job(const JobConfig& c) {
  if (c.lora.rank == 0) return;
  check_lora_config(c);
  if (c.lora.initial_adapter.empty()) return;
  const LoraOptions want = job_lora_options(c);
  const LoraOptions got = read_peft_adapter_config(c.lora.initial_adapter);
  TITAN_CHECK(got.rank == want.rank && got.alpha == want.alpha &&
                  got.target_modules.size() == want.target_modules.size(),
              "lora.initial_adapter ", c.lora.initial_adapter, " is r = ", got.rank,
              ", lora_alpha = ", got.alpha, " on ", got.target_modules.size(),
              " modules; the config asks for lora.rank = ", want.rank,
              ", lora.alpha = ", want.alpha, " on ", want.target_modules.size());
  for (const std::string& t : want.target_modules) {
    TITAN_CHECK(std::find(got.target_modules.begin(), got.target_modules.end(), t) !=
                    got.target_modules.end(),
                "lora.initial_adapter ", c.lora.initial_adapter, " does not adapt ", t,
                ", which lora.target_modules names");
  }
}

bool lora_base_in_bf16(const JobConfig& c) {
  return c.lora.rank > 0 && c.lora.base_dtype == "bfloat16";
}

void check_lora_base_dtype(const JobConfig& c, const ModelArgs& args) {
  if (!lora_base_in_bf16(c)) return;
  TITAN_CHECK(!c.checkpoint.initial_load_path.empty(),
              "lora.base_dtype = \"bfloat16\" loads the frozen base from a Hugging Face folder "
              "into bf16: set checkpoint.initial_load_path (a random base is made in fp32)");
  const LoraOptions options = job_lora_options(c);
  bool sparse = false;
  for (int64_t i = 0; args.is_moe() && i < args.num_hidden_layers; ++i) {
    sparse = sparse || args.layer_is_sparse(i);
  }
  TITAN_CHECK(!sparse || (!options.targets("gate_proj") && !options.targets("down_proj")),
              "lora.base_dtype = \"bfloat16\" holds no fp32 expert weights, which the experts' "
              "LoRA (gate_proj, up_proj, down_proj on a MoE model) merges at each step: use "
              "lora.base_dtype = \"float32\", or adapt the attention only");
}

void hold_lora_base_in_bf16(CausalLM& model) {
  // The masters go back before the copies are committed: the two are never held together.
  const std::vector<std::vector<ComputeCopyTarget>> held = model.bf16_only_params();
  for (size_t i = 0; i < held.size(); ++i) {
    const std::vector<ComputeCopyTarget>& targets = held[i];
    ParamGroup& g = model.param_groups()[i];
    g.release_params();
    g.acquire_params_where([&](const ParamView& v) {
      return std::none_of(targets.begin(), targets.end(),
                          [&](const ComputeCopyTarget& t) { return t.param == v.spec.name; });
    });
  }
  model.hold_compute_copies(false);
}

namespace {

// The frozen base from a Hugging Face folder into FSDP's shards holding it in bf16 (`groups`, cut
// `cut`: the views with a compute copy are bf16 rows, FullyShardedGroups' bf16_shards).
void load_bf16_shards(const JobConfig& c, const ModelArgs& args, std::vector<ParamGroup>& groups,
                      Shard cut) {
  Bf16Destinations bf16;
  for (const ParamGroup& g : groups) {
    for (const ParamView& v : g.views()) {
      if (v.copy_offset >= 0) bf16.emplace(v.spec.name, g.compute_copy() + v.copy_offset);
    }
  }
  TITAN_CHECK(!bf16.empty(),
              "lora.base_dtype = \"bfloat16\": the model's shards hold no bf16 rows");
  load_hf_weights(args, groups, c.checkpoint.initial_load_path, "the model's config",
                  c.checkpoint.allow_nonfinite_weights, cut, bf16);
}

// The frozen base from a Hugging Face folder into a model holding it in bf16
// (hold_lora_base_in_bf16).
void load_bf16_base(const JobConfig& c, const ModelArgs& args, CausalLM& model) {
  Bf16Destinations bf16;
  for (const std::vector<ComputeCopyTarget>& group : model.bf16_only_params()) {
    for (const ComputeCopyTarget& t : group) bf16.emplace(t.param, t.copy);
  }
  load_hf_weights(args, model.param_groups(), c.checkpoint.initial_load_path, "the model's config",
                  c.checkpoint.allow_nonfinite_weights, Shard{}, bf16);
  // The copies of weights held in fp32 too (a tied embedding's lm_head copy).
  for (const std::vector<ComputeCopyTarget>& group : model.copied_params()) {
    for (const ComputeCopyTarget& t : group) {
      if (bf16.count(t.param) == 0) round_from_master(model, t.param, t.copy);
    }
  }
}

}  // namespace

void widen_lora_base_to_fp32(CausalLM& model) {
  const std::vector<std::vector<ComputeCopyTarget>> held = model.bf16_only_params();
  for (size_t i = 0; i < held.size(); ++i) {
    const std::vector<ComputeCopyTarget>& targets = held[i];
    ParamGroup& g = model.param_groups()[i];
    // The views held in fp32 kept across the recommit (the others read zero until widened).
    std::vector<float> kept(g.params(), g.params() + g.numel());
    g.release_params();
    g.acquire_params();
    std::copy(kept.begin(), kept.end(), g.params());
    for (const ComputeCopyTarget& t : targets) {
      const ParamView& v = g.view(t.param);
      device_ops().widen_bf16(g.params() + v.offset, t.copy, v.numel);
    }
  }
}

std::unique_ptr<LoraAdapter> attach_job_lora(const JobConfig& config, const ModelArgs& args,
                                             CausalLM& model, const ParallelizePlan& plan) {
  auto adapter = std::make_unique<LoraAdapter>(args, job_lora_options(config), plan);
  model.attach_lora(*adapter);
  // The whole adapter's and model's counts, from their shapes: under TP or EP this rank holds
  // parts of them.
  int64_t trained = 0;
  for (const ParamGroupSpec& group : lora_param_specs(args, adapter->options())) {
    for (const ParamSpec& p : group.params) trained += shape_numel(p.shape);
  }
  const int64_t total = count_parameters(args).total;
  std::printf(
      "LoRA: rank %lld, alpha %g (scaling %g) on %s of every layer: %lld trainable parameters "
      "(%.3g %% of the model's %lld, which stay frozen: no gradients, no AdamW state)\n",
      static_cast<long long>(config.lora.rank), config.lora.alpha, adapter->options().scaling(),
      config.lora.target_modules.c_str(), static_cast<long long>(trained),
      100.0 * static_cast<double>(trained) / static_cast<double>(total),
      static_cast<long long>(total));
  if (!adapter->experts().empty()) {
    const ExpertLora& e = adapter->experts().front();
    std::printf(
        "LoRA on the experts of %zu sparse layers, as PEFT's target_parameters: gate_up_proj rank "
        "%lld, down_proj rank %lld (0: not adapted); the dense layers' MLPs are not adapted\n",
        adapter->experts().size(), static_cast<long long>(e.gate_up.rank),
        static_cast<long long>(e.down.rank));
  }
  return adapter;
}

void load_lora_run_weights(const JobConfig& c, const ModelArgs& args,
                           std::vector<ParamGroup>& model_groups, Shard model_cut,
                           const ParallelizePlan& plan, LoraAdapter& adapter, bool starting,
                           CausalLM& model) {
  const std::string& initial = c.checkpoint.initial_load_path;
  if (lora_base_in_bf16(c)) {
    if (model_cut.count > 1) {
      load_bf16_shards(c, args, model_groups, model_cut);
    } else {
      load_bf16_base(c, args, model);
    }
    std::printf(
        "frozen model weights from %s, its matmul weights held only in bf16 "
        "(lora.base_dtype = \"bfloat16\")\n",
        initial.c_str());
  } else if (!initial.empty()) {
    // On a device into host copies, copied in after (nn/host_params.h).
    write_params_on_host(model_groups, false, [&](std::vector<ParamGroup>& groups) {
      load_hf_weights(args, groups, initial, "the model's config",
                      c.checkpoint.allow_nonfinite_weights, model_cut, {}, plan);
    });
    std::printf("frozen model weights from %s\n", initial.c_str());
  } else {
    std::printf("frozen model weights: random (HF init, seed %lld)\n",
                static_cast<long long>(c.training.seed));
  }
  if (!starting) return;  // the adapter comes from the checkpoint resumed
  if (c.lora.initial_adapter.empty()) {
    std::printf("LoRA adapter: PEFT's init (A Kaiming-uniform, seed %lld; B zero)\n",
                static_cast<long long>(c.training.seed));
    return;
  }
  load_peft_adapter(c.lora.initial_adapter, adapter);
  std::printf("LoRA adapter: from %s\n", c.lora.initial_adapter.c_str());
}

std::string job_export_dir(const JobConfig& c) {
  const bool adapter = c.lora.rank > 0 && !c.lora.merge_on_export;
  return c.job.dump_folder + (adapter ? "/adapter" : "/hf");
}

std::string job_export_content(const JobConfig& c) {
  return c.lora.rank > 0 && !c.lora.merge_on_export ? "peft adapter" : "model";
}

void export_lora(const JobConfig& config, const LoraAdapter& adapter, const std::string& base_model,
                 bool writes, const NonfiniteScan& scan, const std::function<void()>& export_model,
                 const AdapterTensorGather& gather) {
  if (writes || !config.checkpoint.allow_nonfinite_weights) {  // one warning, every rank's error
    scan.check(config.checkpoint.allow_nonfinite_weights);
  }
  if (config.lora.merge_on_export) {
    export_model();
    return;
  }
  if (!writes) {
    if (gather) {
      for (const auto& [group, param] : peft_adapter_read_order(adapter)) {
        gather(group, param, nullptr);
      }
    }
    return;
  }
  const std::string dir = job_export_dir(config);
  write_peft_adapter(dir, adapter, base_model, true, gather);
  std::printf("exported the LoRA adapter as a PEFT adapter folder: %s (base model %s)\n",
              dir.c_str(), base_model.c_str());
}

}  // namespace titan
