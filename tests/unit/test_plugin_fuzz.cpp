// Fuzzing kernel registration (dispatch/registry.h, dispatch/plugin.h): random entries -- names
// empty, non-identifiers, with control bytes, taken or long; a declared kind that is not the
// implementation's; null forwards, backwards and bf16 forms; dtypes none, duplicated or beyond
// f32/bf16 -- added to a registry, and random tables of them registered by a plugin whose
// registration may throw. Nothing crashes; an entry is accepted exactly when it is valid (an
// oracle written from the rules); a refusal is one line without control bytes, naming the
// plugin file when it came through one; a refused plugin registers none of its table.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_fuzz_util.h"
#include "titan/core/error.h"
#include "titan/dispatch/plugin.h"
#include "titan/dispatch/registry.h"
#include "titan/ops/attention.h"
#include "titan/ops/cross_entropy.h"
#include "titan/ops/embedding.h"
#include "titan/ops/linear.h"
#include "titan/ops/moe.h"
#include "titan/ops/rms_norm.h"
#include "titan/ops/rope.h"
#include "titan/ops/swiglu.h"

namespace titan {
namespace {

// The table the TABLE plugin registers (through titan_test_plugin_table below), and where its
// registration throws (-1: nowhere; table.size(): after its last add).
std::vector<KernelEntry> g_table;
int g_throw_at = -1;

}  // namespace
}  // namespace titan

extern "C" __attribute__((visibility("default"))) void titan_test_plugin_table(
    titan::KernelPluginRegistrar& registrar) {
  for (size_t i = 0; i < titan::g_table.size(); ++i) {
    if (static_cast<int>(i) == titan::g_throw_at) throw std::runtime_error("the table threw");
    registrar.add(titan::g_table[i]);
  }
  if (titan::g_throw_at == static_cast<int>(titan::g_table.size())) {
    throw std::runtime_error("the table threw at its end");
  }
}

namespace titan {
namespace {

struct Case {
  KernelEntry entry;
  // What the oracle says of it, apart from the name being taken (which depends on the registry).
  bool valid_but_name = false;
};

bool is_identifier(const std::string& name) {
  if (name.empty() || (name[0] >= '0' && name[0] <= '9')) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

class Generator {
 public:
  explicit Generator(uint64_t seed) : rng_(seed) {}

  Case next(int64_t serial) {
    Case c;
    KernelEntry& e = c.entry;
    e.name = name(serial);
    e.kind = static_cast<OpKind>(pick(8));
    e.description = chance(0.1) ? std::string("d\n\x01\xff") : "fuzzed";
    const int dtypes = static_cast<int>(pick(4));
    for (int i = 0; i < dtypes; ++i) {
      const DType all[] = {DType::f32, DType::bf16, DType::f16, DType::i32};
      e.dtypes.push_back(all[pick(chance(0.8) ? 2 : 4)]);
    }
    const bool takes_bf16 = std::count(e.dtypes.begin(), e.dtypes.end(), DType::bf16) > 0;
    const bool fwd = !chance(0.15), bwd = !chance(0.15);
    bool forms_ok = true;  // the bf16 forms the kind needs for the dtypes
    const size_t impl = chance(0.8) ? static_cast<size_t>(e.kind) : pick(8);
    switch (impl) {
      case 0:
        e.impl = EmbeddingKernel{fwd ? embedding_forward : nullptr,
                                 bwd ? embedding_backward : nullptr, nullptr};
        break;
      case 1:
        e.impl = RmsNormKernel{fwd ? rms_norm_forward_reference : nullptr,
                               bwd ? rms_norm_backward_reference : nullptr};
        break;
      case 2: {
        const bool f16 = chance(0.5), b16 = chance(0.5);
        e.impl = LinearKernel{fwd ? linear_forward_reference : nullptr,
                              bwd ? linear_backward_reference : nullptr,
                              f16 ? linear_forward_bf16_reference : nullptr,
                              b16 ? linear_backward_bf16_reference : nullptr};
        forms_ok = takes_bf16 == (f16 && b16);
        break;
      }
      case 3:
        e.impl = RopeKernel{fwd ? rope_forward : nullptr, bwd ? rope_backward : nullptr};
        break;
      case 4:
        e.impl = AttentionKernel{fwd ? attention_forward_reference : nullptr,
                                 bwd ? attention_backward_reference : nullptr,
                                 {}};
        break;
      case 5:
        e.impl = SwigluKernel{fwd ? swiglu_forward_reference : nullptr,
                              bwd ? swiglu_backward_reference : nullptr};
        break;
      case 6:
        e.impl = LmHeadLossKernel{fwd ? lm_head_cross_entropy_reference : nullptr};
        break;
      default: {
        const bool f16 = chance(0.5), b16 = chance(0.5);
        e.impl = ExpertsKernel{fwd ? experts_forward_reference : nullptr,
                               bwd ? experts_backward_reference : nullptr,
                               {},
                               f16 ? experts_forward_bf16_reference : nullptr,
                               b16 ? experts_backward_bf16_reference : nullptr};
        forms_ok = takes_bf16 == (f16 && b16);
        break;
      }
    }
    const bool dtypes_ok = !e.dtypes.empty() &&
                           std::all_of(e.dtypes.begin(), e.dtypes.end(),
                                       [](DType t) { return t == DType::f32 || t == DType::bf16; });
    const bool functions_ok = fwd && (impl == 6 || bwd);
    c.valid_but_name = is_identifier(e.name) && impl == static_cast<size_t>(e.kind) && dtypes_ok &&
                       functions_ok && forms_ok;
    return c;
  }

 private:
  size_t pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }
  bool chance(double p) { return std::bernoulli_distribution(p)(rng_); }

  std::string name(int64_t serial) {
    switch (pick(10)) {
      case 0:
        return "";
      case 1:
        return "linear";  // a built-in's
      case 2:
        return "fz " + std::to_string(serial);
      case 3:
        return "fz\n" + std::to_string(serial) + "\x01\xff";
      case 4:
        return std::to_string(serial) + "fz";
      case 5:
        return std::string(200, 'x') + std::to_string(serial);
      case 6:
        return "fz_" + std::to_string(pick(40));  // repeats: taken by an earlier one
      default:
        return "fz_" + std::to_string(serial) + "_" + std::to_string(pick(1000));
    }
  }

  std::mt19937_64 rng_;
};

// One line, no control byte, and it names what it is about.
void expect_one_clean_line(const std::string& message, const std::string& context) {
  EXPECT_FALSE(message.empty()) << context;
  EXPECT_TRUE(std::none_of(message.begin(), message.end(),
                           [](char c) { return static_cast<unsigned char>(c) < 0x20; }))
      << context << ": " << message;
  EXPECT_NE(message.find("kernel"), std::string::npos) << context << ": " << message;
}

TEST(PluginFuzz, RandomEntriesAreAcceptedExactlyWhenValid) {
  const test::FuzzBudget budget = test::fuzz_budget();
  Generator gen(budget.seed);
  KernelRegistry registry;  // a fresh one: only what this test adds
  std::set<std::string> taken;
  int64_t accepted = 0, refused = 0;
  const int64_t runs = test::run_fuzz(budget, [&](int64_t i) {
    const Case c = gen.next(i);
    const bool valid = c.valid_but_name && taken.count(c.entry.name) == 0;
    std::string error;
    try {
      registry.add(c.entry);
    } catch (const Error& e) {
      error = e.what();
    }
    const std::string context =
        "iteration " + std::to_string(i) + " (seed " + std::to_string(budget.seed) + ")";
    if (valid) {
      EXPECT_EQ(error, "") << context;
      if (error.empty()) {
        taken.insert(c.entry.name);
        ++accepted;
      }
    } else {
      EXPECT_NE(error, "") << context << ": accepted an invalid entry";
      if (!error.empty()) expect_one_clean_line(error, context);
      ++refused;
    }
  });
  EXPECT_GT(accepted, 10) << runs << " runs";
  EXPECT_GT(refused, 10) << runs << " runs";
  EXPECT_EQ(static_cast<int64_t>(registry.entries().size()), accepted);
}

TEST(PluginFuzz, RandomTablesRegisterWholeOrNotAtAll) {
  const test::FuzzBudget budget = test::fuzz_budget();
  Generator gen(budget.seed + 1);
  std::mt19937_64 rng(budget.seed + 2);
  const std::string plugin = std::string(TITAN_TEST_PLUGIN_DIR) + "/libtitan_test_plugin_table.so";
  const std::filesystem::path copies =
      std::filesystem::temp_directory_path() / ("titan_plugin_fuzz_" + std::to_string(::getpid()));
  std::filesystem::create_directories(copies);
  int64_t loaded = 0, refused = 0, serial = 0;
  test::FuzzBudget capped = budget;
  capped.max_iterations = std::min<int64_t>(budget.max_iterations, 3000);
  test::run_fuzz(capped, [&](int64_t i) {
    g_table.clear();
    const size_t n = 1 + std::uniform_int_distribution<size_t>(0, 3)(rng);
    bool valid = true;
    std::set<std::string> names;
    for (size_t k = 0; k < n; ++k) {
      Case c = gen.next(serial++);
      // Mostly valid tables, so that loads succeed too.
      if (std::bernoulli_distribution(0.6)(rng)) {
        c.entry.name = "tab_" + std::to_string(serial);
        c.entry.kind = OpKind::swiglu;
        c.entry.dtypes = {DType::f32};
        c.entry.impl = SwigluKernel{swiglu_forward_reference, swiglu_backward_reference};
        c.valid_but_name = true;
      }
      valid = valid && c.valid_but_name && names.insert(c.entry.name).second &&
              kernel_registry().find(c.entry.name) == nullptr;
      g_table.push_back(c.entry);
    }
    g_throw_at = std::bernoulli_distribution(0.1)(rng)
                     ? static_cast<int>(std::uniform_int_distribution<size_t>(0, n)(rng))
                     : -1;
    // A valid table that throws partway is refused as well.
    valid = valid && g_throw_at == -1;
    // A loaded plugin file is loaded once per process: each load that may succeed gets a copy.
    std::string path = plugin;
    if (valid) {
      path = (copies / ("table-" + std::to_string(i) + ".so")).string();
      std::filesystem::copy_file(plugin, path);
    }
    const size_t before = kernel_registry().entries().size();
    std::string error;
    std::vector<std::string> got;
    try {
      got = load_kernel_plugin(path);
    } catch (const Error& e) {
      error = e.what();
    }
    const std::string context =
        "table " + std::to_string(i) + " (seed " + std::to_string(budget.seed) + ")";
    if (valid) {
      EXPECT_EQ(error, "") << context;
      EXPECT_EQ(got.size(), n) << context;
      EXPECT_EQ(kernel_registry().entries().size(), before + n) << context;
      ++loaded;
    } else {
      EXPECT_TRUE(error.starts_with("kernel plugin '" + path + "': ")) << context << ": " << error;
      expect_one_clean_line(error, context);
      EXPECT_EQ(kernel_registry().entries().size(), before) << context << ": " << error;
      ++refused;
    }
  });
  std::filesystem::remove_all(copies);
  EXPECT_GT(loaded, 5);
  EXPECT_GT(refused, 5);
}

}  // namespace
}  // namespace titan
