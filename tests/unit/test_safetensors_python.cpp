// titan.cpp's safetensors against the real `safetensors` package (and huggingface_hub's sharded
// writer): files titan writes load in Python with equal values, files Python writes load here.
// Runs tests/reference/safetensors_roundtrip.py with $TITAN_PYTHON; a missing Python fails.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "titan/io/safetensors.h"
#include "titan/io/safetensors_writer.h"
#include "unit/python_runner.h"
#include "unit/test_safetensors_util.h"

namespace titan {
namespace {

using test::f32_tensor;  // the same values as values() in the script
using test::ScratchDir;

TEST(SafetensorsPython, FilesWrittenByTitanLoadInSafetensors) {
  ScratchDir dir;
  Tensor i32 = Tensor::empty({2, 3}, DType::i32, MemCategory::other);
  for (int i = 0; i < 6; ++i) i32.data<int32_t>()[i] = -3 + i;
  Tensor i64 = Tensor::empty({2}, DType::i64, MemCategory::other);
  i64.data<int64_t>()[0] = 10;
  i64.data<int64_t>()[1] = -(int64_t{1} << 40);
  const Tensor special = test::special_f32_tensor();

  write_safetensors_file(dir / "f32.safetensors",
                         {{"w", f32_tensor({5, 7})},
                          {"scalar", f32_tensor({}, 1.0f)},
                          {"empty", f32_tensor({0, 4})},
                          {"i32", i32},
                          {"i64", i64}},
                         {});
  for (const auto& [file, dtype] :
       {std::pair{"bf16.safetensors", DType::bf16}, std::pair{"f16.safetensors", DType::f16}}) {
    SafetensorsWriteOptions o;
    o.float_dtype = dtype;
    std::vector<SafetensorsTensor> t = {{"w", f32_tensor({5, 7})}, {"special", special}};
    if (dtype == DType::bf16) t.push_back({"i64", i64});
    write_safetensors_file(dir / file, t, o);
  }
  std::vector<SafetensorsTensor> layers;
  for (int i = 0; i < 4; ++i) {
    layers.push_back({"model.layers." + std::to_string(i) + ".mlp.up_proj.weight",
                      f32_tensor({32, 16}, static_cast<float>(i))});
  }
  SafetensorsWriteOptions sharded;
  sharded.float_dtype = DType::bf16;
  sharded.max_shard_bytes = 2500;
  write_safetensors_checkpoint(dir / "sharded", layers, sharded);

  const test::PythonRun run =
      test::run_python_script("safetensors_roundtrip.py", {"check", dir.path().string()});
  ASSERT_EQ(run.status, 0) << run.output;
}

TEST(SafetensorsPython, FilesWrittenBySafetensorsLoadInTitan) {
  ScratchDir dir;
  const test::PythonRun run =
      test::run_python_script("safetensors_roundtrip.py", {"write", dir.path().string()});
  ASSERT_EQ(run.status, 0) << run.output;

  const SafetensorsFile f = SafetensorsFile::open(dir / "py_single.safetensors");
  EXPECT_EQ(f.metadata().at("who"), "python");
  const auto expect_f32 = [&](const char* name, const Tensor& want, DType stored) {
    const SafetensorsEntry* e = f.find(name);
    ASSERT_NE(e, nullptr) << name;
    EXPECT_EQ(e->dtype, stored) << name;
    EXPECT_EQ(e->shape, want.shape()) << name;
    std::vector<float> got(static_cast<size_t>(want.numel()));
    read_f32(*e, got.data(), got.size());
    for (size_t i = 0; i < got.size(); ++i) {
      const float w = want.data<float>()[i];
      const float r = stored == DType::bf16  ? bf16_to_f32(f32_to_bf16(w))
                      : stored == DType::f16 ? f16_to_f32(f32_to_f16(w))
                                             : w;
      if (std::isnan(r)) {
        EXPECT_TRUE(std::isnan(got[i])) << name << "[" << i << "]";
      } else {
        EXPECT_EQ(got[i], r) << name << "[" << i << "]";
      }
    }
  };
  expect_f32("w_bf16", f32_tensor({5, 7}), DType::bf16);
  expect_f32("w_f16", f32_tensor({3, 4}), DType::f16);
  expect_f32("w_f32", f32_tensor({2, 3, 4}, 0.5f), DType::f32);
  const Tensor special = test::special_f32_tensor();
  expect_f32("special_bf16", special, DType::bf16);
  Tensor scalar = Tensor::empty({}, DType::f32, MemCategory::other);
  scalar.data<float>()[0] = 2.5f;
  expect_f32("scalar", scalar, DType::f32);
  const SafetensorsEntry* ids = f.find("ids");
  ASSERT_NE(ids, nullptr);
  int64_t id_values[3];
  std::memcpy(id_values, ids->data, sizeof id_values);
  EXPECT_EQ(id_values[1], -(int64_t{1} << 40));
  EXPECT_EQ(f.find("mask")->dtype_name, "BOOL");

  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(dir / "py_sharded");
  EXPECT_GE(ckpt.files().size(), 2u);
  EXPECT_EQ(ckpt.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    const std::string name = "model.layers." + std::to_string(i) + ".mlp.up_proj.weight";
    const Tensor want = f32_tensor({32, 16}, static_cast<float>(i));
    std::vector<float> got(512);
    read_f32(ckpt.at(name), got.data(), got.size());
    for (size_t k = 0; k < got.size(); ++k) {
      ASSERT_EQ(got[k], bf16_to_f32(f32_to_bf16(want.data<float>()[k]))) << name;
    }
  }
}

}  // namespace
}  // namespace titan
