// The job config (torchtitan's sections and keys) and the learning-rate schedule.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "error_of.h"
#include "titan/core/error.h"
#include "titan/train/job_config.h"
#include "titan/train/job_finetune.h"
#include "titan/train/job_resolve.h"
#include "titan/train/lr_schedule.h"
#include "titan/train/rank_agreement.h"

namespace titan {
namespace {

using test::error_of;

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

TEST(JobConfig, TomlThenCommandLineOverrides) {
  JobConfig c = job_config_preset("debugmodel");
  const std::string path =
      write_temp("job.toml",
                 "[training]\nsteps = 12\nseq_len = 64\n"
                 "[optimizer]\nlr = 3\n"  // an integer is a number too
                 "[overrides]\n\"model.layers.*.mlp\" = \"swiglu_reference\"\n");
  job_config_apply_toml(c, path);
  job_config_apply_override(c, "--training.steps=7");
  job_config_apply_override(c, "--checkpoint.enable=true");
  EXPECT_EQ(c.training.steps, 7);
  EXPECT_EQ(c.training.seq_len, 64);
  EXPECT_EQ(c.optimizer.lr, 3.0);
  EXPECT_TRUE(c.checkpoint.enable);
  ASSERT_EQ(c.overrides.size(), 1u);
  EXPECT_EQ(c.overrides[0].second, "swiglu_reference");
  // The printed config reads back to the same values.
  JobConfig again = job_config_preset("debugmodel");
  job_config_apply_toml(again, write_temp("printed.toml", job_config_to_toml(c)));
  EXPECT_EQ(job_config_to_toml(again), job_config_to_toml(c));
}

TEST(JobConfig, UnknownNamesSuggestTheClosest) {
  JobConfig c;
  EXPECT_NE(error_of([&] {
              job_config_apply_override(c, "--training.stpes=3");
            }).find("did you mean 'steps'"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              job_config_apply_override(c, "--optimiser.lr=3");
            }).find("did you mean [optimizer]"),
            std::string::npos);
  const std::string path = write_temp("bad.toml", "[metrics]\nlog_frequency = 3\n");
  const std::string message = error_of([&] { job_config_apply_toml(c, path); });
  EXPECT_NE(message.find("bad.toml"), std::string::npos) << message;
  EXPECT_NE(message.find("did you mean 'log_freq'"), std::string::npos) << message;
  EXPECT_NE(error_of([&] { job_config_preset("qwen3_06b"); }).find("qwen3_0.6b"),
            std::string::npos);
}

TEST(JobConfig, BadValuesNameTheKey) {
  JobConfig c;
  EXPECT_NE(error_of([&] {
              job_config_apply_override(c, "--training.steps=ten");
            }).find("training.steps must be an integer"),
            std::string::npos);
  const std::string path = write_temp("type.toml", "[training]\nseq_len = \"long\"\n");
  EXPECT_NE(error_of([&] { job_config_apply_toml(c, path); }).find("type.toml:2"),
            std::string::npos);
  const std::string broken = write_temp("broken.toml", "[training\nsteps = 3\n");
  EXPECT_NE(error_of([&] { job_config_apply_toml(c, broken); }).find("broken.toml:1"),
            std::string::npos);
  c.lr_scheduler.decay_type = "exponential";
  EXPECT_NE(error_of([&] { job_config_validate(c); }).find("decay_type"), std::string::npos);
  c = JobConfig{};
  c.training.local_batch_size = 0;
  EXPECT_NE(error_of([&] { job_config_validate(c); }).find("local_batch_size"), std::string::npos);
  // model.name is a family of the model registry, torchtitan's names where it has one.
  c = JobConfig{};
  for (const char* name : {"qwen3", "qwen2", "llama3"}) {
    c.model.name = name;
    EXPECT_NO_THROW(job_config_validate(c)) << name;
  }
  c.model.name = "llama";
  EXPECT_NE(error_of([&] {
              job_config_validate(c);
            }).find("model.name 'llama' is not one of qwen3, qwen2, llama3"),
            std::string::npos);
  // Mixed precision: torchtitan's values; fp32 is the only gradient reduction dtype.
  c = JobConfig{};
  for (const char* dtype : {"float32", "bfloat16"}) {
    c.training.mixed_precision_param = dtype;
    EXPECT_NO_THROW(job_config_validate(c)) << dtype;
  }
  c.training.mixed_precision_param = "float16";
  EXPECT_EQ(error_of([&] { job_config_validate(c); }),
            "training.mixed_precision_param 'float16' is not one of float32, bfloat16");
  c = JobConfig{};
  c.parallelism.fsdp_reshard_after_forward = "sometimes";
  EXPECT_EQ(error_of([&] { job_config_validate(c); }),
            "parallelism.fsdp_reshard_after_forward 'sometimes' is not one of default, always, "
            "never");
  c = JobConfig{};
  c.training.mixed_precision_reduce = "bfloat16";
  EXPECT_EQ(error_of([&] { job_config_validate(c); }),
            "training.mixed_precision_reduce 'bfloat16': gradients are reduced in float32, the "
            "only value torchtitan takes");
}

// --print-config writes each double as the shortest decimal that reads back to it.
TEST(JobConfig, PrintedFloatsAreTheShortestThatReadBack) {
  JobConfig c = job_config_preset("tiny");
  const std::string defaults = job_config_to_toml(c);
  EXPECT_NE(defaults.find("\nbeta1 = 0.9\n"), std::string::npos) << defaults;
  EXPECT_NE(defaults.find("\nlr = 8e-04\n"), std::string::npos) << defaults;
  EXPECT_NE(defaults.find("\nmax_norm = 1.0\n"), std::string::npos) << defaults;
  c.optimizer.lr = 0.1 + 0.2;  // 0.30000000000000004: needs all 17 digits
  c.optimizer.eps = 1e-300;
  c.optimizer.weight_decay = 5e-324;  // the smallest subnormal
  c.training.max_norm = 123456789.125;
  JobConfig again = job_config_preset("tiny");
  job_config_apply_toml(again, write_temp("floats.toml", job_config_to_toml(c)));
  EXPECT_EQ(again.optimizer.lr, c.optimizer.lr);
  EXPECT_EQ(again.optimizer.eps, c.optimizer.eps);
  EXPECT_EQ(again.optimizer.weight_decay, c.optimizer.weight_decay);
  EXPECT_EQ(again.training.max_norm, c.training.max_norm);
  EXPECT_NE(job_config_to_toml(c).find("\nlr = 0.30000000000000004\n"), std::string::npos);
}

// Keys that a file or flag set but the resolved config ignores: refused where the run would
// train on something else than asked, otherwise one warning naming the key and the remedy.
TEST(JobConfig, KeysSetToNoEffectAreNamed) {
  const auto unused_after = [](std::initializer_list<const char*> flags) {
    JobConfig c = job_config_preset("tiny");
    for (const char* flag : flags) job_config_apply_override(c, flag);
    return job_config_unused_keys(c);
  };
  const auto warns = [&](std::initializer_list<const char*> flags, const std::string& key,
                         const std::string& remedy) {
    const std::vector<std::string> w = unused_after(flags);
    ASSERT_EQ(w.size(), 1u) << key;
    EXPECT_EQ(w[0].rfind(key, 0), 0u) << w[0];
    EXPECT_NE(w[0].find(remedy), std::string::npos) << w[0];
  };
  EXPECT_TRUE(unused_after({}).empty());
  // The preset's own values are not the user's: presets set keys that may go unused.
  EXPECT_TRUE(job_config_preset("tiny").set_keys.empty());

  const std::string data = error_of([&] { unused_after({"--training.dataset_path=my.jsonl"}); });
  EXPECT_NE(data.find("training.dataset_path is set but training.dataset is \"default\""),
            std::string::npos)
      << data;
  EXPECT_TRUE(
      unused_after({"--training.dataset_path=my.jsonl", "--training.dataset=mine"}).empty());
  const std::string step = error_of([&] { unused_after({"--checkpoint.load_step=3"}); });
  EXPECT_NE(step.find("checkpoint.enable = true"), std::string::npos) << step;

  warns({"--model.hf_assets_path=/some/folder"}, "model.hf_assets_path gives only the tokenizer",
        "flavor 'tiny'");
  EXPECT_TRUE(unused_after({"--model.hf_assets_path=/f", "--model.flavor=hf"}).empty());
  warns({"--validation.freq=5"}, "validation.freq has no effect", "validation.enable is false");
  warns({"--training.allow_tf32=true"}, "training.allow_tf32 has no effect",
        "the CPU, which has no TF32");
  // On a GPU the key counts (checked before any device is opened: no GPU needed).
  EXPECT_TRUE(unused_after({"--training.allow_tf32=true", "--training.device=cuda"}).empty());
  EXPECT_TRUE(unused_after({"--validation.freq=5", "--validation.enable=true"}).empty());
  warns({"--validation.dataset=c4", "--validation.enable=true"}, "validation.dataset",
        "validation.dataset_path");
  warns({"--checkpoint.keep_latest_k=2"}, "checkpoint.keep_latest_k", "checkpoint.enable");
  warns({"--checkpoint.async_mode=async"}, "checkpoint.async_mode", "checkpoint.enable");
  EXPECT_TRUE(unused_after({"--checkpoint.async_mode=async", "--checkpoint.enable=true"}).empty());
  warns({"--checkpoint.initial_load_in_hf=true"}, "checkpoint.initial_load_in_hf",
        "initial_load_path is not set");
  warns({"--checkpoint.export_dtype=bfloat16", "--checkpoint.last_save_in_hf=false"},
        "checkpoint.export_dtype", "last_save_in_hf is false");
  EXPECT_TRUE(unused_after({"--checkpoint.export_dtype=bfloat16"}).empty());  // tiny exports
  warns({"--lr_scheduler.min_lr_factor=0.1", "--lr_scheduler.decay_type=none"},
        "lr_scheduler.min_lr_factor", "decay_type is \"none\"");
  warns({"--training.deterministic=false"}, "training.deterministic", "deterministic");
  // Cutting long conversations means something for chat data only.
  warns({"--training.truncate_long_conversations=true", "--training.dataset=mine",
         "--training.dataset_path=my.jsonl"},
        "training.truncate_long_conversations has no effect", "training.dataset is not \"chat\"");
  EXPECT_TRUE(unused_after({"--training.truncate_long_conversations=true",
                            "--training.dataset=chat", "--training.dataset_path=my.jsonl"})
                  .empty());
  // So does packing them (documents are always packed).
  warns({"--training.dataset_packing=true"}, "training.dataset_packing has no effect",
        "training.dataset is not \"chat\"");
  EXPECT_TRUE(unused_after({"--training.dataset_packing=true", "--training.dataset=chat",
                            "--training.dataset_path=my.jsonl"})
                  .empty());
  EXPECT_NE(data.find("set training.dataset to \"chat\" for conversations"), std::string::npos)
      << data;
  // torchtitan's older [training] place for the data-parallel keys is read as [parallelism].
  warns({"--training.data_parallel_shard_degree=2"}, "training.data_parallel_shard_degree",
        "read as parallelism.data_parallel_shard_degree");
  JobConfig moved;
  job_config_apply_toml(moved, write_temp("moved.toml",
                                          "[training]\ndata_parallel_replicate_degree = 2\n"
                                          "fsdp_reshard_after_forward = \"never\"\n"));
  EXPECT_EQ(moved.parallelism.data_parallel_replicate_degree, 2);
  EXPECT_EQ(moved.parallelism.fsdp_reshard_after_forward, "never");
  EXPECT_EQ(job_config_unused_keys(moved).size(), 2u);
  EXPECT_NE(job_config_to_toml(moved).find("[parallelism]\ndata_parallel_replicate_degree = 2"),
            std::string::npos);
}

// A saved resolved config (job_config.toml) names every key, most at their defaults: read back,
// it warns about nothing and refuses nothing, as the command that made it.
TEST(JobConfig, ASavedResolvedConfigRunsQuietly) {
  JobConfig c = job_config_preset("tiny");
  job_config_apply_override(c, "--training.steps=7");
  JobConfig again;
  job_config_apply_toml(again, write_temp("resolved.toml", job_config_to_toml(c)));
  EXPECT_EQ(again.training.steps, 7);
  EXPECT_TRUE(job_config_unused_keys(again).empty());
  EXPECT_TRUE(job_world_unused_keys(again, {1, 1}, 1).empty());
  EXPECT_TRUE(job_config_key_set(again, "training.steps"));
  EXPECT_FALSE(job_config_key_set(again, "validation.freq"));  // set, to the default
  EXPECT_FALSE(job_config_key_set(c, "validation.freq"));      // not set
}

// A folder given without a model is fine-tuned (train/job_finetune.h); a model named, by flavor
// or preset, keeps the folder to its tokenizer. The warm-up is 3 % of the steps rounded up, at
// least 1 (0 for no steps), for any step count.
TEST(JobFinetune, WhoFinetunesAndTheWarmup) {
  const auto with = [](std::initializer_list<const char*> flags) {
    JobConfig c = job_config_preset("tiny");
    for (const char* flag : flags) job_config_apply_override(c, flag);
    return c;
  };
  EXPECT_TRUE(job_finetunes_folder(with({"--model.hf_assets_path=/m"}), kDefaultPreset));
  EXPECT_FALSE(job_finetunes_folder(with({"--model.hf_assets_path=/m"}), "hf"));
  EXPECT_FALSE(job_finetunes_folder(with({"--model.hf_assets_path=/m", "--model.flavor=hf"}),
                                    kDefaultPreset));
  EXPECT_FALSE(job_finetunes_folder(with({}), kDefaultPreset));
  EXPECT_FALSE(job_finetunes_folder(with({"--model.hf_assets_path="}), kDefaultPreset));
  // The default run resolves to itself.
  JobConfig plain = with({});
  EXPECT_TRUE(resolve_job_defaults(plain, kDefaultPreset).empty());
  EXPECT_EQ(job_config_to_toml(plain), job_config_to_toml(with({})));

  EXPECT_EQ(finetune_warmup_steps(0), 0);
  EXPECT_EQ(finetune_warmup_steps(1), 1);
  EXPECT_EQ(finetune_warmup_steps(33), 1);
  EXPECT_EQ(finetune_warmup_steps(34), 2);
  EXPECT_EQ(finetune_warmup_steps(100), 3);
  EXPECT_EQ(finetune_warmup_steps(101), 4);
  // No overflow: INT64_MAX ends in 07, whose 3 % (0.21) rounds up to 1.
  EXPECT_EQ(finetune_warmup_steps(INT64_MAX), INT64_MAX / 100 * 3 + 1);
}

// torchtitan's keys titan does not act on are accepted, from a file (nested tables too) or a flag,
// and named in one line per reason; [debug]'s seed and deterministic are [training]'s.
TEST(JobConfig, TorchtitanKeysWithoutEffectAreAcceptedAndNamed) {
  JobConfig c = job_config_preset("tiny");
  job_config_apply_toml(c, write_temp("torchtitan.toml",
                                      "[compile]\nenable = true\ncomponents = [\"model\"]\n"
                                      "[quantize.linear.float8]\nfilter_fqns = [\"output\"]\n"
                                      "[activation_checkpoint]\nmode = \"selective\"\n"
                                      "[debug]\nseed = 7\n"));
  job_config_apply_override(c, "--profiling.enable_memory_snapshot=true");
  EXPECT_EQ(c.training.seed, 7);
  EXPECT_EQ(c.inert_keys, (std::vector<std::string>{"compile.components", "compile.enable",
                                                    "quantize.linear.float8.filter_fqns",
                                                    "profiling.enable_memory_snapshot"}));
  job_config_validate(c);
  // mode = "selective" is implemented: torchtitan's default option, every 2nd layer.
  EXPECT_EQ(job_activation_checkpointing(c), ActivationCheckpointing::every_nth_layer(2));
  const std::vector<std::string> w = job_config_unused_keys(c);
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[0].rfind("compile.components, compile.enable have no effect here: ", 0), 0u) << w[0];
  EXPECT_EQ(w[1].rfind("quantize.linear.float8.filter_fqns has no effect here: ", 0), 0u) << w[1];
  EXPECT_EQ(w[2].rfind("profiling.enable_memory_snapshot has no effect here: ", 0), 0u) << w[2];
  // A key torchtitan does not have either is still an error naming the closest.
  EXPECT_NE(error_of([&] {
              job_config_apply_override(c, "--compile.enabel=true");
            }).find("unknown key 'enabel' in [compile]"),
            std::string::npos);
}

// activation_checkpoint.selective_ac_option: "op" or a positive layer count under selective; a bad
// value, or an option beside mode = "none", is one line naming the key and the value; beside
// "full" (as torchtitan's own TOMLs have it) it is named as without effect.
TEST(JobConfig, SelectiveActivationCheckpointingOptions) {
  const auto config = [](const std::string& mode, const std::string& option) {
    JobConfig c = job_config_preset("tiny");
    job_config_apply_override(c, "--activation_checkpoint.mode=" + mode);
    job_config_apply_override(c, "--activation_checkpoint.selective_ac_option=" + option);
    return c;
  };
  EXPECT_EQ(job_activation_checkpointing(config("selective", "op")),
            ActivationCheckpointing::ops());
  EXPECT_EQ(job_activation_checkpointing(config("selective", "3")),
            ActivationCheckpointing::every_nth_layer(3));
  EXPECT_EQ(job_activation_checkpointing(config("full", "op")), ActivationCheckpointing::full());
  EXPECT_EQ(job_activation_checkpointing(job_config_preset("tiny")),
            ActivationCheckpointing::none());
  for (const char* bad : {"0", "-1", "abc", "2x", "+2", "", "99999999999999999999"}) {
    const JobConfig c = config("selective", bad);
    EXPECT_EQ(error_of([&] { job_config_validate(c); }),
              std::string("activation_checkpoint.selective_ac_option \"") + bad +
                  "\" is not \"op\" or a positive layer count N (every N-th layer recomputed)");
  }
  EXPECT_EQ(error_of([&] { job_config_unused_keys(config("none", "op")); }),
            "activation_checkpoint.selective_ac_option = \"op\" is set but "
            "activation_checkpoint.mode is \"none\": set mode = \"selective\" for it to count");
  const std::vector<std::string> w = job_config_unused_keys(config("full", "op"));
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].rfind("activation_checkpoint.selective_ac_option has no effect: "
                       "activation_checkpoint.mode is \"full\"",
                       0),
            0u)
      << w[0];
}

// selective "N" above the model's layer count recomputes no layer: one warning line (torchtitan
// says nothing), the run left as it is; N equal to the count recomputes the last layer.
TEST(JobConfig, SelectiveEveryNthLayerBeyondTheModelIsNamed) {
  JobConfig c = job_config_preset("tiny");
  const ModelArgs args = resolve_job_model_args(c);
  const std::string layers = std::to_string(args.num_hidden_layers);
  const std::string beyond = std::to_string(args.num_hidden_layers + 1);
  job_config_apply_override(c, "--activation_checkpoint.mode=selective");
  job_config_apply_override(c, "--activation_checkpoint.selective_ac_option=" + layers);
  EXPECT_TRUE(job_model_unused_keys(c, args).empty());
  job_config_apply_override(c, "--activation_checkpoint.selective_ac_option=" + beyond);
  EXPECT_EQ(job_model_unused_keys(c, args),
            std::vector<std::string>{"activation_checkpoint.selective_ac_option = \"" + beyond +
                                     "\" recomputes no layer: the model has " + layers +
                                     " layers and \"N\" recomputes layers N, 2N, ...; every "
                                     "layer keeps its activations, as under mode \"none\""});
  job_config_apply_override(c, "--activation_checkpoint.selective_ac_option=op");
  EXPECT_TRUE(job_model_unused_keys(c, args).empty());
}

// Keys whose effect depends on the world: the collective and heartbeat timeouts in one process, the
// FSDP reshard policy without FSDP, sequence parallel without TP.
TEST(JobConfig, KeysWithNoEffectOnThisWorldAreNamed) {
  JobConfig c = job_config_preset("tiny");
  EXPECT_TRUE(job_world_unused_keys(c, {1, 1}, 1).empty());
  job_config_apply_override(c, "--comm.train_timeout_seconds=30");
  job_config_apply_override(c, "--comm.heartbeat_timeout_seconds=10");
  job_config_apply_override(c, "--parallelism.fsdp_reshard_after_forward=always");
  EXPECT_EQ(job_world_unused_keys(c, {1, 1}, 1),
            (std::vector<std::string>{
                "comm.train_timeout_seconds has no effect: one process (it limits a collective's "
                "wait for the other ranks under mpirun)",
                "comm.heartbeat_timeout_seconds has no effect: one process (it limits how long "
                "another rank may stop answering under mpirun)",
                "parallelism.fsdp_reshard_after_forward has no effect: no FSDP "
                "(data_parallel_shard_degree resolves to 1 in one process)"}));
  EXPECT_EQ(job_world_unused_keys(c, {2, 1}, 2),
            (std::vector<std::string>{"parallelism.fsdp_reshard_after_forward has no effect: no "
                                      "FSDP (data_parallel_shard_degree resolves to 1)"}));
  EXPECT_TRUE(job_world_unused_keys(c, {1, 2}, 2).empty());
  // Sequence parallel without tensor parallel.
  JobConfig sp = job_config_preset("tiny");
  job_config_apply_override(sp, "--parallelism.enable_sequence_parallel=false");
  EXPECT_EQ(job_world_unused_keys(sp, {1, 2}, 2),
            (std::vector<std::string>{"parallelism.enable_sequence_parallel has no effect: no "
                                      "tensor parallel (tensor_parallel_degree 1)"}));
  EXPECT_TRUE(job_world_unused_keys(sp, {1, 1, 2}, 2).empty());
}

// What ranks compare at start-up (train/rank_agreement.h): every key as "section.key = value",
// and the first that differs named with both values.
TEST(RankAgreement, TheFirstDifferingKeyIsNamedWithBothValues) {
  JobConfig config = job_config_preset("tiny");
  const std::vector<std::string> lines = job_config_lines(config);
  EXPECT_NE(std::find(lines.begin(), lines.end(), "training.seq_len = 256"), lines.end());
  EXPECT_NE(std::find(lines.begin(), lines.end(), "model.flavor = 'tiny'"), lines.end());
  EXPECT_EQ(first_difference(lines, lines), "");
  JobConfig other = config;
  job_config_apply_override(other, "--training.seed=7");
  job_config_apply_override(other, "--optimizer.lr=1e-3");
  EXPECT_EQ(first_difference(job_config_lines(other), lines),
            "has training.seed = 7, rank 0 has 0");  // training comes before optimizer
  other = config;
  other.overrides = {{"model.layers.*.mlp", "swiglu_reference"}};
  EXPECT_EQ(first_difference(job_config_lines(other), lines),
            "has overrides.'model.layers.*.mlp' = 'swiglu_reference' where rank 0 has none")
      << job_config_lines(other).back();
  const std::vector<std::string> a = {"the titan binary = 0123456789abcdef (10 bytes)", "x = 1"};
  const std::vector<std::string> b = {"the titan binary = fedcba9876543210 (11 bytes)", "x = 2"};
  EXPECT_EQ(first_difference(a, b),
            "runs another titan binary (fingerprint 0123456789abcdef (10 bytes), rank 0's "
            "fedcba9876543210 (11 bytes)): run the same build on every rank");
  EXPECT_EQ(binary_fingerprint(), binary_fingerprint());
  EXPECT_EQ(binary_fingerprint().size(),
            std::string("0123456789abcdef (").size() +
                std::to_string(std::filesystem::file_size("/proc/self/exe")).size() +
                std::string(" bytes)").size());
}

TEST(LrSchedule, WarmupStableDecay) {
  // 10 steps: 2 warmup, decay over the last 4 (decay_ratio 0.4), cosine to 10%.
  const LrSchedule s = LrSchedule::make(1.0, 10, 2, 0.4, "cosine", 0.1);
  EXPECT_DOUBLE_EQ(s.at(1), 1.0 / 3);  // (i + 1) / (warmup + 1)
  EXPECT_DOUBLE_EQ(s.at(2), 2.0 / 3);
  for (int64_t step = 3; step <= 6; ++step) EXPECT_DOUBLE_EQ(s.at(step), 1.0);
  EXPECT_DOUBLE_EQ(s.at(7), 1.0);  // progress 0
  EXPECT_NEAR(s.at(9), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.5)), 1e-12);
  const LrSchedule linear = LrSchedule::make(2.0, 5, 1, -1.0, "linear", 0.0);
  EXPECT_DOUBLE_EQ(linear.at(2), 2.0);        // decay starts right after warmup
  EXPECT_DOUBLE_EQ(linear.at(4), 2.0 * 0.5);  // progress 2 / 4
  EXPECT_TRUE(linear.adjusted.empty());
  // Warm-up (and decay) longer than the run are shortened as torchtitan does, and said.
  const LrSchedule longer = LrSchedule::make(1.0, 5, 6, 0.8, "linear", 0.0);
  EXPECT_EQ(longer.warmup_steps, 5);
  EXPECT_EQ(longer.decay_steps, 0);
  EXPECT_DOUBLE_EQ(longer.at(5), 1.0 * 5 / 6);
  EXPECT_NE(longer.adjusted.find("warm-up shortened to 5 steps"), std::string::npos)
      << longer.adjusted;
  const LrSchedule decay = LrSchedule::make(1.0, 10, 4, 0.8, "linear", 0.0);
  EXPECT_EQ(decay.decay_steps, 6);
  EXPECT_NE(decay.adjusted.find("decay shortened to 6 steps"), std::string::npos) << decay.adjusted;
}

// What tensor parallel cannot do yet is refused in one line naming the key; nothing without TP.
TEST(JobConfig, TensorParallelRefusesWhatIsNotBuiltNamingTheKey) {
  JobConfig c = job_config_preset("tiny");
  job_config_apply_override(c, "--checkpoint.enable=true");
  check_tensor_parallel_job(c);  // TP 1: sequence parallel's default true is no matter
  job_config_apply_override(c, "--parallelism.tensor_parallel_degree=2");
  check_tensor_parallel_job(c);  // sequence parallel on, seq_len even
  JobConfig odd = c;
  job_config_apply_override(odd, "--training.seq_len=63");
  EXPECT_NE(error_of([&] { check_tensor_parallel_job(odd); })
                .find("training.seq_len 63 under parallelism.tensor_parallel_degree 2 with "
                      "parallelism.enable_sequence_parallel = true: each rank holds seq_len / 2 "
                      "tokens of a sequence, so the degree must divide it"),
            std::string::npos);
  job_config_apply_override(odd, "--parallelism.enable_sequence_parallel=false");
  check_tensor_parallel_job(odd);
  JobConfig async = c;
  job_config_apply_override(async, "--checkpoint.async_mode=async");
  check_tensor_parallel_job(async);  // asynchronous checkpoints of TP cuts are built
  JobConfig lora = c;
  job_config_apply_override(lora, "--lora.rank=4");
  check_tensor_parallel_job(lora);  // LoRA's cut adapter is built
  JobConfig merged = lora;
  job_config_apply_override(merged, "--lora.merge_on_export=true");
  EXPECT_NE(error_of([&] { check_tensor_parallel_job(merged); })
                .find("lora.merge_on_export = true under parallelism.tensor_parallel_degree 2: "
                      "merging the adapter into a tensor-parallel model's export is not built yet"),
            std::string::npos);
  JobConfig base_bf16 = lora;
  job_config_apply_override(base_bf16, "--lora.base_dtype=bfloat16");
  EXPECT_NE(error_of([&] {
              check_tensor_parallel_job(base_bf16);
            }).find("lora.base_dtype = \"bfloat16\" under parallelism.tensor_parallel_degree 2"),
            std::string::npos);
  const ModelArgs dense = resolve_job_model_args(c);
  check_tensor_parallel_model(c, dense, {1, 2, 2});  // checkpoints on: built under FSDP x TP
  ModelArgs moe = dense;
  moe.num_experts = 4;                                // a model with experts
  check_tensor_parallel_model(c, moe, {1, 1, 2});     // TP without EP: the experts' width cut
  check_tensor_parallel_model(c, moe, {1, 1, 2, 2});  // EP x TP with sequence parallel
  JobConfig no_sp = c;
  job_config_apply_override(no_sp, "--parallelism.enable_sequence_parallel=false");
  check_tensor_parallel_model(no_sp, moe, {1, 1, 2, 2});  // the sparse blocks' rows sliced
  job_config_apply_override(no_sp, "--training.seq_len=63");
  EXPECT_NE(error_of([&] {
              check_tensor_parallel_model(no_sp, moe, {1, 1, 2, 2});
            })
                .find("training.seq_len 63 under parallelism.tensor_parallel_degree 2 on a model "
                      "with experts"),
            std::string::npos);
  check_tensor_parallel_model(c, moe, {1, 2, 2, 2});  // checkpoints on: built under FSDP x TP x EP
}

}  // namespace
}  // namespace titan
