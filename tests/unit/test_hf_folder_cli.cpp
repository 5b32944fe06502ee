// `titan info PATH` and `titan convert SRC DST`: what they print, what they write, and one-line
// errors with a non-zero exit for bad folders and flags.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "test_tokenizer_python.h"
#include "titan/io/safetensors.h"
#include "titan/models/hf_config.h"
#include "titan/models/hf_export.h"
#include "titan/models/state_dict_adapter.h"
#include "titan_cli_run.h"
#include "unit/test_safetensors_util.h"
#include "unit/tiny_models.h"

namespace titan {
namespace {

using test::ScratchDir;

using test::run_titan;
using test::TitanRun;

// A titan-written folder (written in bf16): the shared tiny MoE, 2 layers, one sparse with 4
// experts, at the default max_position_embeddings these folders have always had.
ModelArgs tiny_moe() {
  ModelArgs a = test::tiny_moe();
  a.max_position_embeddings = ModelArgs{}.max_position_embeddings;
  return a;
}

void write_moe_folder(const std::string& dir) {
  const ModelArgs args = tiny_moe();
  std::vector<ParamGroup> groups = make_param_groups(args);
  initialize_param_groups(groups, args, 2);
  export_hf_folder(dir, args, groups, {});
}

void expect_one_line_error(const TitanRun& r, const std::string& part) {
  EXPECT_NE(r.status, 0);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(part), std::string::npos) << r.err;
}

TEST(InfoCommand, DescribesAModelFolder) {
  ScratchDir dir;
  write_moe_folder(dir / "moe");
  const TitanRun r = run_titan("info '" + dir / "moe" + "'", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* line :
       {"architecture  Qwen3MoeForCausalLM", "layers        2",
        "heads         4 query, 2 key/value, head_dim 16", "hidden        32",
        "experts       4, 2 per token, width 16, in 1 of 2 layers",
        "intermediate  48 (dense layers)", "vocab         97",
        // count_parameters: embed+lm_head 6208, norm 32; attention 2x(6144+32), norms 2x64;
        // experts 4x1536 + router 128; dense MLP 4608; active: 2 of 4 experts.
        "parameters    29,600 total, 23,392 without embeddings, 26,528 active per token",
        "embeddings    untied (lm_head.weight)", "dtype         BF16 x 35", "shards        1",
        "model.safetensors", "other files   generation_config.json"}) {
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  }
}

TEST(InfoCommand, BadFolderIsOneLine) {
  ScratchDir dir;
  expect_one_line_error(run_titan("info '" + dir / "nowhere" + "'", dir),
                        "nowhere: no such model folder");
  write_moe_folder(dir / "moe");
  ModelArgs wider = tiny_moe();
  wider.moe_intermediate_size = 24;
  write_hf_config(dir / "moe/config.json", wider, DType::bf16);
  expect_one_line_error(run_titan("info '" + dir / "moe" + "'", dir),
                        "experts.0.gate_proj.weight\" has shape [16, 32], but");
}

TEST(ConvertCommand, ReexportsWithDtypeAndShardSize) {
  ScratchDir dir;
  write_moe_folder(dir / "moe");
  const TitanRun r = run_titan(
      "convert '" + dir / "moe" + "' '" + dir / "f32" + "' --dtype float32 --shard-size 20KB", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("Qwen3MoeForCausalLM, 35 tensors"), std::string::npos) << r.out;
  const SafetensorsCheckpoint f32 = SafetensorsCheckpoint::open(dir / "f32");
  EXPECT_GT(f32.files().size(), 1u);
  EXPECT_EQ(f32.at("model.layers.0.mlp.experts.3.up_proj.weight").dtype, DType::f32);
  EXPECT_EQ(read_hf_config(dir / "f32").num_experts, 4);

  ASSERT_EQ(
      run_titan("convert '" + dir / "f32" + "' '" + dir / "bf16" + "' --dtype bf16", dir).status,
      0);
  const SafetensorsCheckpoint a = SafetensorsCheckpoint::open(dir / "moe");
  const SafetensorsCheckpoint b = SafetensorsCheckpoint::open(dir / "bf16");
  for (const std::string& key : a.names()) {
    EXPECT_EQ(std::memcmp(a.at(key).data, b.at(key).data, a.at(key).nbytes), 0) << key;
  }
}

TEST(ConvertCommand, BadFlagsAndDestinationsAreOneLine) {
  ScratchDir dir;
  write_moe_folder(dir / "moe");
  const std::string src = "'" + dir / "moe" + "' ";
  expect_one_line_error(run_titan("convert " + src + "'" + dir / "x" + "' --dtype int8", dir),
                        "export dtype \"int8\"");
  expect_one_line_error(run_titan("convert " + src + "'" + dir / "x" + "' --shard-size 5XB", dir),
                        "--shard-size \"5XB\" is not a size");
  write_moe_folder(dir / "copy");
  expect_one_line_error(run_titan("convert " + src + "'" + dir / "copy" + "'", dir),
                        "copy: already exists");
  expect_one_line_error(run_titan("convert '" + dir / "none" + "' '" + dir / "x" + "'", dir),
                        "none");
  EXPECT_FALSE(std::filesystem::exists(dir / "x"));
  // The source is never the destination, not even with --overwrite.
  expect_one_line_error(
      run_titan("convert " + src + "'" + dir / "moe" + "' --dtype fp16 --overwrite", dir),
      "moe: is the source model folder");
  EXPECT_EQ(SafetensorsCheckpoint::open(dir / "moe").at("model.norm.weight").dtype, DType::bf16);
  // --overwrite replaces a model folder titan wrote.
  const TitanRun r =
      run_titan("convert " + src + "'" + dir / "copy" + "' --dtype fp16 --overwrite", dir);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(SafetensorsCheckpoint::open(dir / "copy").at("model.norm.weight").dtype, DType::f16);
}

}  // namespace
}  // namespace titan
