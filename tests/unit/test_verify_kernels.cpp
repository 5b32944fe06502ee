// verify_kernel and `titan verify-kernels`: every built-in kernel passes every form it has, and
// kernels that are wrong the ways a custom kernel goes wrong (a dropped term, an ignored weight,
// a NaN, a broken bf16 form, a throw) fail, by name. Kernel plugins (dispatch/plugin.h): loaded,
// verified, bound by an override in a training run, and every bad one refused by name.
#include <gtest/gtest.h>
#include <algorithm>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "python_runner.h"
#include "test_dataset_util.h"
#include "titan/core/error.h"
#include "titan/dispatch/plugin.h"
#include "titan/dispatch/registry.h"
#include "titan/dispatch/verify.h"
#include "titan/ops/linear.h"
#include "titan/ops/moe_stages.h"
#include "titan/ops/rms_norm.h"
#include "titan/ops/swiglu.h"
#include "titan_cli_run.h"

namespace titan {
namespace {

// The forms each kind's check runs when the kernel has every one of them.
size_t checks_of(const KernelEntry& e) {
  const KernelReport r = verify_kernel(e);
  return r.checks.size();
}

TEST(VerifyKernels, EveryBuiltInKernelPassesEveryFormItHas) {
  for (const KernelEntry* e : kernel_registry().entries()) {
    if (e->device != DeviceKind::cpu) continue;  // a CUDA build's: titan_cuda_kernels_test's
    const KernelReport r = verify_kernel(*e);
    EXPECT_FALSE(r.checks.empty()) << e->name;
    for (const KernelCheck& c : r.checks) {
      EXPECT_TRUE(c.passed()) << e->name << " " << c.form << " " << c.output << ": " << c.error
                              << " > " << c.tolerance;
    }
  }
  // The bf16 forms are checked where a kernel has them: linear's y, its dx and dweight from both
  // backwards, the same three in bf16, and the bf16 forward's rounded y; attention's forward (out,
  // lse), backward (dq, dk, dv), the three bf16 forms, and the forward and backward again on
  // packed rows (a kernel that declares it takes them).
  EXPECT_EQ(checks_of(kernel_registry().get("linear", OpKind::linear)), 9u);
  EXPECT_EQ(checks_of(kernel_registry().get("swiglu", OpKind::swiglu)), 6u);
  EXPECT_EQ(checks_of(kernel_registry().get("swiglu_reference", OpKind::swiglu)), 3u);
  EXPECT_EQ(checks_of(kernel_registry().get("attention_blockwise", OpKind::attention)), 17u);
  // The experts' stages (ops/moe_stages.h): the router's index, weight, probs and dlogits with
  // and without renormalisation; dispatch's plan (row_of, offsets), both gathers and its backward
  // (dx, dweight); the grouped compute's four outputs in each dtype; combine's y, dy rows and
  // weights.
  EXPECT_EQ(checks_of(kernel_registry().get("router_topk", OpKind::router)), 8u);
  EXPECT_EQ(checks_of(kernel_registry().get("moe_dispatch", OpKind::moe_dispatch)), 6u);
  EXPECT_EQ(checks_of(kernel_registry().get("grouped_experts", OpKind::grouped_experts)), 8u);
  EXPECT_EQ(checks_of(kernel_registry().get("moe_combine", OpKind::moe_combine)), 3u);
  EXPECT_EQ(checks_of(kernel_registry().get("experts_staged", OpKind::experts)), 8u);
  // The vocabulary-parallel forms on 2 and 3 ranks: the embedding's lookup and scatter (after
  // forward, forward_bf16, backward); the loss's loss, dx and dweight in fp32 and bf16 (after the
  // same six over the whole vocabulary).
  EXPECT_EQ(checks_of(kernel_registry().get("embedding", OpKind::embedding)), 7u);
  EXPECT_EQ(checks_of(kernel_registry().get("cross_entropy_chunked", OpKind::lm_head_loss)), 18u);
}

// The weighted sum without its weights; the grouped backward with every row's weight 1.
void moe_combine_forward_unweighted(float* y, const float* out_rows, const int32_t* row_of,
                                    const int32_t* index, const float* weight,
                                    const ExpertsShape& s) {
  (void)weight;
  const std::vector<float> unit(static_cast<size_t>(s.rows()), 1.0f);
  moe_combine_forward(y, out_rows, row_of, index, unit.data(), s);
}

void grouped_experts_backward_unweighted(float* rows, float* dweight_rows, const ExpertGrads& dw,
                                         const ExpertsScratch& s, const float* w_rows,
                                         const ExpertsActivations& act, const float* x_rows,
                                         const int32_t* offsets, const ExpertWeights& w,
                                         const ExpertsShape& shape) {
  const std::vector<float> unit(static_cast<size_t>(shape.rows()), 1.0f);
  (void)w_rows;
  grouped_experts_backward(rows, dweight_rows, dw, s, unit.data(), act, x_rows, offsets, w, shape);
}

TEST(VerifyKernels, WrongMoeStagesFail) {
  const KernelReport combine =
      verify_kernel({"combine_unweighted",
                     OpKind::moe_combine,
                     {DType::f32},
                     "test",
                     MoeCombineKernel{moe_combine_forward_unweighted, moe_combine_backward}});
  EXPECT_FALSE(combine.passed());
  const KernelReport grouped = verify_kernel(
      {"grouped_unweighted",
       OpKind::grouped_experts,
       {DType::f32},
       "test",
       GroupedExpertsKernel{grouped_experts_forward, grouped_experts_backward_unweighted}});
  EXPECT_FALSE(grouped.passed());
  for (const KernelCheck& c : grouped.checks) {
    if (c.form == "forward") {
      EXPECT_TRUE(c.passed()) << c.output;
    }
  }
}

// y = x W^T over all but the last input feature.
void linear_forward_dropping_a_term(float* y, const float* x, const float* w, int64_t n, int64_t in,
                                    int64_t out) {
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t o = 0; o < out; ++o) {
      float s = 0.0f;
      for (int64_t j = 0; j + 1 < in; ++j) s += x[i * in + j] * w[o * in + j];
      y[i * out + o] = s;
    }
  }
}

void rms_norm_forward_ignoring_weight(float* out, float* rstd, const float* x, const float*,
                                      int64_t rows, int64_t dim, float eps) {
  const std::vector<float> ones(static_cast<size_t>(dim), 1.0f);
  rms_norm_forward(out, rstd, x, ones.data(), rows, dim, eps);
}

void swiglu_forward_writing_nan(float* out, const float* gate, const float* up, int64_t n) {
  swiglu_forward(out, gate, up, n);
  out[n / 2] = std::numeric_limits<float>::quiet_NaN();
}

// d gate and d up swapped: right in fp32, wrong in the bf16 form only.
void swiglu_backward_bf16_swapped(uint16_t* dgate, uint16_t* dup, const float* dout,
                                  const uint16_t* gate, const uint16_t* up, int64_t n) {
  swiglu_backward_bf16(dup, dgate, dout, gate, up, n);
}

void linear_forward_throwing(float*, const float*, const float*, int64_t, int64_t, int64_t) {
  fail("this kernel needs rows in multiples of 64");
}

const KernelCheck* failing(const KernelReport& r) {
  for (const KernelCheck& c : r.checks) {
    if (!c.passed()) return &c;
  }
  return nullptr;
}

TEST(VerifyKernels, WrongKernelsFailByFormAndOutput) {
  const LinearKernel linear{linear_forward_dropping_a_term, linear_backward};
  const KernelReport dropped =
      verify_kernel({"linear_dropping_a_term", OpKind::linear, {DType::f32}, "test", linear});
  ASSERT_NE(failing(dropped), nullptr);
  EXPECT_EQ(failing(dropped)->form, "forward");
  EXPECT_EQ(failing(dropped)->output, "y");
  EXPECT_FALSE(dropped.passed());

  const KernelReport ignored =
      verify_kernel({"rms_norm_ignoring_weight",
                     OpKind::rms_norm,
                     {DType::f32},
                     "test",
                     RmsNormKernel{rms_norm_forward_ignoring_weight, rms_norm_backward}});
  ASSERT_NE(failing(ignored), nullptr);
  EXPECT_EQ(failing(ignored)->output, "out");

  const KernelReport nan =
      verify_kernel({"swiglu_nan",
                     OpKind::swiglu,
                     {DType::f32},
                     "test",
                     SwigluKernel{swiglu_forward_writing_nan, swiglu_backward}});
  ASSERT_NE(failing(nan), nullptr);
  EXPECT_EQ(failing(nan)->error, std::numeric_limits<double>::infinity());

  const KernelReport swapped =
      verify_kernel({"swiglu_bf16_swapped",
                     OpKind::swiglu,
                     {DType::f32},
                     "test",
                     SwigluKernel{swiglu_forward, swiglu_backward, swiglu_recompute_bf16,
                                  swiglu_backward_bf16_swapped}});
  ASSERT_NE(failing(swapped), nullptr);
  EXPECT_EQ(failing(swapped)->form, "backward_bf16");

  const LinearKernel throwing{linear_forward_throwing, linear_backward};
  try {
    verify_kernel({"linear_throwing", OpKind::linear, {DType::f32}, "test", throwing});
    FAIL() << "a kernel that throws on the check inputs passed";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "kernel 'linear_throwing' (linear) failed on its check inputs: this kernel needs "
              "rows in multiples of 64");
  }
}

using test::run_titan;
using test::TitanRun;

TEST(VerifyKernels, CommandChecksEveryKernelOrTheNamedOnes) {
  const test::ScratchDir dir("verify_kernels_cli");
  const TitanRun all = run_titan("verify-kernels --threads 2", dir);
  ASSERT_EQ(all.status, 0) << all.err;
  const auto& entries = kernel_registry().entries();
  const auto on_cpu = std::count_if(entries.begin(), entries.end(), [](const KernelEntry* e) {
    return e->device == DeviceKind::cpu;
  });
  const std::string summary = "verify-kernels: " + std::to_string(on_cpu) + " kernels, ";
  EXPECT_NE(all.out.find(summary), std::string::npos) << all.out;
  EXPECT_EQ(all.out.find("FAIL"), std::string::npos) << all.out;

  const TitanRun one = run_titan("verify-kernels --kernel rope --threads 2", dir);
  ASSERT_EQ(one.status, 0) << one.err;
  EXPECT_NE(one.out.find("verify-kernels: 1 kernel, 2 checks, all within tolerance"),
            std::string::npos)
      << one.out;

  const TitanRun unknown = run_titan("verify-kernels --kernel linaer", dir);
  EXPECT_EQ(unknown.status, 1);
  EXPECT_EQ(unknown.err,
            "titan verify-kernels: error: no kernel named 'linaer' (did you mean 'linear'?)\n");
}

std::string plugin(const std::string& kind) {
  return std::string(TITAN_TEST_PLUGIN_DIR) + "/libtitan_test_plugin_" + kind + ".so";
}

TEST(KernelPlugins, LoadedKernelsJoinTheRegistryAndPassTheirChecks) {
  const std::vector<std::string> names = load_kernel_plugin(plugin("good"));
  EXPECT_EQ(names, (std::vector<std::string>{"swiglu_plain", "rms_norm_from_plugin"}));
  EXPECT_EQ(load_kernel_plugin(plugin("good")), names);  // once per process
  for (const std::string& name : names) {
    const KernelEntry* entry = kernel_registry().find(name);
    ASSERT_NE(entry, nullptr) << name;
    EXPECT_TRUE(verify_kernel(*entry).passed()) << name;
  }
}

TEST(KernelPlugins, EveryBadPluginIsRefusedByName) {
  const test::ScratchDir dir("bad_plugins");
  const auto error_of = [](const std::string& path) {
    try {
      load_kernel_plugin(path);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("loaded");
  };
  EXPECT_EQ(error_of(dir / "missing.so"),
            "kernel plugin '" + (dir / "missing.so") + "': no such file");
  EXPECT_EQ(error_of(dir.path().string()),
            "kernel plugin '" + dir.path().string() + "' is a directory, not a shared library");
  test::write_text(dir / "text.so", "not a shared library\n");
  EXPECT_TRUE(error_of(dir / "text.so")
                  .starts_with("kernel plugin '" + (dir / "text.so") + "': cannot load it: "))
      << error_of(dir / "text.so");
  EXPECT_EQ(error_of(plugin("no_symbols")),
            "kernel plugin '" + plugin("no_symbols") +
                "' is not a titan kernel plugin: it exports no titan_kernel_plugin_abi (define its "
                "registration with TITAN_KERNEL_PLUGIN, titan/dispatch/plugin.h)");
  EXPECT_TRUE(error_of(plugin("other_abi"))
                  .starts_with("kernel plugin '" + plugin("other_abi") +
                               "' was built against another titan's kernel interface ("))
      << error_of(plugin("other_abi"));
  EXPECT_EQ(error_of(plugin("duplicate")),
            "kernel plugin '" + plugin("duplicate") + "': kernel 'swiglu' is registered twice");
}

// A plugin with a kernel at fault (or a throwing registration) is refused in one line naming the
// file and the kernel, and registers none of its kernels, not even the good one it added first.
TEST(KernelPlugins, EveryBadKernelIsRefusedByNameAndNoneIsRegistered) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"null_forward", "kernel 'null_forward': its swiglu implementation's forward is null"},
      {"null_backward", "kernel 'null_backward': its rms_norm implementation's backward is null"},
      {"null_loss",
       "kernel 'null_loss': its lm_head_loss implementation's forward_backward is null"},
      {"bf16_null",
       "kernel 'bf16_null': a linear kernel that declares bf16 needs forward_bf16 and "
       "backward_bf16"},
      {"empty_name", "a swiglu kernel has an empty name (description: 'nameless')"},
      {"bad_name",
       "kernel 'my kernel': a kernel name is letters, digits and '_', not starting with a digit"},
      {"wrong_kind",
       "kernel 'wrong_kind': declared kind rms_norm, but its implementation is of kind swiglu"},
      {"same_twice", "kernel 'good_before_same_twice' is registered twice"},
      {"throws", "its registration threw after adding kernel 'good_before_throws': out of coffee"},
  };
  const size_t registered = kernel_registry().entries().size();
  for (const auto& [kind, why] : cases) {
    std::string error = "loaded";
    try {
      load_kernel_plugin(plugin(kind));
    } catch (const Error& e) {
      error = e.what();
    }
    EXPECT_EQ(error, "kernel plugin '" + plugin(kind) + "': " + why) << kind;
    EXPECT_EQ(kernel_registry().find("good_before_" + kind), nullptr) << kind;
  }
  EXPECT_EQ(kernel_registry().entries().size(), registered);
  EXPECT_EQ(kernel_registry().find("my kernel"), nullptr);
  EXPECT_EQ(kernel_registry().find(""), nullptr);
}

// The same through the binary: verify-kernels and train end in that one line, exit status 1
// (a null forward crashed both before).
TEST(KernelPlugins, BadPluginsEndCommandsInOneLine) {
  const test::ScratchDir dir("plugin_bad_cli");
  const std::string why = "': kernel 'null_forward': its swiglu implementation's forward is null\n";
  const TitanRun verify =
      run_titan("verify-kernels --plugin '" + plugin("null_forward") + "'", dir);
  EXPECT_EQ(verify.status, 1);
  EXPECT_EQ(verify.err,
            "titan verify-kernels: error: kernel plugin '" + plugin("null_forward") + why);
  const std::string config = dir / "plugin.toml";
  test::write_text(config, "[experimental]\ncustom_import = \"" + plugin("null_forward") +
                               "\"\n[overrides]\n\"model.layers.*.mlp\" = \"null_forward\"\n");
  const TitanRun train = run_titan("train --training.steps=1 --threads 2 --config '" + config +
                                       "' --job.dump_folder='" + (dir / "run") + "'",
                                   dir);
  EXPECT_EQ(train.status, 1);
  EXPECT_EQ(train.err, "titan train: error: kernel plugin '" + plugin("null_forward") + why);
  EXPECT_TRUE(!std::filesystem::exists(dir / "run") || std::filesystem::is_empty(dir / "run"));
  const TitanRun thrown = run_titan("verify-kernels --plugin '" + plugin("throws") + "'", dir);
  EXPECT_EQ(thrown.status, 1);
  EXPECT_EQ(thrown.err, "titan verify-kernels: error: kernel plugin '" + plugin("throws") +
                            "': its registration threw after adding kernel 'good_before_throws': "
                            "out of coffee\n");
}

TEST(KernelPlugins, TrainingBindsAPluginKernelByOverride) {
  const test::ScratchDir dir("plugin_train");
  const std::string common =
      "train --training.steps=2 --lr_scheduler.warmup_steps=0 --training.seq_len=32 "
      "--training.local_batch_size=2 --metrics.log_freq=1 --threads 2 --job.dump_folder='" +
      (dir / "run") + "'";
  const TitanRun plain =
      run_titan(common + " --metrics.save_jsonl='" + (dir / "run/plain.jsonl") + "'", dir);
  ASSERT_EQ(plain.status, 0) << plain.err;
  const std::string config = dir / "plugin.toml";
  test::write_text(config, "[experimental]\ncustom_import = \"" + plugin("good") +
                               "\"\n[overrides]\n\"model.layers.*.mlp\" = \"swiglu_plain\"\n");
  const TitanRun bound =
      run_titan(common + " --config '" + config + "' --job.dump_folder='" + (dir / "run2") +
                    "' --metrics.save_jsonl='" + (dir / "run2/bound.jsonl") + "'",
                dir);
  ASSERT_EQ(bound.status, 0) << bound.err;
  EXPECT_NE(
      bound.out.find("kernel plugin " + plugin("good") + ": swiglu_plain, rms_norm_from_plugin"),
      std::string::npos)
      << bound.out;
  EXPECT_NE(bound.out.find("model.layers.0.mlp: swiglu -> swiglu_plain"), std::string::npos)
      << bound.out;
  // The first step's loss is the forward's before any update: the two SwiGLUs differ by their
  // exp's last bits (titan's within about 1 ulp, std::exp's within 1), a relative 2.4e-7 per
  // activation; through the rest of the forward to a mean of log-probabilities that stays within
  // a few times that, so 1e-5 of the loss is 40 times the difference expected.
  const auto first_loss = [](const std::string& jsonl) {
    std::ifstream in(jsonl);
    std::string line;
    std::getline(in, line);
    return nlohmann::json::parse(line).at("loss").get<double>();
  };
  const double plain_loss = first_loss(dir / "run/plain.jsonl");
  EXPECT_NEAR(first_loss(dir / "run2/bound.jsonl"), plain_loss, 1e-5 * plain_loss);

  test::write_text(config, "[experimental]\ncustom_import = \"" + (dir / "nope.so") + "\"\n");
  const TitanRun missing = run_titan(common + " --config '" + config + "'", dir);
  EXPECT_EQ(missing.status, 1);
  EXPECT_EQ(missing.err,
            "titan train: error: kernel plugin '" + (dir / "nope.so") + "': no such file\n");
}

TEST(KernelPlugins, VerifyKernelsLoadsAPlugin) {
  const test::ScratchDir dir("plugin_verify");
  const TitanRun r = run_titan(
      "verify-kernels --plugin '" + plugin("good") + "' --kernel swiglu_plain --threads 2", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("verify-kernels: 1 kernel, 3 checks, all within tolerance"),
            std::string::npos)
      << r.out;
}

}  // namespace
}  // namespace titan
