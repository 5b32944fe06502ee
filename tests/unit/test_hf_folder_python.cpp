// Hugging Face model folders both ways with the real Transformers library
// (tests/reference/hf_folder_roundtrip.py via $TITAN_PYTHON; a missing Python fails the test):
// what titan exports, AutoModelForCausalLM.from_pretrained loads with no missing or unexpected
// keys and the same logits (and for MoE the same tensors bit for bit); what save_pretrained
// writes (Qwen3 and Qwen3-MoE), titan loads and computes the same logits from.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "compare.h"
#include "test_tokenizer_python.h"
#include "titan/io/safetensors.h"
#include "titan/models/decoder_lm.h"
#include "titan/models/hf_checkpoint.h"
#include "titan/models/hf_config.h"
#include "titan/models/hf_export.h"
#include "titan/models/state_dict_adapter.h"
#include "unit/python_runner.h"
#include "unit/test_safetensors_util.h"
#include "unit/tiny_models.h"

namespace titan {
namespace {

using nlohmann::json;
using test::ScratchDir;
using testing::expect_close;

// The shared tiny dense model at rope_theta 10000, as these folders have always been written
// (the MoE below likewise).
ModelArgs tiny(bool tied) {
  ModelArgs a = test::tiny_dense(tied);
  a.rope_theta = 10000.0;
  return a;
}

// Norm weights away from 1, so a loader that dropped them would show in the logits.
void perturb_norms(std::vector<ParamGroup>& groups) {
  for (ParamGroup& g : groups) {
    for (const ParamView& v : g.views()) {
      if (v.spec.init != ParamInit::ones) continue;
      for (int64_t i = 0; i < v.numel; ++i) g.params()[v.offset + i] += 0.01f * ((i * 7) % 11 - 5);
    }
  }
}

// HF's router init (std 0.02) leaves the experts' probabilities within ~1e-3 of each other;
// scaled up, routing decisions have margins no rounding difference can flip (the Python side
// checks the gap).
void spread_routers(std::vector<ParamGroup>& groups) {
  for (ParamGroup& g : groups) {
    for (const ParamView& v : g.views()) {
      if (!v.spec.name.ends_with(".mlp.gate.weight")) continue;
      for (int64_t i = 0; i < v.numel; ++i) g.params()[v.offset + i] *= 25.0f;
    }
  }
}

std::vector<float> titan_logits(CausalLM& model, const std::vector<int32_t>& ids) {
  std::vector<float> logits(ids.size() * static_cast<size_t>(model.args().vocab_size));
  model.forward(ids.data(), nullptr, 1, static_cast<int64_t>(ids.size()),
                {.logits = logits.data()});
  return logits;
}

std::vector<float> read_logits(const std::string& path) {
  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(path);
  const SafetensorsEntry& e = ckpt.at("logits");
  std::vector<float> v(static_cast<size_t>(e.numel()));
  read_f32(e, v.data(), v.size());
  return v;
}

TEST(HfFolderPython, TransformersLoadsWhatTitanExports) {
  ScratchDir dir;
  const std::vector<int32_t> ids = {5, 17, 2, 96, 40, 40, 11, 0, 63, 28, 71};
  struct Dense {
    std::string name;
    bool tied;
    DType dtype;
    std::string source;  // tokenizer files come from here
  };
  const std::vector<Dense> dense = {
      {"titan_tied_f32", true, DType::f32, test::qwen3_tokenizer_dir()},
      {"titan_untied_f32", false, DType::f32, ""},
      {"titan_untied_bf16", false, DType::bf16, ""}};
  json request = {{"input_ids", {ids}}, {"folders", json::array()}};
  std::map<std::string, std::vector<float>> logits;
  for (const Dense& d : dense) {
    DecoderLM model(tiny(d.tied));
    model.initialize(99);
    perturb_norms(model.param_groups());
    HfExportOptions options;
    options.dtype = d.dtype;
    options.source_dir = d.source;
    export_hf_folder(dir / d.name, model, options);
    // Titan's logits from what it exported (the bf16 folder holds rounded weights).
    logits[d.name] = titan_logits(*load_hf_model(dir / d.name), ids);
    request["folders"].push_back({{"name", d.name},
                                  {"architecture", "Qwen3ForCausalLM"},
                                  {"tied", d.tied},
                                  {"compare", "logits"}});
  }
  ASSERT_TRUE(std::filesystem::exists(dir / "titan_tied_f32/tokenizer.json"));

  // Qwen3-MoE: written per expert, one layer sparse and one dense (mlp_only_layers), sharded.
  ModelArgs moe = test::tiny_moe();
  moe.rope_theta = 10000.0;
  DecoderLM moe_model(moe);
  moe_model.initialize(5);
  std::vector<ParamGroup>& moe_params = moe_model.param_groups();
  perturb_norms(moe_params);
  spread_routers(moe_params);
  HfExportOptions moe_options;
  moe_options.dtype = DType::f32;
  moe_options.max_shard_bytes = 30000;
  export_hf_folder(dir / "titan_moe", moe_model, moe_options);
  logits["titan_moe"] = titan_logits(*load_hf_model(dir / "titan_moe"), ids);
  request["folders"].push_back({{"name", "titan_moe"},
                                {"architecture", "Qwen3MoeForCausalLM"},
                                {"tied", false},
                                {"compare", "state_dict"}});
  std::ofstream(dir / "request.json") << request.dump();

  const test::PythonRun run =
      test::run_python_script("hf_folder_roundtrip.py", {"load", dir.path().string()});
  ASSERT_EQ(run.status, 0) << run.output;
  std::printf("%s", run.output.c_str());
  for (const auto& [name, got] : logits) {
    const std::vector<float> want = read_logits(dir / ("out/" + name + ".safetensors"));
    ASSERT_EQ(want.size(), got.size()) << name;
    expect_close(name + " logits", got.data(), want.data(), static_cast<int64_t>(want.size()),
                 1e-5);
  }
  // Transformers' own save of the MoE model loads back into titan's stacked layout bit for bit.
  std::vector<ParamGroup> resaved = make_param_groups(moe);
  load_hf_weights(moe, resaved, dir / "out/titan_moe_resaved", "config.json");
  for (size_t g = 0; g < resaved.size(); ++g) {
    EXPECT_EQ(std::memcmp(resaved[g].params(), moe_params[g].params(),
                          resaved[g].numel() * sizeof(float)),
              0)
        << resaved[g].name();
  }
}

TEST(HfFolderPython, TitanLoadsWhatTransformersSaves) {
  ScratchDir dir;
  const test::PythonRun run =
      test::run_python_script("hf_folder_roundtrip.py", {"save", dir.path().string()});
  ASSERT_EQ(run.status, 0) << run.output;
  for (const char* name : {"hf_tied_f32", "hf_untied_f32", "hf_tied_bf16", "hf_untied_bf16",
                           "hf_moe_f32", "hf_moe_bf16"}) {
    const std::string ref = dir / ("out/" + std::string(name) + ".safetensors");
    const SafetensorsCheckpoint reference = SafetensorsCheckpoint::open(ref);
    const SafetensorsEntry& ids_entry = reference.at("input_ids");
    const auto* p = static_cast<const int32_t*>(ids_entry.data);
    const std::vector<int32_t> ids(p, p + ids_entry.numel());
    const std::unique_ptr<CausalLM> model = load_hf_model(dir / name);
    const std::vector<float> got = titan_logits(*model, ids);
    const std::vector<float> want = read_logits(ref);
    ASSERT_EQ(got.size(), want.size()) << name;
    expect_close(std::string(name) + " logits", got.data(), want.data(),
                 static_cast<int64_t>(want.size()), 1e-5);
  }
  EXPECT_TRUE(std::filesystem::exists(dir / "hf_untied_f32/model.safetensors.index.json"));
  EXPECT_TRUE(std::filesystem::exists(dir / "hf_moe_f32/model.safetensors.index.json"));

  // What Transformers saved, converted by titan bf16 -> fp32 -> bf16, is the same bytes.
  HfConvertOptions to_f32, to_bf16;
  to_f32.dtype = DType::f32;
  to_bf16.dtype = DType::bf16;
  convert_hf_folder(dir / "hf_tied_bf16", dir / "f32", to_f32);
  convert_hf_folder(dir / "f32", dir / "bf16", to_bf16);
  const SafetensorsCheckpoint a = SafetensorsCheckpoint::open(dir / "hf_tied_bf16");
  const SafetensorsCheckpoint b = SafetensorsCheckpoint::open(dir / "bf16");
  ASSERT_EQ(a.names(), b.names());
  for (const std::string& key : a.names()) {
    ASSERT_EQ(a.at(key).dtype, DType::bf16) << key;
    ASSERT_EQ(a.at(key).nbytes, b.at(key).nbytes) << key;
    EXPECT_EQ(std::memcmp(a.at(key).data, b.at(key).data, a.at(key).nbytes), 0) << key;
  }
}

}  // namespace
}  // namespace titan
