// A checkpoint written a tensor at a time (train/checkpoint.h CheckpointBeforeRead, what a save
// under tensor or expert parallel gathers onto rank 0 through): the writer asks for every tensor
// once, in checkpoint_read_order's order -- the order the ranks that gather without writing
// follow, so a difference would pair the wrong tensors in the collectives -- and a tensor filled
// only when asked for is written as the same bytes as one filled before.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "titan/models/state_dict_adapter.h"
#include "titan/nn/param_group.h"
#include "titan/train/checkpoint.h"
#include "unit/scratch_dir.h"
#include "unit/test_safetensors_util.h"
#include "unit/tiny_models.h"

namespace titan {
namespace {

// Every element of every buffer a distinct value, from the tensor's place in the model.
void fill(std::vector<ParamGroup>& groups, const CheckpointTensor& t) {
  ParamGroup& g = groups[t.group];
  float* const buffers[3] = {g.params(), g.exp_avg(), g.exp_avg_sq()};
  const ParamView& v = g.view(t.name);
  size_t name_sum = 0;
  for (const char c : t.name) name_sum = name_sum * 31 + static_cast<unsigned char>(c);
  for (int64_t i = 0; i < v.numel; ++i) {
    const size_t key = (name_sum % 4093) * 16 + t.buffer * 4 + static_cast<size_t>(i % 1024);
    buffers[t.buffer][v.offset + i] = static_cast<float>(key) * 0.25f + 1.0f;
  }
}

std::vector<ParamGroup> groups_of(const std::vector<ParamGroupSpec>& specs) {
  std::vector<ParamGroup> groups;
  for (const ParamGroupSpec& s : specs) {
    groups.emplace_back(s.name, s.params);
    groups.back().allocate_optimizer_state();
  }
  return groups;
}

void expect_streamed_equals_filled(const ModelArgs& args, bool model_only) {
  test::ScratchDir dir;
  const std::vector<ParamGroupSpec> specs = model_param_specs(args);
  const std::vector<CheckpointTensor> order = checkpoint_read_order(specs, model_only);

  std::vector<ParamGroup> filled = groups_of(specs);
  for (const CheckpointTensor& t : order) fill(filled, t);
  std::filesystem::create_directories(dir / "filled");
  write_checkpoint_shard(dir / "filled", specs, checkpoint_groups(filled), Shard{}, model_only,
                         false);

  std::vector<ParamGroup> streamed = groups_of(specs);
  std::vector<CheckpointTensor> asked;
  std::filesystem::create_directories(dir / "streamed");
  write_checkpoint_shard(dir / "streamed", specs, checkpoint_groups(streamed), Shard{}, model_only,
                         false, [&](const CheckpointTensor& t) {
                           asked.push_back(t);
                           fill(streamed, t);
                         });

  ASSERT_EQ(asked.size(), order.size());
  size_t tensors = 0;
  for (const ParamGroupSpec& s : specs) tensors += s.params.size();
  EXPECT_EQ(order.size(), tensors * (model_only ? 1 : 3));
  for (size_t i = 0; i < order.size(); ++i) {
    EXPECT_EQ(asked[i].group, order[i].group) << i;
    EXPECT_EQ(asked[i].name, order[i].name) << i;
    EXPECT_EQ(asked[i].buffer, order[i].buffer) << i;
  }
  for (const std::string& name : checkpoint_shard_files(1, model_only)) {
    EXPECT_EQ(test::read_bytes(dir / ("streamed/" + name)),
              test::read_bytes(dir / ("filled/" + name)))
        << name;
  }
}

TEST(CheckpointStream, TheWriterAsksInTheReadOrderAndWritesTheFilledBytes) {
  expect_streamed_equals_filled(test::tiny_dense(/*tied=*/false), /*model_only=*/false);
  expect_streamed_equals_filled(test::tiny_moe(), /*model_only=*/false);
  expect_streamed_equals_filled(test::tiny_dense(/*tied=*/true), /*model_only=*/true);
}

}  // namespace
}  // namespace titan
