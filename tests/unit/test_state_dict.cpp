// The state-dict adapter (HF keys <-> titan parameters, stacked MoE experts <-> per-expert keys)
// and model-level loading: every bad checkpoint ends in a one-line error naming the file, the
// tensor and the fault, before any parameter is written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "titan/io/byte_size.h"
#include "titan/io/json_util.h"
#include "titan/io/safetensors.h"
#include "titan/io/safetensors_writer.h"
#include "titan/models/decoder_lm.h"
#include "titan/models/hf_checkpoint.h"
#include "titan/models/hf_config.h"
#include "titan/models/hf_export.h"
#include "titan/models/qwen3/flavors.h"
#include "titan/models/registry.h"
#include "titan/models/state_dict_adapter.h"
#include "unit/test_safetensors_util.h"
#include "unit/tiny_models.h"

namespace titan {
namespace {

using test::expect_error;
using test::ScratchDir;
using test::tiny_dense;
using test::tiny_moe;

// Export options for the tests (a brace list would have to spell out every member).
HfExportOptions opts(DType dtype, uint64_t max_shard_bytes = 5'000'000'000,
                     bool overwrite = false) {
  HfExportOptions o;
  o.dtype = dtype;
  o.max_shard_bytes = max_shard_bytes;
  o.overwrite = overwrite;
  return o;
}

HfConvertOptions conv(DType dtype, uint64_t max_shard_bytes = 5'000'000'000) {
  HfConvertOptions o;
  o.dtype = dtype;
  o.max_shard_bytes = max_shard_bytes;
  return o;
}

// Distinct, exactly representable values in every parameter, so a mixed-up key shows.
void fill_distinct(std::vector<ParamGroup>& groups) {
  float next = 0;
  for (ParamGroup& g : groups) {
    for (const ParamView& v : g.views()) {
      for (int64_t i = 0; i < v.numel; ++i) {
        g.params()[v.offset + i] = static_cast<float>(static_cast<int>(next++) % 509 - 254) / 64;
      }
    }
  }
}

bool same_params(const std::vector<ParamGroup>& a, const std::vector<ParamGroup>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].numel() != b[i].numel() ||
        std::memcmp(a[i].params(), b[i].params(), a[i].numel() * sizeof(float)) != 0) {
      return false;
    }
  }
  return true;
}

// The checkpoint in `dir` rewritten through `edit`, as owned copies (the files are replaced), as
// another tool would: its titan.json goes too (its checksums would refuse the edit first).
void rewrite_checkpoint(const std::string& dir,
                        const std::function<void(std::vector<SafetensorsTensor>&)>& edit) {
  std::vector<SafetensorsTensor> tensors;
  {
    const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(dir);
    for (const std::string& name : ckpt.names()) {
      const SafetensorsEntry& e = ckpt.at(name);
      Tensor t = Tensor::empty(e.shape, *e.dtype, MemCategory::other);
      std::memcpy(t.raw(), e.data, e.nbytes);
      tensors.push_back({name, std::move(t)});
    }
  }
  edit(tensors);
  std::filesystem::remove(std::filesystem::path(dir) / "titan.json");
  write_safetensors_checkpoint(dir, tensors, {});
}

SafetensorsTensor* find_tensor(std::vector<SafetensorsTensor>& tensors, const std::string& name) {
  for (SafetensorsTensor& t : tensors) {
    if (t.name == name) return &t;
  }
  ADD_FAILURE() << "no tensor " << name;
  return nullptr;
}

TEST(StateDictAdapter, DenseSpecsAreTheModelsParameters) {
  for (bool tied : {true, false}) {
    const ModelArgs args = tiny_dense(tied);
    const DecoderLM model(args);
    const std::vector<ParamGroupSpec> specs = model_param_specs(args);
    ASSERT_EQ(specs.size(), model.param_groups().size());
    for (size_t g = 0; g < specs.size(); ++g) {
      const ParamGroup& group = model.param_groups()[g];
      EXPECT_EQ(specs[g].name, group.name());
      ASSERT_EQ(specs[g].params.size(), group.views().size());
      for (size_t p = 0; p < specs[g].params.size(); ++p) {
        EXPECT_EQ(specs[g].params[p].name, group.views()[p].spec.name);
        EXPECT_EQ(specs[g].params[p].shape, group.views()[p].spec.shape);
        EXPECT_EQ(specs[g].params[p].init, group.views()[p].spec.init);
      }
    }
  }
}

TEST(StateDictAdapter, HeadGroupIndexIsTheGroupHoldingNormAndLmHead) {
  for (bool tied : {true, false}) {
    const ModelArgs args = tiny_dense(tied);
    const std::vector<ParamGroupSpec> specs = model_param_specs(args);
    const int64_t head = head_group_index(args);
    for (size_t g = 0; g < specs.size(); ++g) {
      bool norm = false, lm_head = false;
      for (const ParamSpec& p : specs[g].params) {
        norm = norm || p.name == "model.norm.weight";
        lm_head = lm_head || p.name == "lm_head.weight";
      }
      EXPECT_EQ(norm, static_cast<int64_t>(g) == head) << "tied " << tied << ", group " << g;
      EXPECT_EQ(lm_head, !tied && static_cast<int64_t>(g) == head)
          << "tied " << tied << ", group " << g;
    }
  }
}

TEST(StateDictAdapter, DenseKeysAreTheParameterNames) {
  for (bool tied : {true, false}) {
    const ModelArgs args = tiny_dense(tied);
    const std::vector<HfKey> keys = hf_keys(args);
    EXPECT_EQ(keys.size(), 11u * 2 + 2 + (tied ? 0 : 1));  // spec §3: 11 L + 2 (+1 untied)
    std::set<std::string> names;
    for (const HfKey& k : keys) {
      EXPECT_EQ(k.key, k.param);
      EXPECT_EQ(k.offset, 0);
      names.insert(k.key);
    }
    EXPECT_EQ(names.count("lm_head.weight"), tied ? 0u : 1u);
    EXPECT_EQ(names.count("model.layers.1.self_attn.q_norm.weight"), 1u);
    EXPECT_EQ(names.count("model.embed_tokens.weight"), 1u);
  }
  // Spec §3's counts: Qwen3-4B (tied) 398 keys, Qwen3-8B (untied) 399.
  EXPECT_EQ(hf_keys(flavor("4B")).size(), 398u);
  EXPECT_EQ(hf_keys(flavor("8B")).size(), 399u);
}

TEST(StateDictAdapter, StackedExpertsSplitIntoPerExpertKeys) {
  const ModelArgs args = tiny_moe();
  const int64_t E = 4, Im = 16, h = 32;
  std::map<std::string, HfKey> keys;
  for (const HfKey& k : hf_keys(args)) keys.emplace(k.key, k);
  // Layer 0: (9 + 3E) keys; layer 1 (dense): 11; embed, norm, lm_head.
  EXPECT_EQ(keys.size(), static_cast<size_t>(9 + 3 * E + 11 + 3));
  for (int64_t e = 0; e < E; ++e) {
    const std::string p = "model.layers.0.mlp.experts." + std::to_string(e);
    const HfKey& gate = keys.at(p + ".gate_proj.weight");
    EXPECT_EQ(gate.param, "model.layers.0.mlp.experts.gate_proj");
    EXPECT_EQ(gate.shape, (Shape{Im, h}));
    EXPECT_EQ(gate.offset, e * Im * h);
    EXPECT_EQ(keys.at(p + ".up_proj.weight").param, "model.layers.0.mlp.experts.up_proj");
    const HfKey& down = keys.at(p + ".down_proj.weight");
    EXPECT_EQ(down.param, "model.layers.0.mlp.experts.down_proj");
    EXPECT_EQ(down.shape, (Shape{h, Im}));
    EXPECT_EQ(down.offset, e * h * Im);
  }
  EXPECT_EQ(keys.at("model.layers.0.mlp.gate.weight").shape, (Shape{E, h}));
  EXPECT_EQ(keys.count("model.layers.0.mlp.gate_proj.weight"), 0u);
  EXPECT_EQ(keys.at("model.layers.1.mlp.gate_proj.weight").shape, (Shape{48, h}));
  EXPECT_EQ(keys.count("model.layers.1.mlp.gate.weight"), 0u);

  // The in-memory layout: router (E, h), experts stacked (E, Im, h) / (E, h, Im).
  const std::vector<ParamGroupSpec> specs = model_param_specs(args);
  std::map<std::string, Shape> shapes;
  for (const ParamSpec& p : specs[1].params) shapes[p.name] = p.shape;
  EXPECT_EQ(shapes.at("model.layers.0.mlp.experts.gate_proj"), (Shape{E, Im, h}));
  EXPECT_EQ(shapes.at("model.layers.0.mlp.experts.up_proj"), (Shape{E, Im, h}));
  EXPECT_EQ(shapes.at("model.layers.0.mlp.experts.down_proj"), (Shape{E, h, Im}));

  // Spec §3: Qwen3-30B-A3B has (9 + 3E) L + 3 = 18,867 keys.
  EXPECT_EQ(hf_keys(flavor("30B-A3B")).size(), 18867u);
}

TEST(StateDictAdapter, StateDictViewsAliasTheParameters) {
  const ModelArgs args = tiny_moe();
  std::vector<ParamGroup> groups = make_param_groups(args);
  fill_distinct(groups);
  const std::vector<SafetensorsTensor> sd = hf_state_dict(args, groups);
  ASSERT_EQ(sd.size(), hf_keys(args).size());
  const ParamGroup& layer0 = groups[1];
  const ParamView& up = layer0.view("model.layers.0.mlp.experts.up_proj");
  for (const SafetensorsTensor& t : sd) {
    if (t.name == "model.layers.0.mlp.experts.2.up_proj.weight") {
      EXPECT_EQ(t.tensor.data<float>(), layer0.params() + up.offset + 2 * 16 * 32);
      EXPECT_EQ(t.tensor.shape(), (Shape{16, 32}));
    }
  }
}

TEST(HfFolder, ExportThenLoadIsExactInFp32AndRoundsInBf16) {
  ScratchDir dir;
  for (const ModelArgs& args : {tiny_dense(true), tiny_dense(false), tiny_moe()}) {
    std::vector<ParamGroup> groups = make_param_groups(args);
    fill_distinct(groups);
    const std::string name = args.is_moe() ? "moe" : args.tie_word_embeddings ? "tied" : "untied";
    export_hf_folder(dir / (name + "_f32"), args, groups, opts(DType::f32));
    std::vector<ParamGroup> loaded = make_param_groups(args);
    load_hf_weights(args, loaded, dir / (name + "_f32"), "test");
    EXPECT_TRUE(same_params(groups, loaded)) << name;
    EXPECT_EQ(read_hf_config(dir / (name + "_f32")).architecture, args.architecture);

    // Values in [-4, 4) with 1/64 steps have 8 significant bits: bf16 keeps them exactly, and
    // one value more (a 9th bit) must round to nearest even.
    groups[0].params()[0] = 1.0f + 1.0f / 256;  // halfway between two bf16 values: to 1.0
    export_hf_folder(dir / (name + "_bf16"), args, groups, opts(DType::bf16));
    load_hf_weights(args, loaded, dir / (name + "_bf16"), "test");
    EXPECT_EQ(loaded[0].params()[0], 1.0f);
    groups[0].params()[0] = 1.0f;
    EXPECT_TRUE(same_params(groups, loaded)) << name;
    const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(dir / (name + "_bf16"));
    for (const std::string& key : ckpt.names()) EXPECT_EQ(ckpt.at(key).dtype, DType::bf16);
    EXPECT_EQ(ckpt.find("lm_head.weight") != nullptr, !args.tie_word_embeddings) << name;
  }
}

TEST(HfFolder, ModelExportLoadsIntoANewModelWithTheSameLogits) {
  ScratchDir dir;
  DecoderLM model(tiny_dense(true));
  model.initialize(7);
  export_hf_folder(dir / "out", model, opts(DType::f32));
  const std::unique_ptr<CausalLM> again = load_hf_model(dir / "out");
  const std::vector<int32_t> ids = {3, 14, 15, 92, 65, 35, 89, 79};
  std::vector<float> a(ids.size() * 97), b(ids.size() * 97);
  model.forward(ids.data(), nullptr, 1, static_cast<int64_t>(ids.size()), {.logits = a.data()});
  again->forward(ids.data(), nullptr, 1, static_cast<int64_t>(ids.size()), {.logits = b.data()});
  EXPECT_EQ(a, b);
}

TEST(HfFolder, FolderHasConfigGenerationConfigAndTheSourcesTokenizerFiles) {
  ScratchDir dir;
  const ModelArgs args = tiny_dense(true);
  std::vector<ParamGroup> groups = make_param_groups(args);
  initialize_param_groups(groups, args, 1);
  export_hf_folder(dir / "plain", args, groups, {});
  EXPECT_TRUE(std::filesystem::exists(dir / "plain/config.json"));
  EXPECT_EQ(read_hf_generation_config(dir / "plain/generation_config.json").eos_token_ids,
            std::vector<int64_t>{2});
  EXPECT_FALSE(std::filesystem::exists(dir / "plain/tokenizer.json"));

  // A source folder's tokenizer files and generation config come along byte for byte.
  test::write_bytes(dir / "plain/tokenizer.json", {'{', '}'});
  test::write_bytes(dir / "plain/chat_template.jinja", {'x'});
  GenerationConfig g = default_generation_config(args);
  g.do_sample = true;
  g.temperature = 0.6;
  write_hf_generation_config(dir / "plain/generation_config.json", g);
  HfExportOptions source;
  source.source_dir = dir / "plain";
  export_hf_folder(dir / "copy", args, groups, source);
  EXPECT_EQ(test::read_bytes(dir / "copy/tokenizer.json"),
            test::read_bytes(dir / "plain/tokenizer.json"));
  EXPECT_EQ(test::read_bytes(dir / "copy/chat_template.jinja"), std::vector<unsigned char>{'x'});
  EXPECT_EQ(read_hf_generation_config(dir / "copy/generation_config.json").temperature, 0.6);
  EXPECT_FALSE(std::filesystem::exists(dir / "copy/tokenizer_config.json"));
}

TEST(HfFolder, ShardsBySizeAndLoadsBackFromTheIndex) {
  ScratchDir dir;
  const ModelArgs args = tiny_moe();
  std::vector<ParamGroup> groups = make_param_groups(args);
  fill_distinct(groups);
  export_hf_folder(dir / "out", args, groups, opts(DType::f32, 16000));
  EXPECT_TRUE(std::filesystem::exists(dir / "out/model.safetensors.index.json"));
  EXPECT_FALSE(std::filesystem::exists(dir / "out/model.safetensors"));
  EXPECT_GT(SafetensorsCheckpoint::open(dir / "out").files().size(), 3u);
  std::vector<ParamGroup> loaded = make_param_groups(args);
  load_hf_weights(args, loaded, dir / "out", "test");
  EXPECT_TRUE(same_params(groups, loaded));
}

// An export from shards (train/trainer.cpp): before each run (hf_export_runs) its parameters are
// brought whole and the run before is handed back. Here the run's values are copied in and the
// previous run's overwritten with NaN, so a tensor read outside its run would change the bytes:
// the folder equals the plain export's, file by file, single-file and sharded, dense, tied and MoE.
TEST(HfFolder, AnExportARunAtATimeWritesThePlainExportsBytes) {
  ScratchDir dir;
  for (const ModelArgs& args : {tiny_dense(false), tiny_dense(true), tiny_moe()}) {
    for (const uint64_t shard_bytes : {uint64_t{5'000'000'000}, uint64_t{16000}}) {
      const std::string name = std::string(args.is_moe() ? "moe" : "dense") +
                               (args.tie_word_embeddings ? "_tied_" : "_") +
                               std::to_string(shard_bytes);
      std::vector<ParamGroup> groups = make_param_groups(args);
      fill_distinct(groups);
      const HfExportOptions options = opts(DType::bf16, shard_bytes);
      export_hf_folder(dir / (name + "_plain"), args, groups, options);
      std::vector<ParamGroup> held = make_param_groups(args);
      for (ParamGroup& g : held) std::fill(g.params(), g.params() + g.numel(), NAN);
      const std::vector<ExportRun> want = hf_export_runs(args, options);
      std::vector<ExportRun> seen;
      const auto fill = [&](const ExportRun& run, bool whole) {
        for (const std::string& p : run.params) {
          const ParamView& v = held[run.group].view(p);
          float* to = held[run.group].params() + v.offset;
          if (whole) {
            std::copy_n(groups[run.group].params() + groups[run.group].view(p).offset, v.numel, to);
          } else {
            std::fill(to, to + v.numel, NAN);
          }
        }
      };
      export_hf_folder(dir / (name + "_runs"), args, held, options, [&](const ExportRun& run) {
        if (!seen.empty()) fill(seen.back(), false);
        fill(run, true);
        seen.push_back(run);
      });
      ASSERT_EQ(seen.size(), want.size()) << name;
      std::set<std::pair<size_t, std::string>> covered;
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(seen[i].group, want[i].group) << name << " run " << i;
        EXPECT_EQ(seen[i].params, want[i].params) << name << " run " << i;
        for (const std::string& p : want[i].params) covered.insert({want[i].group, p});
      }
      size_t params = 0;
      for (const ParamGroup& g : groups) params += g.views().size();
      EXPECT_EQ(covered.size(), params) << name;  // every parameter in some run
      // Fewer runs than tensors: a unit's tensors are read together (the head unit in two runs,
      // lm_head first and the norm last; a unit split by a shard boundary in two).
      EXPECT_LT(want.size(), hf_keys(args).size()) << name;
      for (const auto& entry : std::filesystem::directory_iterator(dir / (name + "_plain"))) {
        const std::string file = entry.path().filename().string();
        EXPECT_EQ(test::read_bytes(entry.path().string()),
                  test::read_bytes(dir / (name + "_runs/" + file)))
            << name << " " << file;
      }
    }
  }
}

TEST(HfFolder, ExportIsAtomicAndNeverClobbersAnotherFolder) {
  ScratchDir dir;
  const ModelArgs args = tiny_dense(false);
  std::vector<ParamGroup> groups = make_param_groups(args);
  fill_distinct(groups);
  std::filesystem::create_directories(dir / "busy");
  test::write_bytes(dir / "busy/notes.txt", {'h', 'i'});
  expect_error(
      [&] { export_hf_folder(dir / "busy", args, groups, opts(DType::bf16, 5'000'000'000, true)); },
      {"busy", "already exists and is not an empty folder"});
  EXPECT_EQ(test::read_bytes(dir / "busy/notes.txt"), (std::vector<unsigned char>{'h', 'i'}));

  // An empty folder is filled; a model folder is replaced only when overwriting is asked for.
  std::filesystem::create_directories(dir / "empty");
  export_hf_folder(dir / "empty", args, groups, opts(DType::f32));
  EXPECT_TRUE(std::filesystem::exists(dir / "empty/model.safetensors"));
  expect_error([&] { export_hf_folder(dir / "empty", args, groups, {}); },
               {"empty", "already exists"});
  EXPECT_EQ(SafetensorsCheckpoint::open(dir / "empty").at("model.norm.weight").dtype, DType::f32);
  export_hf_folder(dir / "empty", args, groups, opts(DType::bf16, 5'000'000'000, true));
  EXPECT_EQ(SafetensorsCheckpoint::open(dir / "empty").at("model.norm.weight").dtype, DType::bf16);

  // A failing export (bad dtype) leaves nothing behind: no destination, no staging folder.
  expect_error([&] { export_hf_folder(dir / "never", args, groups, opts(DType::i32)); },
               {"never", "I32"});
  std::set<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    left.insert(entry.path().filename().string());
  }
  EXPECT_EQ(left, (std::set<std::string>{"busy", "empty"}));
}

TEST(HfFolder, ExportRefusesTensorsThatAreNotTheModelsStateDict) {
  ScratchDir dir;
  const ModelArgs args = tiny_dense(true);
  std::vector<ParamGroup> groups = make_param_groups(args);
  std::vector<SafetensorsTensor> sd = hf_state_dict(args, groups);
  sd.pop_back();
  expect_error([&] { export_hf_folder(dir / "x", args, sd, {}); }, {"tensors given"});
  EXPECT_FALSE(std::filesystem::exists(dir / "x"));
}

class HfFolderBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    args_ = tiny_dense(false);
    groups_ = make_param_groups(args_);
    fill_distinct(groups_);
    folder_ = dir_ / "model";
    export_hf_folder(folder_, args_, groups_, opts(DType::bf16));
    model_ = make_model(args_);
    model_->initialize(3);
    before_ = make_param_groups(args_);
    for (size_t g = 0; g < before_.size(); ++g) {
      std::memcpy(before_[g].params(), model_->param_groups()[g].params(),
                  before_[g].numel() * sizeof(float));
    }
  }
  // The load fails with a message holding `parts`, and the model is untouched.
  void expect_load_error(std::initializer_list<std::string> parts) {
    expect_error([&] { load_hf_weights(*model_, folder_); }, parts);
    EXPECT_TRUE(same_params(before_, model_->param_groups())) << "the failed load wrote weights";
  }

  ScratchDir dir_;
  ModelArgs args_;
  std::vector<ParamGroup> groups_, before_;
  std::string folder_;
  std::unique_ptr<CausalLM> model_;
};

TEST_F(HfFolderBadInput, TheGoodFolderLoads) {
  load_hf_weights(*model_, folder_);
  EXPECT_TRUE(same_params(groups_, model_->param_groups()));
}

TEST_F(HfFolderBadInput, ShapeThatDisagreesWithTheConfig) {
  // The last tensor in load order is wrong: nothing before it may have been written.
  rewrite_checkpoint(folder_, [](std::vector<SafetensorsTensor>& t) {
    find_tensor(t, "model.layers.1.mlp.down_proj.weight")->tensor =
        Tensor::zeros({32, 40}, DType::bf16, MemCategory::other);
  });
  expect_load_error({"model.safetensors", "\"model.layers.1.mlp.down_proj.weight\"",
                     "has shape [32, 40]", "implies [32, 48]"});
  // And through config.json, which is then named as the source of the dims.
  expect_error([&] { load_hf_model(folder_); },
               {"model.layers.1.mlp.down_proj.weight", "config.json implies [32, 48]"});
}

TEST_F(HfFolderBadInput, MissingTensor) {
  rewrite_checkpoint(folder_, [](std::vector<SafetensorsTensor>& t) {
    t.erase(t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2));
    t.erase(std::find_if(t.begin(), t.end(), [](const SafetensorsTensor& x) {
      return x.name == "model.embed_tokens.weight";
    }));
  });
  // The first missing in the model's order (Hugging Face's) is named.
  expect_load_error(
      {"model.safetensors", "\"model.embed_tokens.weight\" is missing", "(and 1 more)"});
}

TEST_F(HfFolderBadInput, UnexpectedTensor) {
  rewrite_checkpoint(folder_, [](std::vector<SafetensorsTensor>& t) {
    t.push_back({"model.layers.2.input_layernorm.weight",
                 Tensor::zeros({32}, DType::bf16, MemCategory::other)});
  });
  expect_load_error(
      {"model.safetensors", "unexpected tensor \"model.layers.2.input_layernorm.weight\""});
}

TEST_F(HfFolderBadInput, NonFloatDtype) {
  rewrite_checkpoint(folder_, [](std::vector<SafetensorsTensor>& t) {
    find_tensor(t, "model.norm.weight")->tensor =
        Tensor::zeros({32}, DType::i32, MemCategory::other);
  });
  expect_load_error({"model.safetensors", "\"model.norm.weight\"", "dtype I32"});
}

TEST_F(HfFolderBadInput, ConfigOfAnotherModel) {
  ModelArgs moe = tiny_moe();
  moe.mlp_only_layers = {};
  std::vector<ParamGroup> groups = make_param_groups(moe);
  expect_error([&] { load_hf_weights(moe, groups, folder_, "config.json"); },
               {"model.safetensors", "unexpected tensor \"model.layers.0.mlp.down_proj.weight\"",
                "Qwen3MoeForCausalLM"});
  ModelArgs deeper = args_;
  deeper.num_hidden_layers = 3;
  write_hf_config(folder_ + "/config.json", deeper, DType::bf16);
  expect_error([&] { load_hf_model(folder_); },
               {"model.safetensors", "\"model.layers.2.", "is missing (and 10 more)",
                "config.json expects 36 tensors"});
}

// An HF export carries its files' checksums (titan.json, io/atomic_dir.h): a shard whose data was
// damaged after the export -- finite bytes no header check or NaN scan sees -- is refused at load,
// naming the file; the same folder loads once its marker is gone (a folder of another tool).
TEST(HfFolderChecksums, ADamagedShardOfTitansExportIsRefusedNamingIt) {
  ScratchDir dir;
  const ModelArgs args = tiny_moe();
  std::vector<ParamGroup> groups = make_param_groups(args);
  fill_distinct(groups);
  export_hf_folder(dir / "out", args, groups, opts(DType::f32, 16000));  // several shards
  std::string damaged;
  for (const auto& entry : std::filesystem::directory_iterator(dir / "out")) {
    if (entry.path().filename().string().starts_with("model-00002-of-")) {
      damaged = entry.path().string();
    }
  }
  ASSERT_FALSE(damaged.empty());
  {
    std::fstream f(damaged, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(std::filesystem::file_size(damaged) - 4));
    const float finite = 1.5f;
    f.write(reinterpret_cast<const char*>(&finite), sizeof(finite));
  }
  std::vector<ParamGroup> loaded = make_param_groups(args);
  expect_error([&] { load_hf_weights(args, loaded, dir / "out", "test"); },
               {damaged + ": checksum mismatch (crc32c:", ", titan.json records crc32c:",
                "changed or damaged after titan wrote it"});
  std::filesystem::remove(dir / "out/titan.json");
  load_hf_weights(args, loaded, dir / "out", "test");  // the bytes as they now are
  EXPECT_FALSE(same_params(groups, loaded));
}

TEST(HfFolderTiedLmHead, AStoredCopyOfTheEmbeddingIsAcceptedADifferentOneRefused) {
  ScratchDir dir;
  const ModelArgs args = tiny_dense(true);
  std::vector<ParamGroup> groups = make_param_groups(args);
  fill_distinct(groups);
  const std::string folder = dir / "model";
  export_hf_folder(folder, args, groups, opts(DType::f32));
  // Stored once more as lm_head.weight, in another dtype (bf16 keeps these values exactly).
  rewrite_checkpoint(folder, [](std::vector<SafetensorsTensor>& t) {
    const Tensor& embed = find_tensor(t, "model.embed_tokens.weight")->tensor;
    Tensor copy = Tensor::empty(embed.shape(), DType::bf16, MemCategory::other);
    for (int64_t i = 0; i < embed.numel(); ++i) {
      copy.data<uint16_t>()[i] = f32_to_bf16(embed.data<float>()[i]);
    }
    t.push_back({"lm_head.weight", std::move(copy)});
  });
  std::vector<ParamGroup> loaded = make_param_groups(args);
  load_hf_weights(args, loaded, folder, "test");
  EXPECT_TRUE(same_params(groups, loaded));

  // Converting drops it: a tied folder has no lm_head.weight.
  convert_hf_folder(folder, dir / "converted", {});
  EXPECT_EQ(SafetensorsCheckpoint::open(dir / "converted").find("lm_head.weight"), nullptr);

  rewrite_checkpoint(folder, [](std::vector<SafetensorsTensor>& t) {
    find_tensor(t, "lm_head.weight")->tensor.data<uint16_t>()[5] ^= 1;
  });
  std::vector<ParamGroup> untouched = make_param_groups(args);
  expect_error([&] { load_hf_weights(args, untouched, folder, "config.json"); },
               {"model.safetensors", "\"lm_head.weight\" differs from model.embed_tokens.weight",
                "tie_word_embeddings = true"});
}

TEST(HfConvert, Bf16ToFp32ToBf16IsBitIdentical) {
  ScratchDir dir;
  for (const ModelArgs& args : {tiny_dense(true), tiny_moe()}) {
    std::vector<ParamGroup> groups = make_param_groups(args);
    initialize_param_groups(groups, args, 11);
    const std::string name = args.is_moe() ? "moe" : "dense";
    export_hf_folder(dir / name, args, groups, opts(DType::bf16));
    const HfConvertResult up =
        convert_hf_folder(dir / name, dir / (name + "_f32"), conv(DType::f32));
    EXPECT_EQ(up.dtype, DType::f32);
    EXPECT_EQ(up.tensors, hf_keys(args).size());
    const HfConvertResult down =
        convert_hf_folder(dir / (name + "_f32"), dir / (name + "_bf16"), conv(DType::bf16, 10000));
    EXPECT_EQ(down.data_bytes, up.data_bytes / 2);
    const SafetensorsCheckpoint a = SafetensorsCheckpoint::open(dir / name);
    const SafetensorsCheckpoint b = SafetensorsCheckpoint::open(dir / (name + "_bf16"));
    EXPECT_GT(b.files().size(), 1u);
    ASSERT_EQ(a.names(), b.names());
    for (const std::string& key : a.names()) {
      const SafetensorsEntry &x = a.at(key), &y = b.at(key);
      ASSERT_EQ(y.dtype, DType::bf16) << key;
      EXPECT_EQ(std::memcmp(x.data, y.data, x.nbytes), 0) << key;
    }
    // The default keeps the source's dtype; the config names it.
    convert_hf_folder(dir / (name + "_f32"), dir / (name + "_same"), {});
    EXPECT_EQ(SafetensorsCheckpoint::open(dir / (name + "_same")).at("model.norm.weight").dtype,
              DType::f32);
    EXPECT_EQ(read_json_file(dir / (name + "_same/config.json"), "config", 8)["torch_dtype"],
              "float32");
  }
}

TEST(HfConvert, RefusesABadSourceBeforeWritingAnything) {
  ScratchDir dir;
  const ModelArgs args = tiny_dense(false);
  std::vector<ParamGroup> groups = make_param_groups(args);
  export_hf_folder(dir / "src", args, groups, opts(DType::f32));
  rewrite_checkpoint(dir / "src", [](std::vector<SafetensorsTensor>& t) {
    find_tensor(t, "model.layers.0.self_attn.k_proj.weight")->tensor =
        Tensor::zeros({16, 32}, DType::f32, MemCategory::other);
  });
  expect_error([&] { convert_hf_folder(dir / "src", dir / "dst", {}); },
               {"model.layers.0.self_attn.k_proj.weight", "config.json implies [32, 32]"});
  EXPECT_FALSE(std::filesystem::exists(dir / "dst"));
}

TEST(ExportOptions, DtypeNames) {
  EXPECT_EQ(parse_export_dtype("float32"), DType::f32);
  EXPECT_EQ(parse_export_dtype("fp32"), DType::f32);
  EXPECT_EQ(parse_export_dtype("bfloat16"), DType::bf16);
  EXPECT_EQ(parse_export_dtype("bf16"), DType::bf16);
  EXPECT_EQ(parse_export_dtype("float16"), DType::f16);
  EXPECT_EQ(parse_export_dtype("fp16"), DType::f16);
  expect_error([] { parse_export_dtype("int8"); }, {"\"int8\"", "float32, bfloat16, float16"});
}

TEST(ExportOptions, ShardSizes) {
  EXPECT_EQ(parse_byte_size("5GB", "s"), 5'000'000'000u);
  EXPECT_EQ(parse_byte_size("500MB", "s"), 500'000'000u);
  EXPECT_EQ(parse_byte_size("2GiB", "s"), 2ull << 30);
  EXPECT_EQ(parse_byte_size("64 kib", "s"), 64u << 10);
  EXPECT_EQ(parse_byte_size("1TB", "s"), 1'000'000'000'000u);
  EXPECT_EQ(parse_byte_size("12345", "s"), 12345u);
  EXPECT_EQ(parse_byte_size("100B", "s"), 100u);
  for (const char* bad : {"", "GB", "0", "0GB", "1.5GB", "-1", "5XB", "5 G B", "99999999999TB",
                          "184467440737095516160"}) {
    expect_error([&] { parse_byte_size(bad, "--shard-size"); }, {"--shard-size", "is not a size"});
  }
}

TEST(ByteSize, WrittenForPeople) {
  EXPECT_EQ(format_byte_size(0), "0 B");
  EXPECT_EQ(format_byte_size(1023), "1023 B");
  EXPECT_EQ(format_byte_size(1024), "1.00 KiB");
  EXPECT_EQ(format_byte_size(1536), "1.50 KiB");
  EXPECT_EQ(format_byte_size(1048063), "1023 KiB");
  EXPECT_EQ(format_byte_size(1048064), "1.00 MiB");  // 1023.5 KiB would print as 1024 KiB
  EXPECT_EQ(format_byte_size(39216742), "37.4 MiB");
  EXPECT_EQ(format_byte_size(uint64_t{213} << 30), "213 GiB");
  EXPECT_EQ(format_byte_size(uint64_t{3} << 50), "3.00 PiB");
}

}  // namespace
}  // namespace titan
